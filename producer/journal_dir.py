"""A journal directory's protocol (:mod:`producer.journal` holds the journal itself).

* ``LOCK``: ``flock``-ed for its owner's lifetime; :func:`lock_existing` is how anyone
  but the maker takes it: never creating it, so a journal being made (no ``LOCK`` yet) is
  never touched.
* ``DESTINATION``: where a journal's records go (:class:`Destination`), read back with
  :func:`read_destination`; absent in journals written before it existed.
* Names: ``<stamp>-<pid>-<token>`` (:class:`JournalNames`); the journals one producer makes
  share ``<pid>-<token>``, their writer (:func:`writer_of`), so that adopters take them in
  order (:mod:`producer.orphans`).
* :func:`check_journal_dir`: the directory can be made and written, checked at start-up.
* :func:`write_synced` and :func:`fsync_dir`: a file, and a directory's entries, on disk
  before the caller goes on.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from producer.errors import ConfigError

LOCK = "LOCK"
DESTINATION = "DESTINATION"
CURSOR = "CURSOR"


class JournalNames:
    """The names of the journals one writer (a producer) makes: ``<stamp>-<pid>-<token>``,
    ``<stamp>`` the UTC time (``yyyymmddTHHMMSSffffff``), so that names sort by creation
    time, and ``<token>`` drawn once: every journal of the writer has the same
    ``<pid>-<token>`` (:func:`writer_of`). Each stamp is later than the writer's previous
    one (by a microsecond if the clock has not moved on, or stepped back): its journals'
    names sort in the order it made them, and never collide. One thread at a time."""

    def __init__(self) -> None:
        self._token = secrets.token_hex(3)
        self._last: datetime | None = None

    def next(self) -> str:
        stamp = datetime.now(timezone.utc)
        if self._last is not None and stamp <= self._last:
            stamp = self._last + timedelta(microseconds=1)
        self._last = stamp
        return f"{stamp.strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{self._token}"


def writer_of(name: str) -> str:
    """The writer of the journal named ``name`` (``<pid>-<token>``, hidden or not). A journal
    named before writers shared a token (each journal drew its own) is a writer of its own."""
    _, sep, writer = name.lstrip(".").partition("-")
    return writer if sep and writer else name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


#: :func:`try_lock`'s answers other than an fd.
HELD = "held"
NO_LOCK = "no_lock"


def try_lock(path: Path) -> int | str:
    """An fd holding an exclusive flock on ``path/LOCK``; :data:`HELD` when a live process
    holds it; :data:`NO_LOCK` when there is no ``LOCK``: a hidden journal being made, or a
    visible one whose removal (:meth:`producer.journal.Journal.close`, ``LOCK`` removed last)
    is under way or was cut short. Never creates it. Raises OSError when the lock cannot be
    taken (ENOLCK on NFS, EIO)."""
    try:
        fd = os.open(path / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return NO_LOCK
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return HELD
    except OSError:   # the caller gets the error, not the fd
        os.close(fd)
        raise
    return fd


def lock_existing(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path/LOCK``, or None when a live process holds
    it or there is no ``LOCK`` (:func:`try_lock` tells the two apart). Never creates it."""
    fd = try_lock(path)
    return fd if isinstance(fd, int) else None


def release_lock(fd: int) -> None:
    """Unlock, then close, a LOCK descriptor this process holds as the journal's owner. The
    unlock is what frees the journal at once: a flock belongs to the open file, which a fork
    child shares until its fork hook closes its copy, and a next run must not find the journal
    of a process that has let it go still locked by that copy."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass
    os.close(fd)


@dataclass(frozen=True)
class Destination:
    """Where a journal's records go: a topic, on the cluster its bootstrap servers name."""

    topic: str
    bootstrap_servers: str

    def brokers(self) -> frozenset[str]:
        # "SASL_SSL://Kafka-1:9093" and "kafka-1:9093" name the same broker.
        return frozenset(part.strip().rpartition("://")[2].lower()
                         for part in self.bootstrap_servers.split(",") if part.strip())

    def accepts(self, written_for: Destination) -> bool:
        """Whether records written for ``written_for`` belong here: the same topic, and a
        bootstrap server in common (one cluster reached through disjoint broker lists is
        not recognised: its journals wait for a producer configured like the writer)."""
        return self.topic == written_for.topic and bool(self.brokers() & written_for.brokers())


def read_destination(path: Path) -> Destination | None:
    """The destination the journal at ``path`` was written for; None for a journal written
    before ``DESTINATION`` existed. Raises OSError or ValueError when it is unreadable."""
    try:
        data = json.loads((path / DESTINATION).read_text())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("topic", "bootstrap_servers")):
        raise ValueError(f"{path / DESTINATION} is not a journal destination")
    return Destination(data["topic"], data["bootstrap_servers"])


def check_journal_dir(path: Path) -> None:
    """Raise ConfigError unless ``path`` can be created and written: found at construction,
    not during the first outage, when it would cost events."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"journal_dir: cannot create {path} ({err.strerror}); set journal_dir "
                          "(or $LINEAGE_RELAY_JOURNAL_DIR) to a writable directory") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"journal_dir: {path} is not writable; set journal_dir "
                          "(or $LINEAGE_RELAY_JOURNAL_DIR) to a writable directory")
