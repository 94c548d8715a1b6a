"""The on-disk journal: order, durability across a crash, the size cap, adoption."""

from __future__ import annotations

import os

import pytest

from producer.errors import JournalError
from producer.journal import Journal
from producer.orphans import adopt_orphans


def _records(n: int, start: int = 0) -> list[tuple[bytes | None, bytes]]:
    return [(None if i % 5 == 0 else f"k{i % 3}".encode(), f"value-{i}".encode() * 3)
            for i in range(start, start + n)]


def _new(root, max_bytes=1 << 20, segment_bytes=4096) -> Journal:
    return Journal.create(root, max_bytes=max_bytes, segment_bytes=segment_bytes)


def test_records_come_back_in_order_across_segments_and_commits(tmp_path):
    journal = _new(tmp_path)
    assert journal.append(_records(300)) == 300
    assert len(list(journal.path.glob("*.seg"))) > 1
    got = []
    while True:
        batch, pos = journal.read(max_records=70)
        if not batch:
            break
        got += batch
        journal.commit(pos, len(batch))
    assert got == _records(300) and journal.pending == 0
    # Fully delivered segments are deleted.
    assert journal.size_bytes == 0


def test_rewind_resends_an_unacknowledged_batch(tmp_path):
    journal = _new(tmp_path)
    journal.append(_records(10))
    first, _ = journal.read(max_records=4)
    journal.rewind()
    again, pos = journal.read(max_records=4)
    assert again == first
    journal.commit(pos, 4)
    rest, _ = journal.read()
    assert rest == _records(10)[4:]


def test_an_orphaned_journal_resumes_at_its_last_commit(tmp_path):
    journal = _new(tmp_path)
    journal.append(_records(20))
    batch, pos = journal.read(max_records=8)
    journal.commit(pos, 8)
    journal.read(max_records=5)           # read, never committed: must come back
    os.close(journal._lock_fd)            # the owner dies (the kernel drops its flock)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    assert adopted.pending == 12
    assert adopted.read()[0] == _records(20)[8:]


def test_a_torn_last_record_is_cut_off(tmp_path):
    journal = _new(tmp_path)
    journal.append(_records(5))
    segment = sorted(journal.path.glob("*.seg"))[-1]
    with open(segment, "ab") as f:        # a crash in the middle of an append
        f.write(b"\x00\x01\x02partial")
    os.close(journal._lock_fd)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    assert adopted.pending == 5 and adopted.read()[0] == _records(5)
    assert adopted.append(_records(1, start=5)) == 1
    adopted.rewind()
    assert adopted.read()[0] == _records(6)


def test_the_size_cap_refuses_what_does_not_fit(tmp_path):
    journal = _new(tmp_path, max_bytes=64 * 1024, segment_bytes=16 * 1024)
    big = [(b"k", b"x" * 1000)] * 100
    written = journal.append(big)
    assert 50 < written < 100 and journal.size_bytes <= 64 * 1024
    assert journal.append(big) == 0


def test_a_live_journal_is_never_adopted_and_empty_orphans_vanish(tmp_path):
    live = _new(tmp_path)
    live.append(_records(3))
    empty = _new(tmp_path)
    os.close(empty._lock_fd)
    assert adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096) == []
    assert not empty.path.exists() and live.path.exists()


def test_close_removes_a_delivered_journal_and_keeps_an_undelivered_one(tmp_path):
    delivered, kept = _new(tmp_path), _new(tmp_path)
    delivered.append(_records(2))
    batch, pos = delivered.read()
    delivered.commit(pos, len(batch))
    kept.append(_records(2))
    delivered.close()
    kept.close()
    assert not delivered.path.exists()
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    assert adopted.path == kept.path and adopted.read()[0] == _records(2)


def test_a_record_longer_than_its_segment_is_corrupt_in_a_segment_followed_by_others(tmp_path):
    """Not read (a huge length would be a huge allocation), not cut as a torn tail: the
    records after it stay, and so does the whole journal."""
    journal = _new(tmp_path)
    journal.append(_records(300))
    os.close(journal._writer)
    os.close(journal._lock_fd)
    with open(journal.path / "00000002.seg", "r+b") as f:
        f.seek(4)   # the segment's first record's value length
        f.write((0xFFFFFFF0).to_bytes(4, "big"))
    before = {p.name: p.read_bytes() for p in journal.path.iterdir() if p.name != "LOCK"}
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, recover=False)
    with pytest.raises(JournalError, match="corrupt at segment 2 offset 0"):
        while not adopted.recover_some(max_records=1000):
            pass
    adopted.close()
    assert {p.name: p.read_bytes() for p in journal.path.iterdir() if p.name != "LOCK"} == before


def test_a_record_longer_than_the_last_segment_is_a_torn_tail(tmp_path):
    journal = _new(tmp_path)
    journal.append(_records(5))
    segment = sorted(journal.path.glob("*.seg"))[-1]
    with open(segment, "ab") as f:        # a crash mid-append: the header whole, its value not
        f.write((0).to_bytes(4, "big") + (0xFFFFFFF0).to_bytes(4, "big") + (0).to_bytes(2, "big") + b"partial")
    os.close(journal._lock_fd)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    assert adopted.pending == 5 and adopted.read()[0] == _records(5)


def test_a_recovery_slice_stops_at_its_deadline(tmp_path):
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(300))
    os.close(journal._lock_fd)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20, recover=False)
    assert not adopted.recover_some(max_records=1000, deadline=0.0)   # long past: the fewest records
    assert 1 <= adopted.pending_at_least < 300
    while not adopted.recover_some(max_records=1000, deadline=0.0):
        pass
    assert adopted.pending == 300
    adopted.close()
