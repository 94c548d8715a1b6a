"""Where records resume after a corrupt one in a journal segment (:mod:`producer.journal`).

A bad record (a CRC-32 mismatch, lengths past its segment's end, a partial header) that is
not a torn tail starts :func:`find_resync`: the first offset after it, in the same segment,
whose record fits in what is left of the segment and whose CRC-32 matches, and which is

* within :data:`WINDOW` bytes of the bad record (the relaxed rule: the record headers after
  it may break off at once, at a second bad length field or a torn tail);
* or the natural next record: where the bad record ends if its own lengths are sound (only
  its CRC-32 or a byte of its body spoiled), whatever follows it (its CRC-32 checked in
  full, however long the record, as a read would). It is a candidate in offset order like
  the others, not tried first: a length spoiled upwards that still fits can land exactly on
  a later record, and taking it first would pass over the good records before it;
* or, further on, one whose record headers chain -- each length fitting in what is left of
  the segment -- to the segment's end exactly or through :data:`RESYNC_CHAIN` records (the
  strict rule).

So the good records between two corrupt ones close together, or between a corrupt record
and a torn tail, are kept (the reader meets the second bad record and searches again: two
regions), and those before a second corruption further on, as the strict rule needs no
chain to the segment's end. Still skipped with a region: fewer than :data:`RESYNC_CHAIN`
good records starting more than :data:`WINDOW` bytes after the bad offset and not at its
natural next record (after a long bad record whose lengths are spoiled or which another
bad record follows, or more than :data:`WINDOW` of zeros), before a second bad length field
or a torn tail.

A garbage "record" is not sent on as an event. In random bytes a length fits with odds of
about S / 2^32 (S the segment's size: 2^-8 for 16 MiB, 2^-6 for 64 MiB), and a CRC-32
matches with 2^-32: the strict rule (four fitting headers, then the CRC-32) takes a random
offset for a record with odds of 2^-64 (2^-56), some 2^-40 (2^-30) over a whole segment of
garbage; the relaxed rule (one fitting header, the CRC-32) 2^-40 (2^-38) an offset, below
2^-22 (2^-20) over its window -- one corrupt region of random garbage in four million (one
in a million), fewer in fact, as a long body is checked only within the allowance below --;
the natural next record 2^-32 a bad record. Where every length fits (data dense in small
numbers) the chain rules nothing out, and both rules rest on the CRC-32 alone: 2^-32 an
offset, as the strict rule always did there. These odds are for random bytes: a value that
itself carries bytes framed as a journal record, with their CRC-32, is taken for one when
the search reaches into its body (JSON values cannot: no length in them fits a segment of
64 MiB or less, as JSON text has no byte below 0x09 in it).

Bounded: the segment is read a window at a time (:data:`WINDOW`, with ``os.pread``, never
whole); a candidate whose value length cannot fit (its top byte, found by a regular
expression, not a loop of Python over every byte) or, past the first window, whose chain
breaks is rejected without its body's CRC-32 (computed in chunks when the record reaches
past the window, for at most :data:`_RESYNC_CRC_ALLOWANCE` times the bytes searched: past
that, such a long candidate is rejected unchecked, so the work stays linear); a run of
zeros (a zeroed page or sector, the commonest corruption) is passed at once. A search stops
when its byte budget (at least one window) is spent or its deadline passes -- checked after
each window and every :data:`_DEADLINE_EVERY_CANDIDATES` candidates -- and returns the state
to resume it from. Measured: 64 MiB of zeros in 0.2 s, of random bytes in 1.1 s (some
55 MiB/s); data dense in small numbers (random bytes 0-3) 0.3 MiB/s in a 64 MiB segment,
2 MiB/s in a 16 MiB one, still linear and in short slices; its first window, where the
relaxed rule checks the CRC-32 of every record that fits, 0.5-1.6 s. The worst found, a
fitting 64-128 KiB record at every other byte, costs some 2-3 s a window (in slices, each
over its deadline by up to ~50 ms: the clock is read every
:data:`_DEADLINE_EVERY_CANDIDATES` candidates).
"""

from __future__ import annotations

import functools
import os
import re
import struct
import time
import zlib

#: The journal's record header: crc32(u32) | value length(u32) | key length + 1 (u16, 0 = no
#: key), then key and value; the CRC-32 covers everything after its own field.
HEADER = struct.Struct(">IIH")
#: A search cut short: (segment, offset of the bad record, next candidate, bytes CRC-checked
#: past a window, bytes searched so far), for the next call with the same bad record.
Resume = tuple[int, int, int, int, int]

#: A resynchronisation search reads its segment in windows of this many bytes (and checks
#: its budget and deadline after each); a record's CRC-32 is checked in chunks of this size.
WINDOW = 256 << 10
#: A resynchronisation point past the first window (the strict rule): the record headers
#: from it chain, each length fitting in what is left of the segment, to the segment's end
#: exactly or through this many records.
RESYNC_CHAIN = 4
#: A resynchronisation search with a deadline reads the clock once per this many candidates.
_DEADLINE_EVERY_CANDIDATES = 4096
#: A resynchronisation search checks the CRC-32 of records reaching past its window (bodies
#: read from the disk) for at most this many times the bytes it searched (plus a window).
_RESYNC_CRC_ALLOWANCE = 8
_ZEROS = bytes(HEADER.size)
_NONZERO = re.compile(b"[^\\x00]")


def crc_matches(fd: int, off: int, size: int, crc: int) -> bool:
    """Whether the record of ``size`` bytes at ``off`` has CRC-32 ``crc`` (read in chunks)."""
    value = 0
    at, end = off + 4, off + size
    while at < end:
        chunk = os.pread(fd, min(WINDOW, end - at), at)
        if not chunk:
            return False
        value = zlib.crc32(chunk, value)
        at += len(chunk)
    return value == crc


def _chain_fits(fd: int, at: int, end: int, buf: bytes = b"", base: int = 0) -> bool:
    """Whether record headers chain from ``at`` (after a first record that fits) to ``end``
    exactly, or through :data:`RESYNC_CHAIN` records in all, each length fitting. A header
    within ``buf`` (the segment's bytes from ``base``) is taken from it, others read."""
    for _ in range(RESYNC_CHAIN - 1):
        if at == end:
            return True
        if at + HEADER.size > end:
            return False
        if at + HEADER.size <= base + len(buf):
            _, value_len, key_field = HEADER.unpack_from(buf, at - base)
        else:
            header = os.pread(fd, HEADER.size, at)
            if len(header) < HEADER.size:
                return False
            _, value_len, key_field = HEADER.unpack(header)
        at += HEADER.size + (key_field - 1 if key_field else 0) + value_len
        if at > end:
            return False
    return True


def _natural_at(fd: int, bad: int) -> int:
    """Where the record after the bad one at ``bad`` starts if the bad record's lengths are
    sound (-1 when its header cannot be read): a candidate exempt from the chain, checked in
    offset order like any other, so that a length spoiled upwards (the offset then landing on a
    later record) does not pass over the good records before it."""
    header = os.pread(fd, HEADER.size, bad)
    if len(header) < HEADER.size:
        return -1
    _, value_len, key_field = HEADER.unpack(header)
    return bad + HEADER.size + (key_field - 1 if key_field else 0) + value_len


@functools.lru_cache(maxsize=None)
def _top_byte_class(top: int) -> re.Pattern[bytes]:
    """Bytes 0 .. ``top``: where a value length's top byte may be."""
    return re.compile(b"[\\x00-\\x%02x]" % top)


def find_resync(fd: int, seg: int, bad: int, end: int, budget: int, deadline: float | None,
                resume: Resume | None) -> tuple[int | None, int, Resume | None]:
    """Where records resume after the bad record at ``bad`` in segment ``seg`` (open as
    ``fd``, ``end`` bytes long), the bytes searched, and the state to resume from: the first
    offset as the module docstring says (in the first window or the natural next record,
    else by the strict rule), or ``end`` when there is none (state None); None
    when ``budget`` bytes (at least one window) were searched, or ``deadline``
    (``time.monotonic()``) passed, first -- the next call with the state returned goes on
    where this one stopped."""
    start, spent, before = bad + 1, 0, 0   # spent: bytes CRC-checked past a window; before: searched earlier
    if resume is not None:
        _, _, start, spent, before = resume
    natural = _natural_at(fd, bad)
    relaxed_end = bad + 1 + WINDOW   # candidates before it: the relaxed rule
    searched = 0
    candidates = 0
    at = start
    while at + HEADER.size <= end:
        window_end = min(end - HEADER.size + 1, at + WINDOW)   # candidates in [at, window_end)
        buf = os.pread(fd, window_end - at + HEADER.size - 1, at)
        if len(buf) < window_end - at + HEADER.size - 1:   # shorter than it was: no record further on
            window_end = at + len(buf) - HEADER.size + 1
            if window_end <= at:
                break
        view = memoryview(buf)
        # No value length can exceed what is left after ``at``: its top byte at most this.
        top = _top_byte_class(min(255, max(0, end - at - HEADER.size) >> 24))
        i = 0
        while True:
            m = top.search(buf, i + 4, window_end - at + 4)
            if m is None:
                break
            i = m.start() - 4
            if buf[i:i + HEADER.size] == _ZEROS:
                # No record's header is all zeros (its CRC-32 would be 0): past the run of
                # zeros at once (a zeroed page or sector is the commonest corruption).
                nonzero = _NONZERO.search(buf, i + HEADER.size)
                i = (nonzero.start() if nonzero else len(buf)) - HEADER.size + 1
                continue
            candidates += 1
            if candidates % _DEADLINE_EVERY_CANDIDATES == 0 and deadline is not None \
                    and time.monotonic() >= deadline:
                return None, searched + i, (seg, bad, at + i, spent, before + searched + i)
            candidate = at + i
            crc, value_len, key_field = HEADER.unpack_from(buf, i)
            size = HEADER.size + (key_field - 1 if key_field else 0) + value_len
            # In the first window the relaxed rule (no chain: it may break at a second bad record
            # or a torn tail), then the strict one (a whole chain); the CRC-32 in both.
            if size <= end - candidate and (candidate < relaxed_end or candidate == natural or
                                            _chain_fits(fd, candidate + size, end, buf, at)):
                if candidate == natural and i + size > len(buf):
                    found = crc_matches(fd, candidate, size, crc)   # in full, however long, as a read would
                elif i + size <= len(buf):   # in the window: no read
                    found = zlib.crc32(view[i + 4:i + size]) == crc
                elif spent + size > _RESYNC_CRC_ALLOWANCE * (before + searched + i + WINDOW):
                    found = False   # data dense in plausible lengths: no more long bodies checked
                else:
                    spent += size
                    found = crc_matches(fd, candidate, size, crc)
                if found:
                    return candidate, searched + i, None
            i += 1
        searched += window_end - at
        at = window_end
        if at + HEADER.size <= end and (searched >= budget or
                                         (deadline is not None and time.monotonic() >= deadline)):
            return None, searched, (seg, bad, at, spent, before + searched)
    return end, searched, None
