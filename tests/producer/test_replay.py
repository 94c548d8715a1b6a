"""A running producer sends the journals dead processes left: only while Kafka is up and its
own backlog is sent, one at a time, never holding up its own flush(), close() or fork children."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from producer import LineageProducer
from producer import journal as journal_module
from producer import replay as replay_module
from producer import sender as sender_module
from producer.codec import encode_json
from producer.journal import Journal
from producer.journal_dir import Destination, lock_existing
from producer.keys import message_key
from producer.orphans import adopt_next, adopt_orphans
from tests.producer.support import (
    FAST_RECONNECT,
    assert_all_arrived_in_order,
    frozen_with_an_aside_journal,
    journal_left_by_killed_producer,
    journals_left_by_killed_process,
    no_segments_left,
    open_paths_under,
    seq_event,
    seqs_by_key,
    wait_for,
)
from tests.support.children import exit_status, run_in_child
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka


def _producer(bootstrap: str, topic: str, journal_dir: Path, **kw) -> LineageProducer:
    return LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir,
                           properties=FAST_RECONNECT, journal_adopt_interval_s=kw.pop("interval", 1.0), **kw)


def test_a_running_producer_sends_the_journal_a_killed_process_left(broker, tmp_path):
    """A driver's worker killed during an outage: its journal does not wait for the next
    process on the journal directory; the driver, still running, sends it."""
    topic = "left-by-a-worker"
    p = _producer(broker.bootstrap_servers, topic, tmp_path)   # running through the outage
    try:
        journal_left_by_killed_producer(tmp_path, broker.bootstrap_servers, topic, 200)
        broker.start()
        broker.create_topic(topic, 2)
        p.emit(seq_event(200))
        assert p.flush(60) == 0
        wait_for(lambda: p.stats.adopted == 200, 60, "the killed worker's events delivered")
        # Counted before the commit and the removal, in the same sender turn.
        wait_for(lambda: no_segments_left(tmp_path), 30, "the delivered journal removed")
    finally:
        p.close()
    # The worker's journal is found after the driver's own event went: not behind it in order.
    arrived = seqs_by_key(read_topic(broker.bootstrap_servers, topic, expected=201))
    assert {i for seqs in arrived.values() for i in seqs} == set(range(201))


def test_no_adoption_during_an_outage_nor_before_the_own_backlog_and_one_journal_at_a_time(broker, tmp_path):
    topic = "many-left"
    p = _producer(broker.bootstrap_servers, topic, tmp_path)
    try:
        for i in range(50):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.journaled == 50, 30, "the producer's own events journaled")
        orphans = journals_left_by_killed_process(
            tmp_path, *[(topic, broker.bootstrap_servers, 50 + 10 * n, 10) for n in range(30)])
        assert len(orphans) == 30
        quiet_until = time.monotonic() + 3.5   # three looks for orphans
        while time.monotonic() < quiet_until:
            assert open_paths_under(orphans) == [], "a journal adopted while Kafka is down"
            time.sleep(0.05)  # ok: watching that nothing happens for a bounded time
        broker.start()
        broker.create_topic(topic, 2)
        held_some = False
        deadline = time.monotonic() + 120
        while p.stats.adopted < 300:
            # A commit's momentary CURSOR.tmp aside: what an adopted journal holds open.
            held = [t for t in open_paths_under(orphans) if not t.endswith("/CURSOR.tmp")]
            assert len(held) <= 2 and len({Path(t).parent for t in held}) <= 1, held   # LOCK + one segment
            if held:
                held_some = True
                assert p.pending == 0, "adopted before the producer's own backlog was sent"
            assert time.monotonic() < deadline, f"only {p.stats.adopted} of 300 adopted events delivered"
            time.sleep(0.005)  # ok: the poll interval of a wait with a deadline
        assert held_some
        assert p.stats.replayed == 50 and p.stats.adopted == 300
    finally:
        p.close()
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=350), range(350))


@pytest.fixture
def adoption_in_flight(broker, tmp_path):
    """(producer, orphan journal): the broker stopped answering (SIGSTOP), then the producer
    took the journal over (holds its LOCK); its recovery scan may still be going on, and a
    batch of it may be in flight, unanswered."""
    topic = "in-flight"
    broker.start()
    broker.create_topic(topic, 1)
    p = _producer(broker.bootstrap_servers, topic, tmp_path)
    try:
        p.emit(seq_event(0))
        assert p.flush(30) == 0
        os.kill(broker.pid, signal.SIGSTOP)
        [orphan] = journals_left_by_killed_process(tmp_path, (topic, broker.bootstrap_servers, 1, 5000))
        wait_for(lambda: open_paths_under([orphan]), 30, "the running producer adopting the journal")
        yield p, orphan
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        p.close(5)


def test_flush_waits_for_the_producers_own_events_only(adoption_in_flight):
    p, orphan = adoption_in_flight
    started = time.monotonic()
    assert p.flush(60) == 0 and p.pending == 0 and p.stats.pending == 0
    assert time.monotonic() - started < 10, "flush() waited for the adopted journal"


def test_a_fork_child_does_not_keep_the_adopted_journal_locked(adoption_in_flight, tmp_path, broker):
    p, orphan = adoption_in_flight
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: holds whatever it inherited until told to go
        run_in_child(lambda: 0 if os.read(read_end, 1) == b"x" else 3)
    try:
        p.close(5)   # releases the adopted journal, its unsent events still in it
        assert open_paths_under([orphan]) == []
        fd = lock_existing(orphan)
        assert fd is not None, "the journal is still locked (by the fork child)"
        os.close(fd)
    finally:
        os.write(write_end, b"x")
        assert exit_status(pid, 30) == 0
        os.close(read_end)
        os.close(write_end)
    left = adopt_orphans(tmp_path, max_bytes=1 << 30, segment_bytes=1 << 20,
                         destination=Destination("in-flight", broker.bootstrap_servers))
    try:
        assert [j.path for j in left] == [orphan] and left[0].pending == 5000 - p.stats.adopted
    finally:
        for journal in left:
            journal.close()


def test_only_journals_for_the_producers_topic_and_cluster_are_adopted_and_a_broken_one_is_logged_once(
        kafka, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.journal")
    topic = kafka.new_topic("adopting")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5)
    try:
        [other_topic, other_cluster, broken, written_before_destinations, mine] = journals_left_by_killed_process(
            tmp_path, ("another-topic", kafka.bootstrap_servers, 0, 5), (topic, "127.0.0.1:1", 0, 5),
            (topic, kafka.bootstrap_servers, 0, 5), (None, "", 0, 10), (topic, kafka.bootstrap_servers, 10, 10))
        (broken / "00000002.seg").mkdir()   # a segment that is not a file
        wait_for(lambda: p.stats.adopted == 20, 60, "the legacy journal and this producer's sent")
        [later] = journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 20, 10))
        # Counted once acknowledged; removed a moment later (its position committed first).
        wait_for(lambda: p.stats.adopted == 30 and not later.exists(), 60, "the journal left later sent too")
        for journal in (other_topic, other_cluster, broken):
            assert (journal / "00000001.seg").exists()
            fd = lock_existing(journal)
            assert fd is not None, f"{journal} still held"
            os.close(fd)
        assert not written_before_destinations.exists() and not mine.exists() and not later.exists()
        failed = [r.getMessage() for r in caplog.records if "event=adopt_failed" in r.getMessage()]
        assert len(failed) == 1 and f"journal={broken} " in failed[0], failed
    finally:
        p.close()
    assert_all_arrived_in_order(read_topic(kafka.bootstrap_servers, topic, expected=30), range(30))


def test_no_adoption_while_kafka_is_reported_down_even_with_nothing_to_send(broker, tmp_path):
    """Direct mode, nothing emitted, librdkafka reporting every broker down: an orphan waits."""
    topic = "idle-outage"
    p = _producer(broker.bootstrap_servers, topic, tmp_path, interval=0.5)
    try:
        # Each "all brokers down" begins journal mode, left at once with nothing journaled: the
        # mode flips while the outage lasts, so wait for direct mode (adoption is then held
        # back by the outage alone), not a look at one instant.
        wait_for(lambda: p._kafka_down and p.stats.mode == "direct", 30,
                 "librdkafka reporting all brokers down, the producer in direct mode")
        assert p.pending == 0
        [orphan] = journals_left_by_killed_process(tmp_path, (topic, broker.bootstrap_servers, 0, 10))
        quiet_until = time.monotonic() + 2.0   # four looks for orphans
        while time.monotonic() < quiet_until:
            assert open_paths_under([orphan]) == [], "a journal adopted while Kafka is down"
            time.sleep(0.05)  # ok: watching that nothing happens for a bounded time
        broker.start()
        broker.create_topic(topic, 1)
        p.emit(seq_event(10))   # an acknowledgement says Kafka is back
        wait_for(lambda: p.stats.adopted == 10, 60, "the orphan sent once Kafka took an event")
    finally:
        p.close()


def test_a_producer_that_sends_nothing_itself_adopts_once_kafka_is_back(broker, tmp_path):
    """A process whose forked children do the emitting (Airflow) never sends anything
    itself: after an outage no delivery report ever said Kafka was back, so it never adopted
    the journals its children left. A metadata request once an interval, while it is idle
    and Kafka reported down, does."""
    topic = "idle-parent"
    p = _producer(broker.bootstrap_servers, topic, tmp_path, interval=0.5)
    try:
        wait_for(lambda: p._kafka_down, 30, "librdkafka reporting all brokers down")
        [orphan] = journals_left_by_killed_process(tmp_path, (topic, broker.bootstrap_servers, 0, 10))
        broker.start()
        broker.create_topic(topic, 1)
        wait_for(lambda: p.stats.adopted == 10, 60, "the orphan sent with nothing emitted by this producer")
        # Counted as sent before the journal is released: its files close just after.
        wait_for(lambda: not orphan.exists() or open_paths_under([orphan]) == [], 30, "the sent orphan released")
        assert p.stats.emitted == 0
    finally:
        p.close()
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=10), range(10))


def test_an_outage_reported_while_an_adopted_journal_waits_for_its_first_batch_does_not_stall_it(kafka, tmp_path):
    """librdkafka reports all brokers down (a blip: it also does so while it moves from the
    bootstrap connection to the broker's own) between the adoption of a dead process's
    journal and its first batch. Nothing of the producer's is in flight, so no delivery
    report will say Kafka is back: the adoption waited for ever (the probe ran only while no
    journal was adopted). It must probe as an idle producer does, and send the journal."""
    topic = kafka.new_topic("blip-at-adoption")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5)
    adopt_next_of_its_own = p._adopt_next
    blips: list[object] = []

    def adopt_then_blip():
        journal = adopt_next_of_its_own()
        if journal is not None and not blips:
            blips.append(journal)
            p._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "injected: 1/1 brokers are down"))
        return journal

    p._adopt_next = adopt_then_blip
    try:
        journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, 10))
        wait_for(lambda: blips, 30, "the orphan adopted")
        wait_for(lambda: p.stats.adopted == 10, 30, "the adopted journal sent after the blip")
        assert p.stats.emitted == 0
    finally:
        p.close()
    assert_all_arrived_in_order(read_topic(kafka.bootstrap_servers, topic, expected=10), range(10))


def test_adoption_never_pushes_the_producers_own_events_into_journal_mode(kafka, tmp_path, caplog):
    """A small librdkafka queue and a steady emitter: the adopted journal's batches leave room
    for the producer's own events, which go straight to Kafka (no journal mode, nothing
    journaled), and the journal is sent all the same."""
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("small-queue")
    left = 4000
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5, queue_max_events=400)
    own = 0
    try:
        journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, left))
        deadline = time.monotonic() + 120
        while p.stats.adopted < left:
            assert time.monotonic() < deadline, f"only {p.stats.adopted} of {left} adopted events delivered"
            p.emit(seq_event(left + own))
            own += 1
            time.sleep(0.004)  # ok: paces a steady emitter (~250 events/s), not a wait
        assert p.flush(60) == 0
        assert own > 100, "the emitter ran during the adoption"
        assert p.stats.journaled == 0 and p.stats.delivered == own and p.stats.dropped == {}
    finally:
        p.close()
    assert "event=journal_mode" not in caplog.text
    arrived = seqs_by_key(read_topic(kafka.bootstrap_servers, topic, expected=left + own))
    assert {i for seqs in arrived.values() for i in seqs} == set(range(left + own))


def test_journals_left_together_are_adopted_one_after_another_not_one_per_interval(kafka, tmp_path, caplog):
    caplog.set_level(logging.INFO, "producer.journal")
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("one-after-another")
    # One journal per look would take 4 intervals (80 s) after the first: longer than the wait.
    interval = 20.0
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=interval)
    try:
        journals_left_by_killed_process(tmp_path, *[(topic, kafka.bootstrap_servers, 10 * n, 10) for n in range(5)])
        wait_for(lambda: p.stats.adopted == 50, 70, "the five journals sent")
    finally:
        p.close()
    adopted = [r.created for r in caplog.records if "event=adopted " in r.getMessage()]
    assert len(adopted) == 5
    assert adopted[-1] - adopted[0] < interval, "a journal waited for the next look after one was sent"


@pytest.fixture
def held_scan(monkeypatch):
    """A seam on the adopted journal's recovery scan: until ``finish`` is set, a journal under
    one of ``paths`` makes no progress, however many turns the sender gives it (a very large
    journal on a slow disk); ``scanning`` is set once a turn gave it one."""
    state = {"paths": [], "finish": threading.Event(), "scanning": threading.Event()}
    real = Journal.recover_some

    def recover_some(journal, *args, **kwargs):
        if journal.path in state["paths"] and not state["finish"].is_set():
            state["scanning"].set()
            return False
        return real(journal, *args, **kwargs)

    monkeypatch.setattr(Journal, "recover_some", recover_some)
    return state


def test_the_producers_own_events_are_sent_while_an_adopted_journal_is_scanned(kafka, tmp_path, held_scan):
    topic = kafka.new_topic("long-scan")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5)
    try:
        held_scan["paths"] += journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, 100))
        p.emit(seq_event(100))
        assert p.flush(30) == 0
        wait_for(held_scan["scanning"].is_set, 30, "the journal taken over, its scan going on")
        for i in range(101, 151):
            p.emit(seq_event(i))
        assert p.flush(30) == 0, "the producer's own events waited for the adopted journal's scan"
        assert p.stats.adopted == 0
        held_scan["finish"].set()
        wait_for(lambda: p.stats.adopted == 100, 60, "the journal sent once scanned")
    finally:
        p.close()


def test_no_adopted_batch_starts_once_close_began_during_the_sender_turn(kafka, tmp_path, monkeypatch):
    """close() begins while the sender's turn is reading the adopted journal (its last scan
    slice here): that turn sends nothing of it, nor does any later one."""
    topic = kafka.new_topic("closing")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5)
    real = Journal.recover_some
    orphans: list[Path] = []

    def recover_some(journal, *args, **kwargs):
        done = real(journal, *args, **kwargs)
        if done and journal.path in orphans:
            p._closing = True   # what close() sets first, from the caller's thread
        return done

    monkeypatch.setattr(Journal, "recover_some", recover_some)
    try:
        p.emit(seq_event(100))
        assert p.flush(30) == 0
        orphans += journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, 100))
        wait_for(lambda: p._closing, 30, "the journal taken over and scanned")
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            assert p.stats.adopted == 0, "an adopted batch sent after close() began"
            time.sleep(0.05)  # ok: watching that nothing happens for a bounded time
    finally:
        p.close(5)
    left = adopt_orphans(tmp_path, max_bytes=1 << 30, segment_bytes=1 << 20)
    try:
        assert [(j.path, j.pending) for j in left] == [(orphans[0], 100)]
    finally:
        for journal in left:
            journal.close()


def test_the_adopted_journal_is_released_even_when_the_last_turn_fails(adoption_in_flight, monkeypatch):
    p, orphan = adoption_in_flight

    def broken(*args):
        raise RuntimeError("a bug in the sender's last turn")

    monkeypatch.setattr(p, "_settle_replay", broken)
    p.close(5)
    assert open_paths_under([orphan]) == [], "the adopted journal is still held"


def test_a_queue_too_small_for_an_adopted_batch_adopts_nothing(kafka, tmp_path):
    """queue_max_events=1 (allowed): no batch of an adopted journal could ever start, so none
    is taken over; it stays free for a process that can send it."""
    topic = kafka.new_topic("tiny-queue")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5, queue_max_events=1)
    try:
        p.emit(seq_event(0))
        assert p.flush(30) == 0
        [orphan] = journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 1, 10))
        quiet_until = time.monotonic() + 2.5   # five looks for orphans
        while time.monotonic() < quiet_until:
            assert open_paths_under([orphan]) == [], "a journal adopted that could never be sent"
            assert p._adopted is None
            time.sleep(0.02)  # ok: watching that nothing happens for a bounded time
        fd = lock_existing(orphan)
        assert fd is not None, "the orphan's LOCK is held"
        os.close(fd)
    finally:
        p.close()


def test_a_sent_journal_that_could_not_be_removed_is_not_taken_again_every_turn(kafka, tmp_path, monkeypatch):
    """Its removal failed (silently): the journal is still there, all sent, its LOCK free.
    The next look waits for the interval, as after a look that finds nothing to send."""
    topic = kafka.new_topic("not-removed")
    interval = 1.0
    orphans: list[Path] = []
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if Path(path).name == "DESTINATION" and Path(path).parent in orphans:
            raise PermissionError(13, "Permission denied", str(path))   # its removal stops there, LOCK kept
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    looks = []
    monkeypatch.setattr(replay_module, "adopt_next", lambda *a, **kw: looks.append(1) or adopt_next(*a, **kw))
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=interval)
    try:
        orphans += journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, 10))
        wait_for(lambda: p.stats.adopted == 10, 60, "the journal sent")
        counted = len(looks)
        watch_s = 2 * interval
        quiet_until = time.monotonic() + watch_s
        while time.monotonic() < quiet_until:
            time.sleep(0.05)  # ok: watching what the sender does for a bounded time
        assert len(looks) - counted <= watch_s / interval + 3, "the journal was taken again every turn"
        assert orphans[0].exists()
    finally:
        p.close()


def test_no_adopted_batch_starts_while_kafka_is_reported_down(kafka, tmp_path, held_scan):
    """An outage reported after the journal was taken over: it stays held, none of it sent,
    while Kafka does not answer (the idle probe goes on asking), until Kafka acknowledges a
    record again."""
    topic = kafka.new_topic("down-after-adoption")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path, interval=0.5)
    probes: list[float] = []
    p._probe_kafka = lambda: probes.append(time.monotonic())   # asked, and no answer: still down
    try:
        p.emit(seq_event(100))
        assert p.flush(30) == 0
        held_scan["paths"] += journals_left_by_killed_process(tmp_path, (topic, kafka.bootstrap_servers, 0, 100))
        wait_for(held_scan["scanning"].is_set, 30, "the journal taken over, its scan going on")
        p._kafka_down = True   # what librdkafka's "all brokers down" sets (nothing flows to clear it)
        held_scan["finish"].set()
        wait_for(lambda: p._adopted is not None and p._adopted.recovered, 30, "the journal scanned")
        quiet_until = time.monotonic() + 1.5
        while time.monotonic() < quiet_until:
            assert p._replay is None and p.stats.adopted == 0, "an adopted batch started while Kafka is down"
            time.sleep(0.02)  # ok: watching that nothing happens for a bounded time
        assert len(probes) >= 2, "the held journal's producer stopped asking whether Kafka is back"
        p.emit(seq_event(101))   # its acknowledgement says Kafka is back
        wait_for(lambda: p.stats.adopted == 100, 60, "the journal sent once Kafka took an event")
    finally:
        p.close()


def test_a_failing_last_turn_is_logged_even_when_releasing_the_journals_fails_too(kafka, tmp_path, monkeypatch,
                                                                                   caplog):
    caplog.set_level(logging.ERROR, "producer.kafka")
    topic = kafka.new_topic("two-failures")
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    real_settle = p._settle_replay

    def settle():
        if sys._getframe(1).f_code.co_name == "_shutdown":
            raise RuntimeError("the first failure")
        return real_settle()

    def release(*args, **kwargs):
        raise RuntimeError("the second failure")

    try:
        p.emit(seq_event(0))
        assert p.flush(30) == 0
        monkeypatch.setattr(p, "_settle_replay", settle)
        monkeypatch.setattr(p, "_release_adopted", release)
    finally:
        p.close(5)
    failed = [r.getMessage() for r in caplog.records if "event=sender_failed" in r.getMessage()]
    assert [m for m in failed if "the first failure" in m] != [], "the last turn's failure was not logged"
    assert sum("the first failure" in m for m in failed) == 1 and sum("the second failure" in m for m in failed) == 1


def _journal_holding(root: Path, topic: str, bootstrap: str, records: list[tuple[bytes | None, bytes]]) -> None:
    """A journal holding ``records`` whose process died (the kernel drops its flock with its descriptors)."""
    journal = Journal.create(root, max_bytes=1 << 30, segment_bytes=1 << 20, destination=Destination(topic, bootstrap))
    journal.append(records)
    if journal._writer is not None:
        os.close(journal._writer)
    os.close(journal._lock_fd)


def test_a_journaled_record_librdkafka_refuses_for_good_is_dropped_and_the_rest_is_sent(broker, tmp_path, caplog):
    """A journal left by a process whose message.max.bytes was larger holds a record over this
    producer's: produce() refuses it for good (MSG_SIZE_TOO_LARGE). It is dropped, counted
    (too_large), and the replay commits past it: the records before it are not sent again and
    again, the ones after it go, and the producer gets back to direct sending."""
    broker.start()
    broker.create_topic("oversized", 1)
    encoded = [(message_key(e).encode(), encode_json(e)) for e in map(seq_event, range(6))]
    _journal_holding(tmp_path, "oversized", broker.bootstrap_servers,
                     [*encoded[:3], (b"big", b"x" * 150_000), *encoded[3:]])
    properties = {**FAST_RECONNECT, "message.max.bytes": "100000"}
    with caplog.at_level(logging.ERROR, logger="producer"):
        with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic="oversized", journal_dir=tmp_path,
                             properties=properties, close_timeout_s=2) as p:
            for i in range(6, 9):
                p.emit(seq_event(i))
            assert p.flush(20) == 0, p.stats
            wait_for(lambda: p.stats.mode == "direct", 10, "direct mode")
            # Its own events went to its journal behind the dead process's (journal mode at start).
            assert p.stats.dropped == {"too_large": 1} and p.stats.replayed == 9, p.stats
    assert any("reason=too_large" in r.getMessage() and "key=b'big'" in r.getMessage() for r in caplog.records)
    records = read_topic(broker.bootstrap_servers, "oversized", expected=10, timeout_s=3)
    assert len(records) == 9, "each event written once: the records before the refused one were not sent again"
    assert_all_arrived_in_order(records, range(9))
    assert not [d for d in tmp_path.iterdir() if not d.name.startswith(".")], "the journal, all sent, is removed"


class _Message:
    def __init__(self, key: bytes | None, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value


class _RecordingKafka:
    """Stands for librdkafka: keeps what is produced, with its delivery callback, for the test to answer."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, _Message]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, on_delivery=None) -> None:  # noqa: ANN001
        self.sent.append((on_delivery, _Message(key, value)))


def test_a_record_the_broker_rejects_is_counted_once_and_not_sent_again_with_its_failed_batch(tmp_path):
    """A replay batch: the broker rejects one record for good (counted rejected_by_broker),
    another fails for now, so the batch is read and sent again. The rejected record is not
    sent again, nor counted again; once the rest is acknowledged the batch is committed."""
    p = LineageProducer(bootstrap_servers="127.0.0.1:1", topic="t", journal_dir=tmp_path / "own", close_timeout_s=0)
    p.close()   # its sender thread is done: the replay is driven from here, answers made up
    p._producer = kafka = _RecordingKafka()
    journal = Journal.create(tmp_path / "left", max_bytes=1 << 20, segment_bytes=1 << 20)
    journal.append([(b"a", b"REJECTED"), (b"b", b"GOOD")])
    p._send_batch(journal, 10, 1 << 20)
    (rejected, first), (failed, second) = kafka.sent
    rejected(KafkaError(KafkaError.INVALID_RECORD), first)
    failed(KafkaError(KafkaError._MSG_TIMED_OUT), second)
    assert not p._settle_replay() and p.stats.dropped == {"rejected_by_broker": 1}
    kafka.sent.clear()
    p._retry_at = 0.0
    p._send_batch(journal, 10, 1 << 20)
    assert [message.value() for _, message in kafka.sent] == [b"GOOD"]
    for on_delivery, message in kafka.sent:
        on_delivery(None, message)
    assert p._settle_replay()
    assert p.stats.dropped == {"rejected_by_broker": 1} and p.stats.replayed == 1 and journal.pending == 0, p.stats
    journal.close()


def test_one_writers_journals_go_in_order_though_two_producers_adopt_them(broker, tmp_path, caplog):
    """A producer makes a second journal during a reclaim's wait (its spill queue goes
    aside) and dies with both pending (here: closed while the broker is frozen). Another
    process is sending the older one when a producer starts on the directory: that producer
    must not send the newer one meanwhile, nor take it before the older one is all sent,
    or a run's later events reach Kafka before its earlier ones."""
    topic = "one-writer"
    broker.start()
    broker.create_topic(topic, 1)
    caplog.set_level(logging.INFO, "producer.kafka")
    logged = lambda text: any(text in r.getMessage() for r in caplog.records)  # noqa: E731
    root = tmp_path / "j"
    dead = _producer(broker.bootstrap_servers, topic, root, queue_max_events=100, close_timeout_s=1)
    try:
        with frozen_with_an_aside_journal(dead, broker, seq_event, logged):
            dead.close(1)
        assert dead.stats.journaled == 110 and dead.stats.dropped == {}, dead.stats
        older, newer = sorted(p for p in root.iterdir() if list(p.glob("*.seg")))
        # Another process is sending the older journal.
        elsewhere = adopt_next(root, max_bytes=1 << 30, segment_bytes=1 << 20,
                               destination=Destination(topic, broker.bootstrap_servers))
        assert elsewhere is not None and elsewhere.path == older
        p = _producer(broker.bootstrap_servers, topic, root, interval=0.2)
        try:
            assert p.flush(30) == 0
            assert adopt_orphans(root, max_bytes=1 << 30, segment_bytes=1 << 20,
                                 destination=Destination(topic, broker.bootstrap_servers)) == []
            assert newer.exists() and list(newer.glob("*.seg")), "the newer journal went before the older one"
            elsewhere.close()   # released unsent (that process ended): the running producer takes both
            wait_for(lambda: no_segments_left(root), 60, "both journals sent")
        finally:
            p.close()
    finally:
        dead.close(0)
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=111), range(111))


def _sender_turn(step):  # noqa: ANN001, ANN202
    """A step as the sender thread runs it: an exception is logged (sender_failed), the thread goes on."""
    try:
        return step()
    except Exception:  # noqa: BLE001
        return None


def _replay_batch(p: LineageProducer, kafka: Any, journal: Journal, size: int,
                  error: KafkaError | None = None) -> list[bytes]:
    """One replay batch of ``size`` records sent, answered with ``error`` (None: delivered) and
    settled on a sender turn; what was sent."""
    kafka.sent.clear()
    p._retry_at = 0.0
    p._send_batch(journal, size, 1 << 20)
    for on_delivery, message in kafka.sent:
        on_delivery(error, message)
    _sender_turn(p._settle_replay)
    return [message.value() for _, message in kafka.sent]


def test_a_batch_delivered_whose_commit_fails_counts_once_and_is_not_pending_any_more(tmp_path, monkeypatch, caplog):
    """The disk is full when a delivered batch's position is committed (CURSOR cannot be
    written). Its records are delivered all the same: counted once, no longer pending (flush()
    and close() must not wait for them), and a later batch that fails is sent again from
    there, not from the stale cursor (which would send them, and count them, twice). Only a
    crash before the next commit would send them again (at-least-once)."""
    real_write_synced = journal_module.write_synced

    def cursor_disk_full_once(path, text):  # noqa: ANN001, ANN202
        if path.name == "CURSOR.tmp" and not failed:
            failed.append(path)
            raise OSError(28, "No space left on device")
        return real_write_synced(path, text)
    failed: list[Path] = []
    monkeypatch.setattr(journal_module, "write_synced", cursor_disk_full_once)
    monkeypatch.setattr(sender_module, "INCIDENT_QUIET_S", 0.0)   # the disk has room again for good
    caplog.set_level(logging.WARNING, "producer.kafka")
    p = LineageProducer(bootstrap_servers="127.0.0.1:1", topic="t", journal_dir=tmp_path / "own", close_timeout_s=0)
    p.close()   # its sender thread is done: the replay is driven from here, answers made up
    p._producer = kafka = _RecordingKafka()
    journal = Journal.create(tmp_path / "left", max_bytes=1 << 20, segment_bytes=1 << 20)
    journal.append([(b"k", b"a"), (b"k", b"b"), (b"k", b"c"), (b"k", b"d")])

    def send_and_answer(error: KafkaError | None = None) -> list[bytes]:
        return _replay_batch(p, kafka, journal, 2, error)

    assert send_and_answer() == [b"a", b"b"] and failed, "the commit did not fail"
    assert p.stats.replayed == 2 and journal.pending == 2, (p.stats, journal)
    assert send_and_answer(KafkaError(KafkaError._MSG_TIMED_OUT)) == [b"c", b"d"]
    assert p.stats.replayed == 2 and journal.pending == 2, (p.stats, journal)
    assert send_and_answer() == [b"c", b"d"], "sent again from the stale cursor"
    assert p.stats.replayed == 4 and journal.pending == 0, (p.stats, journal)
    assert any("event=journal_commit_failed" in r.getMessage() for r in caplog.records)
    # The next commit went through: logged once, and a later failure is logged from its first again.
    recovered = [r.getMessage() for r in caplog.records if "event=journal_commits_recovered" in r.getMessage()]
    assert len(recovered) == 1 and "failures=1" in recovered[0], recovered
    journal.close()
    assert not journal.path.exists(), "all delivered: removed"


def test_commits_failing_every_other_time_are_one_incident_not_a_recovered_line_each(tmp_path, monkeypatch, caplog):
    """A disk at the edge of full: every other commit fails. One incident: no
    journal_commits_recovered line until commits have gone through INCIDENT_QUIET_S after the
    last failure, then one, with every failure."""
    real_write_synced, writes = journal_module.write_synced, [0]
    now = [1000.0]
    monkeypatch.setattr(sender_module, "_now", lambda: now[0], raising=False)
    quiet_s = getattr(sender_module, "INCIDENT_QUIET_S", 60.0)

    def cursor_full_every_other_time(path, text):  # noqa: ANN001, ANN202
        if path.name == "CURSOR.tmp" and failing[0]:
            writes[0] += 1
            if writes[0] % 2:
                raise OSError(28, "No space left on device")
        return real_write_synced(path, text)
    failing = [True]
    monkeypatch.setattr(journal_module, "write_synced", cursor_full_every_other_time)
    caplog.set_level(logging.WARNING, "producer.kafka")
    p = LineageProducer(bootstrap_servers="127.0.0.1:1", topic="t", journal_dir=tmp_path / "own", close_timeout_s=0)
    p.close()
    p._producer = kafka = _RecordingKafka()
    journal = Journal.create(tmp_path / "left", max_bytes=1 << 20, segment_bytes=1 << 20)
    journal.append([(b"k", f"v{i}".encode()) for i in range(41)])

    def send_and_answer() -> None:
        _replay_batch(p, kafka, journal, 1)
        now[0] += 1.0

    recovered = lambda: [r.getMessage() for r in caplog.records  # noqa: E731
                         if "event=journal_commits_recovered" in r.getMessage()]
    for _ in range(40):
        send_and_answer()
    assert recovered() == [], recovered()
    failing[0] = False
    now[0] += quiet_s
    send_and_answer()
    assert len(recovered()) == 1 and "failures=20" in recovered()[0], recovered()
    journal.close()
