"""The on-disk journal: where events wait while Kafka cannot take them.

Layout: ``<journal_dir>/<id>/`` per journal, ``<id>`` =
``<UTC yyyymmddTHHMMSSffffff>-<pid>-<token>`` so names sort by creation time; the journals
one producer makes (its own, and one a reclaim's wait puts aside) share ``<pid>-<token>``
(:class:`~producer.journal_dir.JournalNames`), and adopters take them in order. Inside:
``LOCK`` (``flock``-ed for the owner's lifetime), segment files ``00000001.seg``, ... and
``CURSOR`` (``"<segment> <offset>"``: everything before it has been delivered).

Guarantees:

* :meth:`Journal.append` writes and ``fsync``\\ s before it returns: an appended record
  survives ``kill -9`` and power loss (a torn last record is detected by its CRC-32 and
  dropped when the journal is next opened, with a warning: ``event=torn_tail``).
* Records come back from :meth:`Journal.read` in append order, across segments.
* Corruption on disk (bit rot, a bad or zeroed sector: a record whose CRC-32 does not
  match, or whose lengths run past its segment's end) costs the corrupt region only, never
  the records after it nor a later segment. A torn tail is only ever the end of the last
  segment (appends are sequential); any other bad record starts a search, in its segment,
  for where records resume (:mod:`producer.journal_scan`, which reads the segments back;
  :mod:`producer.journal_resync`: what counts as a record again, how the search is
  bounded). The bytes between are skipped (ERROR ``event=journal_corrupt segment=N
  offset=O skipped_bytes=B action=skipped``; counted in :attr:`Journal.corrupt_regions`
  and :attr:`Journal.corrupt_bytes`; the producer drops them as ``journal_corrupt``, one
  per region, the number of records in it being unknown).
  Records resuming nowhere: the rest of the segment is the region, and the scan goes on in
  the next segment; only in the last segment, at open, is it a torn tail, cut. Nothing on
  disk changes for a corrupt region: the recovery scan of every open finds it again, and
  reads skip exactly what it skipped; a region a read meets that the scan did not
  (corruption since the open) is skipped the same way, and ``pending``, which counted its
  records, is set right when the reads reach the end. Nothing is lost beyond the corrupt
  bytes: the good records between two corrupt regions, however close, or between a region
  and a torn tail, are kept (two regions; a region and the tail cut) -- but for one rare
  case: fewer than 4 good records more than 256 KiB past the bad offset (after a long bad
  record whose lengths are spoiled or which another bad record follows, or more than 256 KiB
  of zeros), before a second bad
  length field or a torn tail, are skipped with the region. Garbage taken for a
  record: below one corrupt region of random bytes in a million (:mod:`producer.journal_resync`).
* :meth:`Journal.commit` persists the read position atomically (write, fsync, rename);
  after a crash, replay restarts at the last commit, so a record can be delivered twice
  but never skipped (at-least-once; the relay deduplicates).
* Size cap: :meth:`append` refuses records that would take the journal's segments past
  ``max_bytes``; the caller counts and logs them (reason ``journal_full``).
* A journal whose ``LOCK`` is free belongs to a dead process: :mod:`producer.orphans` takes
  it over. Two live processes never share a journal. ``DESTINATION`` (JSON: ``topic``,
  ``bootstrap_servers``; absent in journals written before it existed) says where its
  records go, so a producer takes over only journals written for its own topic and cluster.
* A journal is made under a hidden name (``.<id>``): its ``LOCK`` appears already locked
  (locked as ``LOCK.new``, then renamed) before anything else is written, then
  ``DESTINATION``, then the rename to ``<id>``. An adopter opens ``LOCK`` without creating
  it, so a journal being made, which has no ``LOCK`` yet, is never touched (and an older
  version's adopter, which creates ``LOCK``, finds it held as early as can be).
* Opening a journal counts its records (the recovery scan, which also cuts a torn tail and
  finds the corrupt regions).
  ``Journal(..., recover=False)`` defers that scan to :meth:`Journal.recover_some`, in
  slices of bounded size, so a thread with other work (the producer's sender adopting a
  large journal) does a slice per turn; until it is complete, :attr:`Journal.pending_at_least`
  is the records counted so far, and at least 1.

Not thread-safe: one thread (the producer's sender) owns a Journal. ``LOCK`` taken by others,
``DESTINATION`` and the directory check: :mod:`producer.journal_dir`. Reading the segments
back (records, corrupt regions): :mod:`producer.journal_scan`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import struct
import zlib
from pathlib import Path

from producer.errors import JournalError
from producer.journal_dir import (
    CURSOR,
    DESTINATION,
    LOCK,
    Destination,
    JournalNames,
    fsync_dir,
    release_lock,
    write_synced,
)
from producer.journal_resync import HEADER as _HEADER
from producer.journal_scan import SegmentReader, segment_name

log = logging.getLogger(__name__)

# Record: crc32(u32) | value length(u32) | key length + 1 (u16, 0 = no key) | key | value.
_NO_KEY = 0
_CURSOR = CURSOR
Record = tuple[bytes | None, bytes]


#: The longest key a record can hold: its length + 1 is a 16-bit field (the producer
#: refuses a longer one at emit(), as ``too_large``).
MAX_KEY_BYTES = 0xFFFF - 1


class AppendFailed(JournalError):
    """:meth:`Journal.append` failed part-way (``cause``: the OSError, or whatever it was).
    Its first ``written`` records are on disk, fsync-ed, and counted in ``pending``; none of
    the others is (a record cut short was truncated away). ``fitted``: how many of the
    records fitted under ``max_bytes`` (those after them would have been refused anyway)."""

    def __init__(self, written: int, fitted: int, cause: BaseException) -> None:
        super().__init__(f"journal append failed after {written} of {fitted} records: {cause}")
        self.written = written
        self.fitted = fitted
        self.cause = cause


def encode_record(key: bytes | None, value: bytes) -> bytes:
    if key is not None and len(key) > MAX_KEY_BYTES:
        raise ValueError(f"a key of {len(key)} bytes does not fit a journal record (at most {MAX_KEY_BYTES})")
    key_field = _NO_KEY if key is None else len(key) + 1
    body = (key or b"") + value
    crc = zlib.crc32(struct.pack(">IH", len(value), key_field) + body)
    return _HEADER.pack(crc, len(value), key_field) + body


class Journal:
    """One producer's journal directory (see the module docstring)."""

    def __init__(self, path: Path, lock_fd: int, *, max_bytes: int, segment_bytes: int,
                 recover: bool = True) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        segments = sorted(int(p.stem) for p in path.glob("*.seg"))
        self._cursor = self._load_cursor(segments)
        self._read_pos = self._cursor
        self._write_seg = segments[-1] if segments else 1
        self._sizes = {n: (path / segment_name(n)).stat().st_size for n in segments}
        # The read side: records and corrupt regions (it reads _sizes, which is never rebound).
        self._reader = SegmentReader(path, self._sizes)
        self._writer: int | None = None
        #: Records appended and not yet committed (0 until the recovery scan is complete).
        self.pending = 0
        self._corrupt_taken = 0   # corrupt_regions when take_corrupt_regions() last ran
        # Records read after the cursor (up to the read position), and whether ``pending``
        # overcounts: a read found a corrupt region the recovery scan had counted records in.
        self._read_count = 0
        self._pending_unknown = False
        # The recovery scan's progress: (position, records counted); None once complete.
        self._recovery: tuple[tuple[int, int], int] | None = (self._cursor, 0)
        if self._bytes_after(self._cursor) == 0:
            self._recovery = None   # nothing after the cursor: counted without a read
        elif recover:
            while not self.recover_some():
                pass

    def _bytes_after(self, pos: tuple[int, int]) -> int:
        seg, off = pos
        return sum(size for n, size in self._sizes.items() if n > seg) + max(0, self._sizes.get(seg, 0) - off)

    # --- opening -----------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, *, max_bytes: int, segment_bytes: int,
               destination: Destination | None = None, names: JournalNames | None = None) -> Journal:
        """A new, empty journal under ``root``, locked by this process (``destination``:
        recorded for adopters; None only in tools and tests). ``names``: its writer's (the
        journals a producer makes, taken over in order by adopters); None: a writer of its own."""
        fd = tmp = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            name = (names or JournalNames()).next()
            # Made under a hidden name, its LOCK appearing locked first: see the module docstring.
            tmp = root / f".{name}"
            tmp.mkdir()
            fd = os.open(tmp / (LOCK + ".new"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # nobody else knows this name
            os.rename(tmp / (LOCK + ".new"), tmp / LOCK)
            if destination is not None:
                write_synced(tmp / DESTINATION, json.dumps(
                    {"topic": destination.topic, "bootstrap_servers": destination.bootstrap_servers}))
            final = root / name
            tmp.rename(final)
            fsync_dir(root)
        except OSError as err:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)   # half made: no adopter would ever take it
            if fd is not None:
                os.close(fd)
            raise JournalError(f"cannot create a journal under {root}: {err}; set journal_dir to a "
                               "writable directory (or $LINEAGE_RELAY_JOURNAL_DIR)") from err
        return cls(final, fd, max_bytes=max_bytes, segment_bytes=segment_bytes)

    def _load_cursor(self, segments: list[int]) -> tuple[int, int]:
        try:
            seg, off = (self.path / _CURSOR).read_text().split()
            return int(seg), int(off)
        except (OSError, ValueError):
            return (segments[0] if segments else 1), 0

    @property
    def recovered(self) -> bool:
        """The recovery scan is complete: ``pending`` is known, the journal may be used."""
        return self._recovery is None

    def recover_some(self, max_records: int = 10_000, max_bytes: int = 64 << 20,
                     deadline: float | None = None) -> bool:
        """Continue the recovery scan by at most ``max_records`` records or about
        ``max_bytes`` (records read, and bytes searched for a resynchronisation point after a
        corrupt record), or until ``time.monotonic()`` reaches ``deadline`` (checked every
        :data:`~producer.journal_scan.DEADLINE_EVERY` records, at least one record read, and after every
        :data:`~producer.journal_resync.WINDOW` bytes searched): count the records after the cursor, skip corrupt
        regions (logged, counted: :attr:`corrupt_regions`), cut a torn tail (crash
        mid-append: the end of the last segment). True once it is complete. Until then the
        journal may only be closed (which keeps it on disk, whatever it holds). Raises
        OSError when a segment cannot be read."""
        if self._recovery is None:
            return True
        pos, count = self._recovery
        batch, pos, torn = self._scan(pos, max_records, max_bytes, deadline, recovering=True)
        count += len(batch)
        if torn is not None:
            seg, off = torn   # always in the last segment
            log.warning("journal=%s event=torn_tail segment=%d offset=%d action=truncate",
                        self.path, seg, off)
            with open(self.path / segment_name(seg), "r+b") as f:
                f.truncate(off)
                os.fsync(f.fileno())
            self._sizes[seg] = off
            self._write_seg = seg
        elif self._reader.searching or self._bytes_after(pos) > 0:
            self._recovery = (pos, count)   # more to scan
            return False
        # An adopted journal waiting for its turn holds its LOCK only, not a segment too.
        self._reader.close()
        # The count before the scan ends: pending_at_least, read from other threads, never sees 0 between.
        self.pending = count
        self._recovery = None
        return True

    @property
    def corrupt_regions(self) -> int:
        """Corrupt regions skipped (found by the recovery scan or a read)."""
        return self._reader.corrupt_regions

    @property
    def corrupt_bytes(self) -> int:
        """The bytes of the corrupt regions skipped."""
        return self._reader.corrupt_bytes

    def take_corrupt_regions(self) -> int:
        """The corrupt regions found since the last call (for the caller's drop count)."""
        new, self._corrupt_taken = self.corrupt_regions - self._corrupt_taken, self.corrupt_regions
        return new

    @property
    def pending_at_least(self) -> int:
        """``pending`` once the recovery scan is complete; until then the records it has
        counted so far, and at least 1 (what it has not scanned yet may hold any number).
        Safe to read from another thread than the owner's."""
        recovery = self._recovery
        return self.pending if recovery is None else max(1, recovery[1])

    # --- writing -----------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return sum(self._sizes.values())

    def append(self, records: list[Record]) -> int:
        """Append and fsync; returns how many fitted under ``max_bytes`` (a prefix).

        Raises :class:`AppendFailed` if a write, an fsync or opening a segment fails part-way
        (a full disk, an I/O error, too many open files): the records it says are written
        are on disk and counted in ``pending``, the others are not (a record cut short is
        truncated away, and records whose fsync failed are too). Nothing is written if a
        record cannot be encoded (ValueError: a key over :data:`MAX_KEY_BYTES`)."""
        chunks = []
        size = self.size_bytes
        for key, value in records:
            data = encode_record(key, value)
            if size + len(data) > self.max_bytes:
                break
            chunks.append(data)
            size += len(data)
        written = 0      # whole records written
        synced = 0       # of those, the ones fsync-ed (a segment rotated away is)
        # The segment being written, and its size before this append wrote to it.
        start = (self._write_seg, self._sizes.get(self._write_seg, 0))
        syncing = False   # an fsync failed: trying it again may "succeed" with the data lost
        try:
            for data in chunks:
                if self._sizes.get(self._write_seg, 0) + len(data) > self.segment_bytes and \
                        self._sizes.get(self._write_seg, 0) > 0:
                    syncing = True
                    self._rotate()
                    syncing = False
                    synced = written
                    start = (self._write_seg, 0)
                fd = self._writer_fd()
                _write_all(fd, data)
                self._sizes[self._write_seg] = self._sizes.get(self._write_seg, 0) + len(data)
                written += 1
            if written > synced:
                fd = self._writer_fd()
                syncing = True
                os.fsync(fd)
        except Exception as err:
            written = self._salvage(written, synced, start, sync_again=not syncing)
            self.pending += written
            raise AppendFailed(written, len(chunks), err) from err
        self.pending += written
        return written

    def _salvage(self, written: int, synced: int, start: tuple[int, int], sync_again: bool) -> int:
        """After an append failed part-way: the records that stay (``written``, if those in
        the segment being written can still be fsync-ed, else ``synced``). A record cut
        short is truncated away; records that cannot be fsync-ed are too (the segment goes
        back to its size ``start`` gave) -- those of a failed fsync always (``sync_again``
        False: a second fsync may report success for pages the first one lost). A segment
        that cannot be truncated is left: its size stays what the journal counts (reads
        stop there) and appends go to a new one."""
        seg, before = start
        keep = self._sizes.get(seg, before)   # its whole records
        try:
            if written > synced and not sync_again:
                raise OSError("fsync failed")
            self._truncate(seg, keep)
            if written > synced:
                if self._writer is not None:
                    os.fsync(self._writer)
                else:
                    with open(self.path / segment_name(seg), "rb") as f:
                        os.fsync(f.fileno())
            return written
        except OSError:
            pass
        try:
            self._truncate(seg, before)
            if seg in self._sizes:
                self._sizes[seg] = before
        except OSError as err:
            log.error("journal=%s event=segment_abandoned segment=%d detail=%s", self.path, seg, err)
            if seg in self._sizes:
                self._sizes[seg] = before
            self._abandon_segment()
        return synced

    def _truncate(self, seg: int, size: int) -> None:
        """Cut segment ``seg`` to ``size`` bytes (if it exists and is longer)."""
        path = self.path / segment_name(seg)
        try:
            if os.stat(path).st_size <= size:
                return
        except FileNotFoundError:
            return
        os.truncate(path, size)

    def _abandon_segment(self) -> None:
        """Appends go to a new segment: this one holds bytes after what the journal counts."""
        fd, self._writer = self._writer, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        self._write_seg += 1

    def _writer_fd(self) -> int:
        if self._writer is None:
            path = self.path / segment_name(self._write_seg)
            new = not path.exists()
            self._writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._sizes.setdefault(self._write_seg, 0)
            if new:
                fsync_dir(self.path)
        return self._writer

    def _rotate(self) -> None:
        if self._writer is not None:
            os.fsync(self._writer)
            fd, self._writer = self._writer, None
            os.close(fd)
        self._write_seg += 1

    # --- reading -----------------------------------------------------------------

    def _scan(self, pos: tuple[int, int], max_records: int, max_bytes: int, deadline: float | None = None,
              recovering: bool = False) -> tuple[list[Record], tuple[int, int], tuple[int, int] | None]:
        """:meth:`SegmentReader.scan <producer.journal_scan.SegmentReader.scan>` from ``pos``;
        a corrupt region it finds once the recovery scan is complete leaves ``pending``
        unknown (its records were counted: how many is not known) until a read reaches the end."""
        regions = self._reader.corrupt_regions
        try:
            return self._reader.scan(pos, max_records, max_bytes, deadline, recovering)
        finally:   # even on an OSError: a region found before it is remembered, not found again
            if self._reader.corrupt_regions != regions and self._recovery is None:
                self._pending_unknown = True

    def read(self, max_records: int = 1000, max_bytes: int = 4 << 20) -> tuple[list[Record], tuple[int, int]]:
        """The next records after the read position, and the position after them.

        The read position advances; :meth:`commit` makes it durable, :meth:`rewind`
        goes back to the last commit (after a failed send). Corrupt regions are skipped, as
        by the recovery scan (those it found, and any found now: logged, counted); after one
        found now, ``pending`` is set right once a read reaches the end of the journal."""
        pos = self._read_pos
        while True:
            records, after, _ = self._scan(pos, max_records, max_bytes)
            moved, pos = after != pos, after
            # Nothing yet, but a search was cut short or a corrupt region skipped: on, not [] too early.
            if records or not (self._reader.searching or (moved and self._bytes_after(pos) > 0)):
                break
        self._read_pos = pos
        self._read_count += len(records)
        if self._pending_unknown and self._bytes_after(pos) == 0:
            self.pending = self._read_count   # what is left after the cursor: what was read
            self._pending_unknown = False
        return records, pos

    def rewind(self) -> None:
        self._read_pos = self._cursor
        self._read_count = 0

    def commit(self, pos: tuple[int, int], count: int) -> None:
        """Mark everything before ``pos`` (``count`` records) delivered, durably.

        Raises OSError when ``CURSOR`` cannot be written (a full disk, an I/O error): the
        records are delivered all the same -- ``pending``, and :meth:`rewind`, go on from
        ``pos`` -- and only the ``CURSOR`` on disk stays behind, with their segments, until
        the next commit writes a later position; a crash before then sends them again
        (at-least-once). Fully delivered, the journal is emptied as after any commit."""
        tmp = self.path / (_CURSOR + ".tmp")
        try:
            write_synced(tmp, f"{pos[0]} {pos[1]}\n")
            os.replace(tmp, self.path / _CURSOR)
        except OSError:
            tmp.unlink(missing_ok=True)
            self._delivered_before(pos, count, durable=False)
            raise
        self._delivered_before(pos, count, durable=True)

    def _delivered_before(self, pos: tuple[int, int], count: int, durable: bool) -> None:
        self._cursor = pos
        self.pending = max(0, self.pending - count)
        self._read_count = max(0, self._read_count - count)
        if self.pending == 0 and pos[0] == self._write_seg:
            self._reset()   # nothing left: no segment, no CURSOR (a stale one included)
        elif durable:   # else the CURSOR on disk still points into them
            for seg in [n for n in self._sizes if n < pos[0]]:
                self._reader.close(seg)
                (self.path / segment_name(seg)).unlink(missing_ok=True)
                del self._sizes[seg]
            self._reader.forget_before(pos[0])

    def _reset(self) -> None:
        # Fully delivered: start a fresh segment so the files do not grow forever.
        self._reader.close()
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None
        for seg in list(self._sizes):
            (self.path / segment_name(seg)).unlink(missing_ok=True)
        self._sizes.clear()
        self._reader.reset()
        self._read_count = 0
        self._pending_unknown = False
        self._write_seg += 1
        self._cursor = self._read_pos = (self._write_seg, 0)
        (self.path / _CURSOR).unlink(missing_ok=True)

    # --- closing -----------------------------------------------------------------

    def close(self) -> None:
        """Release the lock; an empty journal's directory is removed (not one whose recovery
        scan is incomplete)."""
        self._reader.close()
        if self._writer is not None:
            os.fsync(self._writer)
            os.close(self._writer)
            self._writer = None
        if self.pending == 0 and self._recovery is None:
            self._remove()
        release_lock(self._lock_fd)

    def _remove(self) -> None:
        # LOCK goes last, then the directory: a removal cut short (a crash, a file that cannot
        # be removed) leaves a journal with its LOCK, which an adopter finds free, reads as all
        # sent and removes; or a directory with nothing but LOCK gone, which holds back none of
        # its writer's journals (producer.orphans).
        try:
            entries = sorted(self.path.iterdir(), key=lambda p: (p.name == LOCK, p.name == _CURSOR, p.name))
            for entry in entries:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            self.path.rmdir()
        except OSError:   # left for an adopter (above); the lock is released all the same
            pass

    @property
    def read_position(self) -> tuple[int, int]:
        """Where the next :meth:`read` starts (after :meth:`rewind`: the last commit)."""
        return self._read_pos

    def __repr__(self) -> str:
        return f"Journal({self.path}, pending={self.pending}, bytes={self.size_bytes})"


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (os.write may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
