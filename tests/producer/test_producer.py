"""LineageProducer against a real Kafka-protocol broker: the happy path and overload."""

from __future__ import annotations

import logging

import pytest

from producer import LineageProducer, ProducerStats, events
from relay.stages.decode import decode_record
from tests.producer.support import assert_all_arrived_in_order, decode, seq_event, wait_for
from tests.support.kafka import read_topic
from tests.support.spec import validator

pytestmark = pytest.mark.kafka


def test_events_arrive_spec_valid_keyed_and_in_order(kafka, tmp_path):
    topic = kafka.new_topic("p-happy", partitions=3)
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path) as p:
        for i in range(300):
            p.emit(seq_event(i))
        assert p.flush(15) == 0
        stats = p.stats
    assert (stats.emitted, stats.delivered, stats.journaled, stats.errors) == (300, 300, 0, 0)
    records = read_topic(kafka.bootstrap_servers, topic, expected=300)
    assert len(records) == 300
    assert_all_arrived_in_order(records, range(300))
    v = validator()
    for rec in records:
        doc = decode(rec.value)
        v.validate(doc)
        assert rec.key == f"run:tests/{doc['job']['name']}".encode()
    # One key, one partition.
    assert len({(r.key, r.partition) for r in records}) == 3


def test_json_and_avro_on_one_topic_both_decode_to_the_emitted_events(kafka, tmp_path):
    topic = kafka.new_topic("p-mixed")
    sent = [seq_event(i) for i in range(20)]
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path) as j, \
            LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                            encoding="avro") as a:
        for i, event in enumerate(sent):
            (a if i % 2 else j).emit(event)
    records = read_topic(kafka.bootstrap_servers, topic, expected=20)
    assert sorted((decode(r.value) for r in records), key=lambda d: d["run"]["facets"]["seq"]["i"]) == sent
    assert sum(r.value[:2] == b"\xc3\x01" for r in records) == 10
    for rec in records:   # what the relay does with each record
        assert decode_record(rec.value, max_bytes=1 << 20).doc == decode(rec.value)


def test_a_full_queue_spills_to_the_journal_and_still_delivers_in_order(kafka, tmp_path):
    topic = kafka.new_topic("p-full", partitions=2)
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                         queue_max_events=50) as p:
        for i in range(3000):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
        # Back to direct once the journal drained: the sender switches just after the last
        # replay's commit, which flush() may see first.
        wait_for(lambda: p.stats.mode == "direct", 10, "direct sending again")
        stats = p.stats
    assert stats.journaled > 0 and stats.dropped.get("queue_full", 0) == 0
    records = read_topic(kafka.bootstrap_servers, topic, expected=3000)
    assert_all_arrived_in_order(records, range(3000))
    assert not list(tmp_path.rglob("*.seg")), "a fully delivered journal is removed"


def test_emit_never_raises_and_counts_every_dropped_event(kafka, tmp_path, caplog):
    topic = kafka.new_topic("p-bad")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="producer.kafka"):
        p.emit({"eventTime": object()})                 # not JSON-encodable
        p.emit({"huge": "x" * 2_000_000})               # over message.max.bytes
        p.emit(seq_event(1))
        p.close()
        p.emit(seq_event(2))                            # after close
    stats = p.stats
    assert stats.dropped == {"unencodable": 1, "too_large": 1, "closed": 1}
    assert stats.errors == 3 and stats.delivered == 1 and stats.emitted == 4
    assert "reason=unencodable" in caplog.text and "reason=too_large" in caplog.text


def test_stats_is_a_snapshot(kafka, tmp_path):
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=kafka.new_topic("p-stats"),
                         journal_dir=tmp_path) as p:
        before = p.stats
        p.emit(events.job_event(job_namespace="n", job_name="j"))
        p.flush(10)
        assert isinstance(before, ProducerStats) and before.emitted == 0 and p.stats.delivered == 1


def test_fixed_message_key_overrides_per_event_keys(kafka, tmp_path):
    topic = kafka.new_topic("p-key")
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                         message_key="all-in-one") as p:
        for i in range(3):
            p.emit(seq_event(i))
    assert {r.key for r in read_topic(kafka.bootstrap_servers, topic, expected=3)} == {b"all-in-one"}
