"""``LineageProducer.settle()``: every event emitted so far acknowledged by Kafka or on disk
in the journal, without closing the producer (what a process ended by ``os._exit`` needs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from producer import LineageProducer
from tests.producer.support import FAST_RECONNECT, ROOT, assert_all_arrived_in_order, seq_event
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka


def test_settle_with_kafka_up_returns_once_every_event_is_acknowledged(kafka, tmp_path):
    topic = kafka.new_topic("settle-up")
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path / "j") as p:
        for i in range(10):
            p.emit(seq_event(i))
        assert p.settle(30) == 0
        assert (p.stats.delivered, p.stats.journaled) == (10, 0)
    assert_all_arrived_in_order(read_topic(kafka.bootstrap_servers, topic, expected=10), range(10))


def test_settle_with_kafka_down_journals_without_closing_and_the_producer_resends(broker, tmp_path):
    topic, journal = "settle-down", tmp_path / "j"
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=journal,
                        properties=FAST_RECONNECT, close_timeout_s=10)
    try:
        for i in range(5):
            p.emit(seq_event(i))
        began = time.monotonic()
        assert p.settle() == 0
        assert time.monotonic() - began < 8     # Kafka's grace (2 s), not the stall detector or the bound
        assert (p.stats.journaled, p.stats.mode, p._closed) == (5, "journal", False)
        for i in range(5, 10):
            p.emit(seq_event(i))
            assert p.settle(5) == 0
        assert p.stats.journaled == 10 and len(list(journal.iterdir())) == 1
        broker.start()
        broker.create_topic(topic, 1)
        assert p.flush(30) == 0
        assert p.stats.replayed == 10
    finally:
        p.close(5)
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=10), range(10))


_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from producer import LineageProducer
    from tests.producer.support import seq_event
    p = LineageProducer(bootstrap_servers={bootstrap!r}, topic={topic!r}, journal_dir={journal!r},
                        close_timeout_s=5)
    for i in range(5):
        p.emit(seq_event(i))
    print("settled", p.settle(), flush=True)
    os._exit(0)
""")


def test_an_os_exit_right_after_settle_returned_0_loses_nothing(broker, tmp_path):
    topic, journal = "settle-exit", tmp_path / "j"
    code = _CHILD.format(root=str(ROOT), bootstrap=broker.bootstrap_servers, topic=topic, journal=str(journal))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "settled 0" in done.stdout, done.stderr[-3000:]
    broker.start()
    broker.create_topic(topic, 1)
    with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=journal) as p:
        assert p.flush(30) == 0
        assert p.stats.replayed == 5
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=5), range(5))
