"""Journals dead processes left: finding them and taking them over (for the producer).

A journal whose ``LOCK`` is free belongs to a dead process (a ``flock`` dies with the
last descriptor of its open file). Taking one over means locking it and opening it as a
:class:`producer.journal.Journal`; its records then go to Kafka from this process, and a
journal fully sent is removed. Two calls: :func:`adopt_orphans` takes every one at once
(a producer's construction: their events go before its own; with ``recover=False`` it only
locks and opens them, and the producer's sender thread counts their records,
:mod:`producer.replay`), :func:`adopt_next` the oldest one, its recovery scan left to the
caller (a running producer, one at a time, the scan in slices of its sender's turns).

Which journals are taken:

* One writer's journals (a producer's: the same ``<pid>-<token>`` in their names,
  :func:`producer.journal_dir.writer_of`) in the order it made them, never two at once by
  different processes: one whose ``LOCK`` is held (its writer lives, or another adopter is
  sending it) holds back every later journal of its writer, which is looked at again at the
  next look. A visible one without ``LOCK`` (its removal under way, or cut short: ``LOCK``
  goes last) holds nothing back: removed if it has no segments, else logged once
  (``event=adopt_skipped reason=no_lock``) and left, its records all sent. So a run's
  events reach Kafka in emit order though several producers adopt: an adopter takes a
  writer's next journal only once the earlier one is all sent (removed) or released (left
  for the next adopter, which takes it first).
  One this process gave up (below) is still looked at, its ``LOCK`` only: held (another
  process is sending it), it holds back its writer's later journals as any; free, it is not
  taken and holds nothing back: its writer's later journals must not wait for ever, and are
  sent before it if it is ever read. A hidden one (being made) never holds anything back.
* Only those written for the caller's :class:`~producer.journal_dir.Destination` (its topic,
  and a bootstrap server in common), read from the journal's ``DESTINATION`` file before
  any lock is taken. A journal without that file (written before it existed) is taken by
  any producer on the directory, as it always was. A dead process's journal written for
  another topic or cluster is left for a producer configured like its writer, and logged
  once per process (WARNING, ``event=adopt_skipped``, with both destinations).
* Never one being made: its ``LOCK`` appears only once it is locked, and adopters do not
  create it (:func:`producer.journal_dir.lock_existing`). A hidden ``.<id>`` directory whose
  ``LOCK`` is free was left by a process that died while making it, before it held a
  record: it is removed. One whose maker died before its ``LOCK`` appeared stays, empty
  (nothing tells it from one being made), and holds back none of its writer's journals: a
  journal being made has a live writer, which holds its other journals itself. Journals
  are taken in the order of their names without the leading dot.
* A journal that cannot be opened (a bad ``DESTINATION``, an unreadable file, a segment
  that is not a file) is logged once (``event=adopt_failed``) and not taken again by this
  process (its ``LOCK`` is still checked, above); it stays on disk for the next process.
* Empty orphans met on the way are removed: one with no bytes after its cursor when it is
  opened (nothing read), one whose bytes hold no record once its scan finds none (by the
  caller of :func:`adopt_next`, or of :func:`adopt_orphans` with ``recover=False``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from producer.errors import JournalError
from producer.journal import Journal
from producer.journal_dir import (
    CURSOR,
    DESTINATION,
    HELD,
    LOCK,
    NO_LOCK,
    Destination,
    lock_existing,
    read_destination,
    release_lock,
    try_lock,
    writer_of,
)

log = logging.getLogger("producer.journal")

#: Journals this process could not take over: logged once, not tried again.
_failed: set[Path] = set()
#: Dead processes' journals written for another destination: logged once.
_skipped: set[Path] = set()


def adopt_orphans(root: Path, *, max_bytes: int, segment_bytes: int,
                  destination: Destination | None = None, recover: bool = True) -> list[Journal]:
    """Lock and open every orphan under ``root`` with records, oldest first (``destination``
    None: whatever it was written for). ``recover=False``: their recovery scans are not run
    (cheap whatever their size), so ones whose bytes hold no record are among them too
    (not those with no bytes after their cursor: removed); the caller runs
    :meth:`Journal.recover_some` on each until it is complete before reading it, and a
    journal released before that stays on disk, whole. Raises OSError when ``root`` cannot
    be listed."""
    return list(_adoptable(root, destination, max_bytes, segment_bytes, recover))


def adopt_next(root: Path, *, max_bytes: int, segment_bytes: int, destination: Destination) -> Journal | None:
    """Lock and open the oldest orphan under ``root`` for ``destination``, or None. Its
    recovery scan is not run: the caller runs :meth:`Journal.recover_some` until it is
    complete, then sends the journal's records or, none, closes it (which removes it).
    Holds at most one journal at any moment. Raises OSError when ``root`` cannot be listed."""
    return next(_adoptable(root, destination, max_bytes, segment_bytes, recover=False), None)


def give_up(journal: Journal, err: Exception) -> None:
    """Release an adopted journal that failed while being read: left for the next process."""
    _fail(journal.path, err)
    try:
        journal.close()
    except OSError:
        pass


def _candidates(root: Path, destination: Destination | None) -> list[tuple[Path, bool]]:
    """The journal directories under ``root`` in the order their writers made them (names
    without the leading dot: a hidden one sorts where it will be once made), each with
    whether it may be taken (False: given up by this process, its LOCK only checked)."""
    if not root.is_dir():
        return []
    found = []
    for path in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (p.name.lstrip("."), p.name)):
        if path in _failed:
            found.append((path, False))
            continue
        if destination is not None and not path.name.startswith("."):
            try:
                written_for = read_destination(path)
            except (OSError, ValueError) as err:
                _fail(path, err)
                found.append((path, False))
                continue
            if written_for is not None and not destination.accepts(written_for):
                _skip(path, written_for, destination)
                continue
        found.append((path, True))
    return found


def _skip(path: Path, written_for: Destination, destination: Destination) -> None:
    """Log, once, a dead process's journal left for another destination (not a live one's)."""
    if path in _skipped:
        return
    try:
        fd = lock_existing(path)   # held for a moment only: its adopter finds it at its next look
    except OSError:   # its lock cannot be taken (ENOLCK, EIO): not tried again by this process
        _skipped.add(path)
        return
    if fd is None:
        return
    release_lock(fd)
    _skipped.add(path)
    log.warning("journal=%s event=adopt_skipped written_for=%s@%s producer_for=%s@%s "
                "fix=run a producer for %s@%s with this journal_dir to send it",
                path, written_for.topic, written_for.bootstrap_servers, destination.topic,
                destination.bootstrap_servers, written_for.topic, written_for.bootstrap_servers)


def _adoptable(root: Path, destination: Destination | None, max_bytes: int, segment_bytes: int,
               recover: bool) -> Iterator[Journal]:
    """The orphans under ``root`` taken over, oldest first, one at a time as the caller asks
    (it stops asking: the rest stay untouched); a journal whose LOCK is held holds back its
    writer's later ones."""
    held: set[str] = set()
    for path, takeable in _candidates(root, destination):
        if path.name.startswith("."):
            _remove_if_dead(path)
            continue
        writer = writer_of(path.name)
        if writer in held:
            continue
        try:
            fd = try_lock(path)
        except OSError as err:
            _fail(path, err)
            continue
        if fd == NO_LOCK:
            _left_without_lock(path)
            continue
        if fd == HELD:
            held.add(writer)
            continue
        if not takeable:   # given up here, and nobody else sending it: holds nothing back
            release_lock(fd)
            continue
        journal = _take(path, fd, max_bytes, segment_bytes, recover=recover)
        if journal is not None:
            yield journal


def _take(path: Path, fd: int, max_bytes: int, segment_bytes: int, recover: bool) -> Journal | None:
    """Open the journal at ``path`` whose ``LOCK`` ``fd`` holds: None if it is empty
    (removed) or cannot be opened (given up)."""
    try:
        journal = Journal(path, fd, max_bytes=max_bytes, segment_bytes=segment_bytes, recover=recover)
    except (OSError, ValueError, JournalError) as err:
        release_lock(fd)
        _fail(path, err)
        return None
    if journal.recovered and journal.pending == 0:
        journal.close()   # removed: nothing after its cursor (known without a read), or none found
        return None
    if not recover:
        return journal
    log.info("journal=%s event=adopted pending=%d", path, journal.pending)
    return journal


def _remove_if_dead(path: Path) -> None:
    """Remove the hidden journal ``path`` if its maker died with its ``LOCK`` made (free); one
    without a ``LOCK``, or whose ``LOCK`` is held, is being made: left alone."""
    try:
        fd = lock_existing(path)
    except OSError:
        return
    if fd is not None:
        shutil.rmtree(path, ignore_errors=True)
        release_lock(fd)


def _left_without_lock(path: Path) -> None:
    """A visible journal without ``LOCK``: its removal (:meth:`Journal.close`, ``LOCK`` last)
    is under way or was cut short, so nothing in it is unsent; it holds nothing back. Without
    segments it is removed; with some (a removal by an older version, ``LOCK`` not last) it
    is logged once and left: its records were all sent, and taking it would send them again."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return
    if any(entry.is_dir() or not _is_journal_file(entry.name) for entry in entries):
        return   # not a journal's (a directory someone else keeps here): never touched
    if not any(entry.name.endswith(".seg") for entry in entries):
        try:
            for entry in entries:
                entry.unlink()
            path.rmdir()
        except OSError:
            pass
        return
    if path not in _failed:
        _failed.add(path)
        log.warning("journal=%s event=adopt_skipped reason=no_lock action=left_on_disk "
                    "fix=remove it: a journal is removed only once all its records were sent", path)


def _is_journal_file(name: str) -> bool:
    """A name a journal's own files have: segments, its cursor, what it was written for, its
    lock (and their temporary names while they are written)."""
    base = name.split(".", 1)[0]
    return name.endswith(".seg") or base in (LOCK, DESTINATION, CURSOR)


def _fail(path: Path, err: Exception) -> None:
    if path not in _failed:
        _failed.add(path)
        log.warning("journal=%s event=adopt_failed error=%s action=left_for_the_next_process", path, err)
