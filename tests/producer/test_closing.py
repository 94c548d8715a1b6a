"""A close() that gave up on its sender (``close_incomplete``: here a journal write slower
than close()'s budget, as on a stalled disk) gets one more chance at a normal exit: the
sender is joined once more, for the producer's ``close_timeout_s``, and what it held is
journaled (``close_finished_at_exit``), or reported lost (``lost_at_exit``)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest

from producer import LineageProducer, closing
from producer.journal import Journal
from tests.producer.support import FAST_RECONNECT, ROOT, assert_all_arrived_in_order, seq_event
from tests.support.children import exit_status as _exit_status
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka

COUNT = 20


@pytest.fixture
def slow_disk(monkeypatch):
    """Journal.append waits for ``gate`` (set at the end of the test at the latest);
    ``entered`` is set once the sender is in it."""
    gate, entered = threading.Event(), threading.Event()
    append = Journal.append

    def slow_append(self, batch):
        entered.set()
        gate.wait(120)
        return append(self, batch)
    monkeypatch.setattr(Journal, "append", slow_append)
    # close() waits for the sender what is left of its budget + 2 * RECLAIM_TIMEOUT_S + 5 s:
    # 5.5 s here rather than 15.5 s (the test is about what happens after it gave up).
    monkeypatch.setattr(closing, "RECLAIM_TIMEOUT_S", 0.0)
    yield gate, entered
    gate.set()


def _close_gives_up(broker, tmp_path, topic: str, close_timeout_s: float, entered, caplog) -> LineageProducer:
    """A producer (Kafka unreachable: its events go to the journal) whose close() gave up on
    its sender, stuck in the slow journal write with all COUNT events."""
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties=FAST_RECONNECT, close_timeout_s=close_timeout_s)
    for i in range(COUNT):
        p.emit(seq_event(i))
    p.close()
    assert entered.is_set() and p._sender.is_alive(), "the sender was not stuck in the journal write"
    assert "event=close_incomplete" in caplog.text
    assert p.stats.journaled == 0 and p.stats.pending == COUNT
    return p


def _resent(broker, tmp_path, topic: str) -> None:
    """The next producer on the journal directory sends every event the journal holds."""
    broker.start()
    broker.create_topic(topic, 1)
    with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                         properties=FAST_RECONNECT) as again:
        assert again.flush(30) == 0
    assert again.stats.replayed == COUNT
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=COUNT), range(COUNT))


def test_a_close_that_gave_up_on_its_sender_is_finished_at_exit(broker, tmp_path, caplog, slow_disk):
    gate, entered = slow_disk
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = "finished-at-exit"
    p = _close_gives_up(broker, tmp_path, topic, 3.0, entered, caplog)
    gate.set()   # the disk answers, after close() gave up
    # The exit hook's part for closes that gave up (the whole hook, _close_all_at_exit, would
    # also close whatever other tests left open in this process; a real exit runs it whole below).
    closing._finish_unfinished_at_exit()
    assert not p._sender.is_alive()
    assert re.search(rf"event=close_finished_at_exit topic={topic} emitted={COUNT} delivered=0 "
                     rf"journaled={COUNT} pending={COUNT} errors=\d+ waited_s=", caplog.text), caplog.text
    assert "event=lost_at_exit" not in caplog.text
    closing._finish_unfinished_at_exit()   # once: a second exit hook (multiprocessing's, then atexit) says nothing
    assert caplog.text.count("event=close_finished_at_exit") == 1
    _resent(broker, tmp_path, topic)


def test_a_sender_still_stuck_at_exit_is_reported_with_what_is_lost(broker, tmp_path, caplog, slow_disk):
    gate, entered = slow_disk
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = "lost-at-exit"
    p = _close_gives_up(broker, tmp_path, topic, 1.0, entered, caplog)
    closing._finish_unfinished_at_exit()   # waits close_timeout_s, then reports; never raises
    assert p._sender.is_alive()
    assert re.search(rf"event=lost_at_exit topic={topic} not_journaled={COUNT} pending={COUNT} emitted={COUNT} "
                     r"delivered=0 journaled=0 errors=\d+ waited_s=", caplog.text), caplog.text
    assert "event=close_finished_at_exit" not in caplog.text
    gate.set()
    p._sender.join(30)   # the journal's lock, released by the sender's last turn, for the next test's tmp_path
    assert not p._sender.is_alive()


def test_a_forked_child_neither_waits_for_nor_reports_a_close_its_parent_gave_up_on(broker, tmp_path, caplog,
                                                                                     slow_disk):
    # In the child the parent's sender is a thread it does not have (it looks stopped): it is
    # not the child's to report at exit, nor its librdkafka instance the child's to free.
    gate, entered = slow_disk
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = "fork-unfinished"
    p = _close_gives_up(broker, tmp_path, topic, 1.0, entered, caplog)
    pid = os.fork()
    if pid == 0:  # the child: os._exit, so pytest does not run on in it
        code = 9
        try:
            closing._close_all_at_exit()
            code = 0 if "_at_exit" not in caplog.text and p._producer is not None else 3
        finally:
            os._exit(code)
    assert _exit_status(pid, 30) == 0, "the child's exit reported or freed its parent's unfinished producer"
    gate.set()
    closing._finish_unfinished_at_exit()   # still the parent's to finish
    assert f"event=close_finished_at_exit topic={topic} " in caplog.text


_EXITING = textwrap.dedent("""
    import atexit, logging, sys, threading
    sys.path.insert(0, {root!r})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from producer import LineageProducer, closing
    from producer.journal import Journal
    from tests.producer.support import FAST_RECONNECT, seq_event

    gate = threading.Event()
    append = Journal.append
    def slow_append(self, batch):   # a disk slower than close()'s budget
        print("in_journal_write", flush=True)
        gate.wait()
        return append(self, batch)
    Journal.append = slow_append
    closing.RECLAIM_TIMEOUT_S = 0.0   # close() gives up after 5.5 s rather than 15.5 s

    p = LineageProducer(bootstrap_servers={bootstrap!r}, topic={topic!r}, journal_dir={journal!r},
                        properties=FAST_RECONNECT, close_timeout_s=3.0)
    for i in range({count}):
        p.emit(seq_event(i))
    p.close()
    print("closed", p.stats.journaled, p.stats.pending, flush=True)
    # Exit handlers run last registered first: the disk answers as the process exits.
    atexit.register(gate.set)
""")


def test_a_process_that_exits_normally_journals_what_a_given_up_close_left(broker, tmp_path):
    topic = "exit-journals"
    code = _EXITING.format(root=str(ROOT), bootstrap=broker.bootstrap_servers, topic=topic, journal=str(tmp_path),
                           count=COUNT)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split("\n")[:2] == ["in_journal_write", f"closed 0 {COUNT}"], child.stdout
    assert "event=close_incomplete" in child.stderr
    assert re.search(rf"event=close_finished_at_exit topic={topic} emitted={COUNT} delivered=0 "
                     rf"journaled={COUNT} pending={COUNT} errors=\d+ waited_s=", child.stderr), child.stderr
    _resent(broker, tmp_path, topic)
