"""A starting producer takes the journals dead processes left over without slowing the
job's start: construction only locks and opens them, its sender thread counts their
records, and until it has, ``pending`` (so ``flush()`` and ``close()``) counts each as at
least 1. Their events still go before the producer's own."""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from pathlib import Path

import pytest

from producer import LineageProducer
from producer.codec import encode_json
from producer.journal import Journal
from producer.journal_dir import Destination, lock_existing
from producer.keys import message_key
from tests.producer.support import FAST_RECONNECT, decode, seq_event, wait_for
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka


def _orphan(root: Path, topic: str, bootstrap: str, start: int, count: int,
            segment_bytes: int = 1 << 20) -> Journal:
    """A journal holding events ``start`` .. ``start + count - 1`` whose process died (the
    kernel drops its flock with its descriptors)."""
    journal = Journal.create(root, max_bytes=1 << 30, segment_bytes=segment_bytes,
                             destination=Destination(topic, bootstrap))
    events = [seq_event(i) for i in range(start, start + count)]
    journal.append([(message_key(e).encode(), encode_json(e)) for e in events])
    if journal._writer is not None:
        os.close(journal._writer)
    os.close(journal._lock_fd)
    return journal


def _producer(bootstrap: str, topic: str, journal_dir: Path, **kw) -> LineageProducer:
    return LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir,
                           properties=FAST_RECONNECT, **kw)


def _arrival_order(bootstrap: str, topic: str, expected: int) -> list[int]:
    """The events of a one-partition topic, first arrivals only (at-least-once)."""
    records = read_topic(bootstrap, topic, expected=expected)
    return list(dict.fromkeys(decode(r.value)["run"]["facets"]["seq"]["i"] for r in records))


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "LOCK"}


class ScanSeam:
    """Counts the journal records each thread reads (``records["caller"]``: this test's
    thread, ``records["sender"]``: the producer's), and holds the sender's recovery scans:
    for a journal in ``held``, a scan slice on the sender thread makes no progress (it
    waits on an event for a moment, so the held sender does not spin) unless ``slices``
    allows one; ``counted``: those allowed slices completed."""

    def __init__(self) -> None:
        self.caller = threading.get_ident()
        self.records: Counter[str] = Counter()
        self.held: set[Path] = set()      # the journals whose scans are held
        self.slices = 0
        self.counted = 0
        self.released = threading.Event()
        self.waiting = threading.Event()   # a held scan slice was asked for

    def release(self) -> None:
        self.held = set()
        self.released.set()

    def _thread(self) -> str:
        if threading.get_ident() == self.caller:
            return "caller"
        return "sender" if threading.current_thread().name.startswith("lineage-producer") else "other"


@pytest.fixture
def seam(monkeypatch):
    s = ScanSeam()
    real_scan, real_recover = Journal._scan, Journal.recover_some

    def scan(journal, *args, **kwargs):
        out = real_scan(journal, *args, **kwargs)
        s.records[s._thread()] += len(out[0])
        return out

    def recover_some(journal, *args, **kwargs):
        if journal.path not in s.held or s._thread() != "sender":
            return real_recover(journal, *args, **kwargs)
        if s.slices == 0:
            s.waiting.set()
            s.released.wait(0.01)
            return False
        s.slices -= 1
        done = real_recover(journal, *args, **kwargs)
        s.counted += 1
        return done

    monkeypatch.setattr(Journal, "_scan", scan)
    monkeypatch.setattr(Journal, "recover_some", recover_some)
    return s


def test_construction_only_locks_the_orphan_journals_and_the_sender_counts_and_sends_them(
        kafka, tmp_path, seam, caplog):
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("takeover-at-start")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 20_000)
    empty = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 0)
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        assert seam.records["caller"] == 0, "construction read the orphan journals"
        assert lock_existing(orphan.path) is None, "the orphan not taken over at construction"
        assert not empty.path.exists(), "an empty orphan (no bytes after its cursor) not removed at construction"
        for i in range(20_000, 20_050):
            p.emit(seq_event(i))
        assert p.flush(120) == 0
        assert seam.records["caller"] == 0
        assert seam.records["sender"] >= 20_000, "the sender did not count the orphan's records"
    finally:
        p.close()
    assert not orphan.path.exists() and not empty.path.exists(), "a sent or empty journal was not removed"
    adopted = [r.getMessage() for r in caplog.records if "event=adopted " in r.getMessage()]
    assert adopted == [f"journal={orphan.path} event=adopted pending=20000"]
    assert _arrival_order(kafka.bootstrap_servers, topic, 20_050) == list(range(20_050))


def test_an_uncounted_journal_is_pending_as_at_least_one_and_its_events_go_before_the_producers_own(
        kafka, tmp_path, seam):
    topic = kafka.new_topic("uncounted")
    seam.held.add(_orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 5000).path)
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        wait_for(seam.waiting.is_set, 30, "the sender scanning the journal taken over")
        for i in range(5000, 5010):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.journaled == 10, 30, "the producer's own events behind the orphan's")
        assert seam.records["sender"] == 0
        assert p.pending == 10 + 1, "an uncounted journal is pending as at least 1"
        assert p.flush(0.2) > 0, "flush() did not wait for the uncounted journal"
        seam.slices = 1   # one slice of the count: the records found so far are pending
        wait_for(lambda: seam.counted == 1, 30, "one slice counted")
        assert 0 < seam.records["sender"] < 5000
        assert p.pending == 10 + seam.records["sender"]
        assert p.stats.delivered == 0, "events sent before the orphan's were all counted"
        seam.release()
        assert p.flush(60) == 0
    finally:
        p.close()
    assert _arrival_order(kafka.bootstrap_servers, topic, 5010) == list(range(5010))


def test_close_before_the_journal_is_counted_leaves_it_whole_for_the_next_producer(kafka, tmp_path, seam, caplog):
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("closed-mid-scan")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 3000)
    before = _files(orphan.path)
    seam.held.add(orphan.path)
    seam.slices = 1
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        wait_for(lambda: seam.counted == 1 and seam.waiting.is_set(), 30, "the journal partly counted")
        for i in range(3000, 3005):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.journaled == 5, 30, "the producer's own events behind the orphan's")
    finally:
        p.close(0.5)
    assert p.stats.delivered == 0
    assert p.stats.pending == 5 + seam.records["sender"], "what close() left is not in pending"
    assert _files(orphan.path) == before, "the journal released mid-scan was changed"
    released = [r.getMessage() for r in caplog.records if "event=taken_over_journal_released" in r.getMessage()]
    assert released == [f"journal={orphan.path} event=taken_over_journal_released topic={topic} pending=not_counted"]
    fd = lock_existing(orphan.path)
    assert fd is not None, "the journal is still locked"
    os.close(fd)
    seam.release()
    with _producer(kafka.bootstrap_servers, topic, tmp_path) as again:
        assert again.flush(60) == 0
    assert list(tmp_path.iterdir()) == [], "a sent journal was left"
    assert _arrival_order(kafka.bootstrap_servers, topic, 3005) == list(range(3005))


def test_a_journal_whose_cursor_is_at_the_end_of_a_segment_sends_only_what_follows(kafka, tmp_path, seam):
    """The usual state of a journal whose process died after sending part of it: the cursor
    at the end of a segment that is still there (commit removes only earlier ones)."""
    topic = kafka.new_topic("cursor-at-segment-end")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 1000, segment_bytes=64 * 1024)
    first_segment = (orphan.path / "00000001.seg").stat().st_size
    sent = 0
    while True:
        records, pos = orphan.read(1)
        sent += len(records)
        if pos == (1, first_segment):
            break
    orphan.commit(pos, sent)
    orphan._reader.close()
    assert (orphan.path / "00000001.seg").exists() and (orphan.path / "00000002.seg").exists()
    assert 0 < sent < 1000
    seam.records.clear()   # what this test read above
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        assert seam.records["caller"] == 0, "construction read the orphan journal"
        for i in range(1000, 1010):
            p.emit(seq_event(i))
        assert p.flush(60) == 0
    finally:
        p.close()
    assert not orphan.path.exists()
    assert _arrival_order(kafka.bootstrap_servers, topic, 1010 - sent) == list(range(sent, 1010))


def test_a_start_with_only_empty_orphans_stays_direct(kafka, tmp_path, seam, caplog):
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("empty-orphans")
    empties = [_orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 0) for _ in range(2)]
    seam.held.update(e.path for e in empties)   # a producer that took them would never finish their scans
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        assert not any(e.path.exists() for e in empties), "an empty orphan was not removed at construction"
        for i in range(50):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
        assert (p.stats.mode, p.stats.journaled, p.stats.replayed) == ("direct", 0, 0)
    finally:
        p.close()
    assert "event=journal_mode" not in caplog.text and "event=direct_mode" not in caplog.text
    assert _arrival_order(kafka.bootstrap_servers, topic, 50) == list(range(50))


def _given_up(caplog, journal: Journal) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "event=adopt_failed" in r.getMessage() and r.getMessage().startswith(f"journal={journal.path} ")]


def _own_events_sent_and_the_orphan_given_up_whole(kafka, topic: str, tmp_path: Path, orphan: Journal,
                                                  caplog) -> None:
    before = _files(orphan.path)
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        for i in range(1000, 1020):
            p.emit(seq_event(i))
        assert p.flush(30) == 0, "the producer's own events waited for a journal it could not count"
    finally:
        p.close()
    assert len(_given_up(caplog, orphan)) == 1
    assert "event=sender_failed" not in caplog.text
    assert _files(orphan.path) == before, "a journal given up was changed"
    fd = lock_existing(orphan.path)
    assert fd is not None, "a journal given up is still locked"
    os.close(fd)
    assert _arrival_order(kafka.bootstrap_servers, topic, 20) == list(range(1000, 1020))


def test_a_record_longer_than_its_segment_in_an_orphan_is_skipped_and_every_other_one_sent(
        kafka, tmp_path, caplog):
    """A corrupt header (a huge length) in a segment followed by others: not read (no
    allocation of its length), not cut as a torn tail, the journal not given up: that record
    is skipped (dropped, ``journal_corrupt``: one region), all the others go, before the
    producer's own events."""
    caplog.set_level(logging.INFO, "producer.journal")
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("huge-length")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 200, segment_bytes=16 * 1024)
    segment = orphan.path / "00000001.seg"
    assert (orphan.path / "00000002.seg").exists()
    with open(segment, "r+b") as f:
        f.seek(4)   # the first record's value length
        f.write((0xFFFFFFF0).to_bytes(4, "big"))
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        for i in range(1000, 1020):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
        dropped = p.stats.dropped
    finally:
        p.close()
    assert dropped == {"journal_corrupt": 1}
    assert _given_up(caplog, orphan) == []
    assert f"journal={orphan.path} event=journal_corrupt segment=1 offset=0 " in caplog.text
    assert not orphan.path.exists(), "a journal all sent is removed"
    assert _arrival_order(kafka.bootstrap_servers, topic, 219) == list(range(1, 200)) + list(range(1000, 1020))


def test_any_failure_counting_an_orphan_gives_it_up_and_the_producers_own_events_go(
        kafka, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, "producer.journal")
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("count-fails")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 100)
    real_recover = Journal.recover_some

    def recover_some(journal, *args, **kwargs):
        if journal.path == orphan.path:
            raise MemoryError("a record's length read as 4 GiB")
        return real_recover(journal, *args, **kwargs)

    monkeypatch.setattr(Journal, "recover_some", recover_some)
    _own_events_sent_and_the_orphan_given_up_whole(kafka, topic, tmp_path, orphan, caplog)


def test_an_orphan_segment_that_cannot_be_read_gives_the_journal_up_whole(kafka, tmp_path, caplog):
    caplog.set_level(logging.INFO, "producer.journal")
    caplog.set_level(logging.INFO, "producer.kafka")
    topic = kafka.new_topic("unreadable-segment")
    orphan = _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 200, segment_bytes=16 * 1024)
    segment = orphan.path / "00000001.seg"
    segment.unlink()
    segment.mkdir()   # opened for reading: IsADirectoryError
    (segment / "x").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in orphan.path.glob("0000000[2-9].seg")}
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        for i in range(1000, 1020):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
    finally:
        p.close()
    assert len(_given_up(caplog, orphan)) == 1
    assert "event=sender_failed" not in caplog.text
    assert {p.name: p.read_bytes() for p in orphan.path.glob("0000000[2-9].seg")} == before
    assert (segment / "x").exists()
    assert _arrival_order(kafka.bootstrap_servers, topic, 20) == list(range(1000, 1020))


def test_the_oldest_journal_is_sent_as_soon_as_it_is_counted_the_others_still_before_the_producers_own(
        kafka, tmp_path, seam):
    """A short-lived process makes progress on what dead ones left: the oldest journal does
    not wait for the others' counts; order is kept (journal by journal, its own events last)."""
    topic = kafka.new_topic("oldest-first")
    _orphan(tmp_path, topic, kafka.bootstrap_servers, 0, 3000)
    later = _orphan(tmp_path, topic, kafka.bootstrap_servers, 3000, 3000)
    seam.held.add(later.path)
    p = _producer(kafka.bootstrap_servers, topic, tmp_path)
    try:
        for i in range(6000, 6010):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.replayed == 3000, 60, "the oldest journal sent while the next is not counted")
        # Counted as replayed before its last batch is committed: then pending drops to these.
        wait_for(lambda: p.pending == 10 + 1, 30, "pending: the uncounted journal and the producer's own events")
        assert p.stats.delivered == 3000, "the producer's own events went before the uncounted journal's"
        seam.release()
        assert p.flush(60) == 0
    finally:
        p.close()
    assert list(tmp_path.iterdir()) == [], "a sent journal was left"
    assert _arrival_order(kafka.bootstrap_servers, topic, 6010) == list(range(6010))
