"""Reading a journal's segments back (:mod:`producer.journal`): records in append order,
corrupt regions found, skipped and remembered.

:class:`SegmentReader` is the read side of one :class:`~producer.journal.Journal`: the
journal's recovery scan and its reads both go through :meth:`SegmentReader.scan`. A bad
record that is not a torn tail starts a search for where records resume
(:mod:`producer.journal_resync`); the bytes between are a corrupt region, logged (ERROR
``event=journal_corrupt``, on the ``producer.journal`` logger), counted
(:attr:`SegmentReader.corrupt_regions`, :attr:`SegmentReader.corrupt_bytes`) and
remembered, so a later scan from before it skips exactly the same bytes without a search.
What the journal makes of a region (a torn tail cut, ``pending`` set right) is
:class:`~producer.journal.Journal`'s.

Not thread-safe: it belongs to its journal's owner thread.
"""

from __future__ import annotations

import logging
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from producer.journal_resync import HEADER as _HEADER
from producer.journal_resync import WINDOW, Resume, crc_matches, find_resync

if TYPE_CHECKING:
    from producer.journal import Record

# The journal's logger (its events, and producer.log_gate's fork gate), not this module's name.
log = logging.getLogger("producer.journal")

#: A recovery scan slice with a deadline reads the clock once per this many records.
DEADLINE_EVERY = 32


def segment_name(number: int) -> str:
    """The file name of a journal's segment ``number``."""
    return f"{number:08d}.seg"


class SegmentReader:
    """The records in the segments of the journal at ``path``, and its corrupt regions.

    ``sizes`` (segment -> bytes) is the journal's own dict, kept up to date by the journal
    (appends, a torn tail cut, segments removed): read here, never changed."""

    def __init__(self, path: Path, sizes: dict[int, int]) -> None:
        self.path = path
        self._sizes = sizes
        self._file: tuple[int, object] | None = None   # (segment, its open file)
        #: Corrupt regions skipped, and their bytes (found by the recovery scan or a read).
        self.corrupt_regions = 0
        self.corrupt_bytes = 0
        # The corrupt regions found: (segment, offset of the bad record) -> where records
        # resume in that segment (its size: none after it). Every open's recovery scan finds
        # them again (nothing on disk changes), so the scan and every later read skip the same.
        self._skips: dict[tuple[int, int], int] = {}
        # A resynchronisation search cut short by a slice's budget: (segment, bad offset, next
        # candidate, bytes CRC-checked past a window, bytes searched).
        self._search: Resume | None = None

    @property
    def searching(self) -> bool:
        """A resynchronisation search was cut short: the next scan from there goes on with it."""
        return self._search is not None

    def scan(self, pos: tuple[int, int], max_records: int, max_bytes: int, deadline: float | None = None,
             recovering: bool = False) -> tuple[list[Record], tuple[int, int], tuple[int, int] | None]:
        """Records from ``pos``: (records, next position, torn position or None).

        A bad record (a CRC-32 mismatch, lengths past its segment's end, a partial header)
        starts a search for the next record in its segment (:meth:`_resync`); the bytes
        between are a corrupt region, skipped (logged, counted, remembered in ``_skips``),
        and the scan goes on from there. Found nowhere in its segment: the rest of the
        segment is the region -- except in the recovery scan (``recovering``) of the last
        segment, where it is a torn tail (a crash mid-append), returned as the torn position
        for the caller to cut. A search cut short by the budget (``max_bytes``, shared with
        the records read) or the deadline is resumed by the next call from the same
        position (``_search``)."""
        out: list[Record] = []
        seg, off = pos
        used = 0
        while len(out) < max_records and used < max_bytes:
            if deadline is not None and out and len(out) % DEADLINE_EVERY == 0 and time.monotonic() >= deadline:
                break
            if seg not in self._sizes:
                later = [n for n in self._sizes if n > seg]
                if not later:
                    break
                seg, off = min(later), 0
            if off >= self._sizes[seg]:
                later = [n for n in self._sizes if n > seg]
                if not later:
                    break
                seg, off = min(later), 0
                continue
            resume = self._skips.get((seg, off)) if self._skips else None   # none: no tuple per record
            if resume is not None:
                off = resume
                continue
            record = self._record_at(seg, off)
            if record is not None:
                out.append(record[0])
                off += record[1]
                used += record[1] - _HEADER.size
                continue
            found, searched = self._resync(seg, off, max(0, max_bytes - used), deadline)
            used += searched
            if found is None:   # cut short: resumed by the next call
                return out, (seg, off), None
            end = self._sizes[seg]
            if found == end and recovering and not any(n > seg for n in self._sizes):
                return out, (seg, off), (seg, off)
            self._skips[(seg, off)] = found
            self.corrupt_regions += 1
            self.corrupt_bytes += found - off
            log.error("journal=%s event=journal_corrupt segment=%d offset=%d skipped_bytes=%d action=skipped",
                      self.path, seg, off, found - off)
            off = found
            if deadline is not None and time.monotonic() >= deadline:
                break
        return out, (seg, off), None

    def _record_at(self, seg: int, off: int) -> tuple[Record, int] | None:
        """The record at ``off`` in ``seg`` and its size, or None when it is bad (a partial
        header, lengths past the segment's end, a CRC-32 mismatch): never a read of more
        than what is left of the segment, nor, for a long record, a body in memory before
        its CRC-32 matches."""
        end = self._sizes[seg]
        f = self._handle(seg)
        f.seek(off)
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        crc, value_len, key_field = _HEADER.unpack(header)
        key_len = key_field - 1 if key_field else 0
        size = _HEADER.size + key_len + value_len
        if size > end - off:
            return None
        if size - _HEADER.size > WINDOW and not crc_matches(f.fileno(), off, size, crc):
            return None
        body = f.read(key_len + value_len)
        if len(body) < key_len + value_len or zlib.crc32(header[4:] + body) != crc:
            return None
        return (body[:key_len] if key_field else None, body[key_len:]), size

    def _resync(self, seg: int, bad: int, budget: int, deadline: float | None) -> tuple[int | None, int]:
        """Where records resume after the bad record at ``bad`` in ``seg`` (its size when
        nowhere), and the bytes searched; None when ``budget`` or ``deadline`` cut the
        search short: ``_search`` keeps where to go on (:func:`producer.journal_resync.find_resync`)."""
        resume = self._search if self._search is not None and self._search[:2] == (seg, bad) else None
        found, searched, self._search = find_resync(self._handle(seg).fileno(), seg, bad, self._sizes[seg],
                                                    budget, deadline, resume)
        return found, searched

    def _handle(self, seg: int):
        if self._file is None or self._file[0] != seg:
            self.close()
            self._file = (seg, open(self.path / segment_name(seg), "rb"))
        return self._file[1]

    def close(self, seg: int | None = None) -> None:
        """Close the open segment file (only if it is segment ``seg``, when given); the next
        scan opens what it needs."""
        if self._file is not None and (seg is None or self._file[0] == seg):
            self._file[1].close()
            self._file = None

    def forget_before(self, seg: int) -> None:
        """The segments before ``seg`` are gone: their corrupt regions are forgotten."""
        self._skips = {at: resume for at, resume in self._skips.items() if at[0] >= seg}

    def reset(self) -> None:
        """Every segment is gone: the file closed, the corrupt regions and a search cut short
        forgotten (the counts stay)."""
        self.close()
        self._skips.clear()
        self._search = None
