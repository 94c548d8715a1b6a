"""The on-disk journal: order, durability across a crash, the size cap, adoption."""

from __future__ import annotations

import errno
import logging
import os
import random
import struct

import pytest

from producer import journal as journal_module
from producer.journal import Journal, encode_record
from producer.journal_dir import Destination
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


def test_a_commit_that_cannot_write_its_cursor_still_moves_pending_and_a_crash_then_resends(
        tmp_path, monkeypatch):
    """CURSOR.tmp cannot be written (a full disk): the commit raises, but what it marks
    delivered is no longer pending and rewind() goes back to it, not before it; on disk the
    records and the old cursor stay, so a process dying before the next commit leaves them to
    be sent again (at-least-once), never lost. The next commit writes past them."""
    journal = _new(tmp_path, segment_bytes=256)
    journal.append(_records(20))
    batch, pos = journal.read(max_records=12)
    assert pos[0] > 1, "the batch ends past the first segment"
    real = journal_module.write_synced

    def disk_full(path, text):  # noqa: ANN001, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(journal_module, "write_synced", disk_full)
    with pytest.raises(OSError):
        journal.commit(pos, 12)
    assert journal.pending == 8 and journal.read_position == pos
    journal.read(max_records=3)
    journal.rewind()
    assert journal.read()[0] == _records(20)[12:]
    assert (journal.path / "00000001.seg").exists() and not (journal.path / "CURSOR.tmp").exists()
    _orphaned(journal)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=256)
    assert adopted.pending == 20, "a crash before the next commit: sent again, not lost"
    monkeypatch.setattr(journal_module, "write_synced", real)
    batch, pos = adopted.read(max_records=15)
    adopted.commit(pos, 15)
    assert adopted.pending == 5 and not (adopted.path / "00000001.seg").exists()
    adopted.close()


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


# --- corruption: a bad record that is not a torn tail costs its own region, never the records after it


def _read_all(journal: Journal, **kw) -> list[tuple[bytes | None, bytes]]:
    got = []
    while True:
        batch, _ = journal.read(**kw)
        if not batch:
            return got
        got += batch


def _offsets(segment) -> list[int]:
    """The offsets of the records of an intact segment file."""
    data, at, out = segment.read_bytes(), 0, []
    while at < len(data):
        out.append(at)
        _, value_len, key_field = struct.unpack_from(">IIH", data, at)
        at += 10 + (key_field - 1 if key_field else 0) + value_len
    return out


def _orphaned(journal: Journal) -> None:
    if journal._writer is not None:
        os.close(journal._writer)
    os.close(journal._lock_fd)   # the owner dies


def _patch(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _files(journal: Journal) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(journal.path.iterdir()) if p.name != "LOCK"}


def _corrupt_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.ERROR and "event=journal_corrupt" in r.getMessage()]


#: Ways to spoil the record at an offset, given its key's length: a flipped byte of its value,
#: a huge value length, a value length a little off (still within the segment), a flipped CRC byte.
_SPOILERS = {
    "value_byte": lambda data, at, key_len: (at + 10 + key_len + 2, bytes([data[at + 10 + key_len + 2] ^ 0x40])),
    "huge_length": lambda data, at, key_len: (at + 4, (0xFFFFFFF0).to_bytes(4, "big")),
    "length_off": lambda data, at, key_len: (at + 4, (int.from_bytes(data[at + 4:at + 8], "big") + 3)
                                             .to_bytes(4, "big")),
    "crc_byte": lambda data, at, key_len: (at, bytes([data[at] ^ 0x01])),
}


def _region_lines(journal: Journal, *regions: tuple[int, int]) -> list[str]:
    """The ERROR lines of corrupt regions (offset, skipped bytes) in the first segment."""
    return [f"journal={journal.path} event=journal_corrupt segment=1 offset={at} skipped_bytes={size} action=skipped"
            for at, size in regions]


def _spoil(segment, at: int, how: str) -> int:
    """Spoil the record at ``at`` (see _SPOILERS); returns its size."""
    data = segment.read_bytes()
    _, value_len, key_field = struct.unpack_from(">IIH", data, at)
    key_len = key_field - 1 if key_field else 0
    _patch(segment, *_SPOILERS[how](data, at, key_len))
    return 10 + key_len + value_len


@pytest.mark.parametrize("how", sorted(_SPOILERS))
def test_a_corrupt_record_in_the_middle_of_the_last_segment_costs_that_record_only(tmp_path, caplog, how):
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(50))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    at = _offsets(segment)[20]
    size = _spoil(segment, at, how)
    length = segment.stat().st_size
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    expected = _records(20) + _records(29, start=21)
    assert adopted.pending == 49
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 offset={at} "
                                      f"skipped_bytes={size} action=skipped"]
    assert segment.stat().st_size == length, "cut at the corrupt record"
    assert "torn_tail" not in caplog.text
    assert _read_all(adopted, max_records=7) == expected
    assert (adopted.corrupt_regions, adopted.corrupt_bytes) == (1, size)
    assert adopted.take_corrupt_regions() == 1 and adopted.take_corrupt_regions() == 0
    # New records go after the ones kept; reading again (a rewind) skips the same region, logged once.
    assert adopted.append(_records(1, start=50)) == 1
    adopted.rewind()
    assert _read_all(adopted) == expected + _records(1, start=50)
    assert len(_corrupt_lines(caplog)) == 1 and adopted.corrupt_regions == 1


@pytest.mark.parametrize("how", sorted(_SPOILERS))
@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_a_corrupt_record_in_a_segment_followed_by_others_keeps_every_later_segment(tmp_path, caplog, how, which):
    """Not read (a huge length would be a huge allocation), not cut as a torn tail: the
    records after it stay, and so does every file; no JournalError."""
    journal = _new(tmp_path)
    journal.append(_records(300))
    _orphaned(journal)
    segments = sorted(journal.path.glob("*.seg"))
    assert len(segments) > 2
    offsets = _offsets(segments[1])
    index = {"first": 0, "middle": len(offsets) // 2, "last": len(offsets) - 1}[which]
    size = _spoil(segments[1], offsets[index], how)
    lost = len(_offsets(segments[0])) + index
    before = _files(journal)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, recover=False)
    while not adopted.recover_some(max_records=1000):
        pass
    assert adopted.pending == 299
    assert _files(journal) == before, "a file changed, or was deleted"
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=2 "
                                      f"offset={offsets[index]} skipped_bytes={size} action=skipped"]
    assert _read_all(adopted, max_records=70) == _records(lost) + _records(299 - lost, start=lost + 1)


def _write_segments(journal: Journal, *segments: bytes) -> None:
    for number, data in enumerate(segments, start=1):
        (journal.path / f"{number:08d}.seg").write_bytes(data)


def _encoded(n: int, start: int = 0) -> bytes:
    return b"".join(encode_record(key, value) for key, value in _records(n, start))


@pytest.mark.parametrize("then", ["records", "nothing"])
def test_megabytes_of_garbage_in_a_segment_are_skipped_in_bounded_slices(tmp_path, caplog, then):
    """A segment turned garbage after some records (up to its end, or followed by records):
    the search for the next record goes a window at a time, each recovery slice bounded,
    and the records after the garbage, in the segment and the next, all come back."""
    journal = _new(tmp_path)
    _orphaned(journal)
    garbage = random.Random(7).randbytes(3 << 20)
    tail = _encoded(10, start=10) if then == "records" else b""
    _write_segments(journal, _encoded(10) + garbage + tail, _encoded(10, start=20))
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 30, segment_bytes=4096, recover=False)
    slices = 1
    while not adopted.recover_some(max_records=1000, max_bytes=64 << 10, deadline=0.0):
        slices += 1
    assert slices >= 3, "the garbage searched in one slice"
    assert adopted.corrupt_regions == 1 and adopted.corrupt_bytes == len(garbage)
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 "
                                      f"offset={len(_encoded(10))} skipped_bytes={len(garbage)} action=skipped"]
    kept = _records(20) if then == "records" else _records(10)
    assert adopted.pending == len(kept) + 10
    assert _read_all(adopted) == kept + _records(10, start=20)


@pytest.mark.parametrize("bit", [6, 10, 12])
def test_a_length_spoiled_upwards_onto_a_later_record_skips_that_record_only(tmp_path, caplog, bit):
    """One flipped bit raises a record's value length by 2**bit: with records of one size, its
    end lands exactly on a later record, whose CRC-32 matches. The search must still resume
    at the first good record after it, not jump there and skip the records between."""
    journal = _new(tmp_path, segment_bytes=1 << 20)
    records = [(b"key-%02d" % (i % 100), b"v%047d" % i) for i in range(200)]   # 64 bytes each
    journal.append(records)
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    offsets = _offsets(segment)
    assert offsets[:3] == [0, 64, 128]
    at = offsets[50]
    value_len = struct.unpack_from(">I", segment.read_bytes(), at + 4)[0]
    _patch(segment, at + 4, struct.pack(">I", value_len ^ (1 << bit)))
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert _read_all(adopted) == records[:50] + records[51:]
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 offset={at} "
                                      f"skipped_bytes=64 action=skipped"]


def test_a_torn_tail_after_a_corrupt_record_is_still_cut_and_the_records_between_kept(tmp_path, caplog):
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(30))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    at = _offsets(segment)[10]
    _spoil(segment, at, "value_byte")
    length = segment.stat().st_size
    with open(segment, "ab") as f:        # then a crash in the middle of an append
        f.write(encode_record(b"k", b"v" * 100)[:50])
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert "event=torn_tail segment=1 offset=%d action=truncate" % length in caplog.text
    assert segment.stat().st_size == length
    assert adopted.pending == 29 and adopted.corrupt_regions == 1
    assert _read_all(adopted) == _records(10) + _records(19, start=11)


def test_corruption_after_the_journal_was_opened_is_skipped_by_read(tmp_path, caplog):
    """Bit rot after the recovery scan: read() skips the region as the scan would have
    (no JournalError), and ``pending`` is set right when the reads reach the end."""
    journal = _new(tmp_path)
    journal.append(_records(30))
    [first, *_] = sorted(journal.path.glob("*.seg"))
    at = _offsets(first)[5]
    size = _spoil(first, at, "value_byte")
    batch, _ = journal.read(max_records=10)
    assert batch == _records(5) + _records(5, start=6)
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 offset={at} "
                                      f"skipped_bytes={size} action=skipped"]
    journal.rewind()
    batch, pos = journal.read(max_records=10)
    assert batch == _records(5) + _records(5, start=6)
    journal.commit(pos, len(batch))
    assert _read_all(journal, max_records=8) == _records(19, start=11)
    assert journal.pending == 19 and journal.corrupt_regions == 1 and len(_corrupt_lines(caplog)) == 1


def test_a_read_that_meets_only_corruption_at_the_end_returns_nothing_and_pending_is_set_right(tmp_path):
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(3))
    [segment] = journal.path.glob("*.seg")
    _spoil(segment, _offsets(segment)[2], "huge_length")
    batch, pos = journal.read()
    assert batch == _records(2) and journal.pending == 2
    journal.commit(pos, 2)
    assert journal.read()[0] == [] and journal.pending == 0


# --- two corrupt records close together: the good records between them are kept, whatever spoiled either


@pytest.mark.parametrize("second", sorted(_SPOILERS))
@pytest.mark.parametrize("first", sorted(_SPOILERS))
@pytest.mark.parametrize("gap", [1, 2, 3])
def test_the_good_records_between_two_corrupt_records_are_kept(tmp_path, caplog, gap, first, second):
    """Fewer good records between two corrupt ones than the search's header chain is long
    (a second bad length field ends the chain early): kept all the same, two regions."""
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(50))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    offsets = _offsets(segment)
    one, two = offsets[20], offsets[21 + gap]
    size_one = _spoil(segment, one, first)
    size_two = _spoil(segment, two, second)
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    expected = _records(20) + _records(gap, start=21) + _records(50 - 22 - gap, start=22 + gap)
    assert adopted.pending == 48
    assert _corrupt_lines(caplog) == [
        f"journal={journal.path} event=journal_corrupt segment=1 offset={one} skipped_bytes={size_one} action=skipped",
        f"journal={journal.path} event=journal_corrupt segment=1 offset={two} skipped_bytes={size_two} action=skipped"]
    assert "torn_tail" not in caplog.text
    assert _read_all(adopted, max_records=7) == expected
    assert (adopted.corrupt_regions, adopted.corrupt_bytes) == (2, size_one + size_two)
    adopted.rewind()
    assert _read_all(adopted) == expected and adopted.corrupt_regions == 2


@pytest.mark.parametrize("second", ["huge_length", "length_off"])
@pytest.mark.parametrize("gap", [1, 3])
def test_two_corrupt_records_found_by_reads_keep_the_records_between(tmp_path, caplog, gap, second):
    """The same corruption after the open: read() keeps the records between, and ``pending``
    is set right when the reads reach the end."""
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(30))
    [segment] = journal.path.glob("*.seg")
    offsets = _offsets(segment)
    _spoil(segment, offsets[10], "huge_length")
    _spoil(segment, offsets[11 + gap], second)
    expected = _records(10) + _records(gap, start=11) + _records(30 - 12 - gap, start=12 + gap)
    assert _read_all(journal, max_records=4) == expected
    assert journal.pending == 28 and journal.corrupt_regions == 2 and len(_corrupt_lines(caplog)) == 2


@pytest.mark.parametrize("tail", ["partial_header", "partial_record"])
@pytest.mark.parametrize("how", sorted(_SPOILERS))
@pytest.mark.parametrize("gap", [1, 2, 3])
def test_the_good_records_between_a_corrupt_record_and_a_torn_tail_are_kept(tmp_path, caplog, gap, how, tail):
    """A corrupt record, a few good ones, then a torn tail at the end of the last segment: the
    good ones are kept, the tail alone is cut."""
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(21 + gap))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    at = _offsets(segment)[20]
    size = _spoil(segment, at, how)
    length = segment.stat().st_size
    with open(segment, "ab") as f:        # then a crash in the middle of an append
        f.write(encode_record(b"k", b"v" * 100)[:6 if tail == "partial_header" else 50])
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert "event=torn_tail segment=1 offset=%d action=truncate" % length in caplog.text
    assert segment.stat().st_size == length
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 offset={at} "
                                      f"skipped_bytes={size} action=skipped"]
    assert adopted.pending == 20 + gap and adopted.corrupt_regions == 1
    assert _read_all(adopted) == _records(20) + _records(gap, start=21)


def _dense_small(seed: int, size: int) -> bytes:
    """Garbage dense in small numbers: most record lengths read from it fit in the segment."""
    return bytes(random.Random(seed).choices([0, 0, 0, 1, 2, 3], k=size))


def _half_zeros(seed: int, size: int) -> bytes:
    """Garbage half zeros, half random: lengths fit often, and chains break often."""
    rng = random.Random(seed)
    return bytes(rng.randrange(1, 256) if rng.random() < 0.5 else 0 for _ in range(size))


@pytest.mark.parametrize("garbage", [
    pytest.param(lambda: random.Random(1).randbytes(1 << 20), id="random-seed1-1MiB"),
    pytest.param(lambda: random.Random(2).randbytes(2 << 20), id="random-seed2-2MiB"),
    pytest.param(lambda: random.Random(3).randbytes(3 << 20), id="random-seed3-3MiB"),
    pytest.param(lambda: random.Random(4).randbytes(1 << 20)[:-3], id="random-seed4-1MiB-3"),
    pytest.param(lambda: _dense_small(5, 256 << 10), id="dense-small-seed5-256KiB"),
    pytest.param(lambda: _half_zeros(6, 256 << 10), id="half-zeros-seed6-256KiB"),
])
def test_garbage_between_good_records_yields_no_phantom_record(tmp_path, caplog, garbage):
    """Garbage between good records (and a good segment after): exactly the good records come
    back, the garbage one corrupt region -- no record made up of garbage."""
    journal = _new(tmp_path)
    _orphaned(journal)
    data = garbage()
    _write_segments(journal, _encoded(10) + data + _encoded(10, start=10), _encoded(10, start=20))
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 30, segment_bytes=4096)
    assert _corrupt_lines(caplog) == [f"journal={journal.path} event=journal_corrupt segment=1 "
                                      f"offset={len(_encoded(10))} skipped_bytes={len(data)} action=skipped"]
    assert adopted.pending == 30 and adopted.corrupt_regions == 1
    assert _read_all(adopted) == _records(30)


@pytest.mark.parametrize("how", ["value_byte", "crc_byte"])
def test_the_record_right_after_a_long_corrupt_record_with_sound_lengths_is_kept(tmp_path, caplog, how):
    """A corrupt record longer than the search's window whose lengths are sound, one good
    record, then a second bad length field: the good record, right after the first (where its
    lengths say), is kept though no chain of headers runs on from it."""
    journal = _new(tmp_path, segment_bytes=1 << 20)
    big = (b"big", b"x" * (300 << 10))
    journal.append(_records(5) + [big] + _records(10, start=5))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    offsets = _offsets(segment)
    size_one = _spoil(segment, offsets[5], how)
    size_two = _spoil(segment, offsets[7], "huge_length")
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert _corrupt_lines(caplog) == _region_lines(journal, (offsets[5], size_one), (offsets[7], size_two))
    assert adopted.pending == 14
    assert _read_all(adopted) == _records(6) + _records(8, start=7)


def test_a_search_cut_short_in_its_first_window_keeps_the_records_before_a_second_corruption(tmp_path, caplog):
    """The search after a corrupt record whose bytes hold many candidates is cut short by each
    recovery slice's deadline and resumed: the good record between it and a second bad length
    field (within the first window, where the relaxed rule holds) is kept all the same."""
    rng = random.Random(9)
    binary = bytes(0 if rng.random() < 0.1 else rng.randrange(1, 256) for _ in range(200 << 10))
    journal = _new(tmp_path, segment_bytes=1 << 20)
    journal.append(_records(5) + [(b"bin", binary)] + _records(12, start=5))
    _orphaned(journal)
    [segment] = journal.path.glob("*.seg")
    offsets = _offsets(segment)
    size_one = _spoil(segment, offsets[5], "huge_length")
    size_two = _spoil(segment, offsets[7], "huge_length")
    [adopted] = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20, recover=False)
    slices = 1
    while not adopted.recover_some(max_records=1000, deadline=0.0):
        slices += 1
    assert slices >= 3, "the search not cut short"
    assert _corrupt_lines(caplog) == _region_lines(journal, (offsets[5], size_one), (offsets[7], size_two))
    assert adopted.pending == 16
    assert _read_all(adopted) == _records(6) + _records(10, start=7)


# --- an append failing part-way: what it says is written is on disk and counted, nothing else


def _faults(kind: str):  # noqa: ANN202
    """(name in os, replacement) making one append fail part-way, as a full disk, an I/O error
    or too many open files would; ``short_writes``: os.write writing a few bytes at a time."""
    real_write, real_open = os.write, os.open
    calls = [0]

    def write(fd, data):  # noqa: ANN001, ANN202
        calls[0] += 1
        if kind == "short_writes":
            return real_write(fd, bytes(data[:5]))
        if kind == "no_space" and calls[0] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        if kind == "torn_write" and calls[0] == 2:
            return real_write(fd, bytes(data[:len(data) // 2]))
        if kind == "torn_write" and calls[0] == 3:
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    def fsync(fd):  # noqa: ANN001, ANN202
        raise OSError(errno.EIO, "Input/output error")

    def open_(path, *args, **kw):  # noqa: ANN001, ANN202
        if str(path).endswith(".seg"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kw)

    return {"short_writes": ("write", write), "no_space": ("write", write), "torn_write": ("write", write),
            "fsync": ("fsync", fsync), "too_many_files": ("open", open_)}[kind]


@pytest.mark.parametrize("kind, kept, rotating", [
    ("short_writes", 3, False), ("no_space", 1, False), ("no_space", 1, True), ("torn_write", 1, False),
    ("torn_write", 1, True), ("fsync", 0, False), ("fsync", 0, True), ("too_many_files", 1, True)])
def test_an_append_failing_part_way_counts_exactly_what_is_on_disk(tmp_path, monkeypatch, kind, kept, rotating):
    """A batch of 3 after 2 records: a write failing on its 2nd record (``no_space``), one
    writing half of it then failing (``torn_write``: the half is cut), an fsync failing (its
    records removed: they may not be on disk), opening the next segment failing after its 1st
    record (``too_many_files``). AppendFailed says how many of the batch are kept; ``pending``
    counts exactly those, reads and a reopened journal find exactly those, and the journal
    takes records after it. os.write writing a few bytes at a time (``short_writes``) loses nothing.
    ``rotating``: the batch's 2nd record starts a new segment (the 1st was fsync-ed as its
    segment was left); else all go to one segment."""
    from producer import journal as journal_module
    from producer.journal import AppendFailed

    record_bytes = len(encode_record(*_records(1, start=2)[0]))   # 33; the first two: 64 together
    journal = _new(tmp_path, segment_bytes=3 * record_bytes - 1 if rotating else 4096)
    assert journal.append(_records(2)) == 2
    name, fault = _faults(kind)
    monkeypatch.setattr(journal_module.os, name, fault)
    try:
        written = journal.append(_records(3, start=2))
    except AppendFailed as err:
        written = err.written
    finally:
        monkeypatch.undo()
    assert written == kept
    assert journal.pending == 2 + kept
    assert journal.append(_records(2, start=5)) == 2
    expected = _records(2) + _records(3, start=2)[:kept] + _records(2, start=5)
    assert journal.pending == len(expected)
    _orphaned(journal)
    reopened = Journal(journal.path, os.open(journal.path / "LOCK", os.O_RDWR), max_bytes=1 << 20,
                       segment_bytes=journal.segment_bytes)
    assert reopened.pending == len(expected) and reopened.corrupt_regions == 0
    assert _read_all(reopened) == expected
    assert _read_all(journal) == expected and journal.corrupt_regions == 0


def test_a_removal_cut_short_by_a_file_that_cannot_be_removed_keeps_the_lock(tmp_path, monkeypatch):
    """close() removes a delivered journal's other files first, its LOCK last, then the
    directory: a removal cut short leaves a journal an adopter finds free and removes, never
    a directory without LOCK (which once held back its writer's later journals for ever)."""
    journal = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096,
                             destination=Destination("lineage", "127.0.0.1:9092"))
    journal.append(_records(2))
    batch, pos = journal.read()
    journal.commit(pos, len(batch))
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).endswith("DESTINATION"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)
    monkeypatch.setattr(os, "unlink", unlink)
    journal.close()
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert (journal.path / "LOCK").exists(), sorted(p.name for p in journal.path.iterdir())
    assert adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096) == [], "all sent: nothing taken"
    assert not journal.path.exists(), "removed by the adopter"
