"""close(), flush(), emit() and stats called where the producer cannot finish them: in a
signal handler.

A signal handler runs on the main thread between two calls of whatever it interrupted
(CPython runs one only at a call or a loop's back edge): possibly an ``emit()`` inside
``_lock``, a counter update holding ``_count_lock``, or a log handler holding its own
lock. The locks are re-entrant, so the handler does not deadlock on them; but the sender
thread may need one of them (a log handler's lock to log a line, ``_count_lock`` to count),
and the interrupted ``emit()`` has not placed its event yet. A ``close()`` there that
waited for the sender to journal and stop would wait out its whole timeout, then leave
what was not journaled, the interrupted event included, behind.

So such a close() is *deferred* (:class:`DeferredClose`): at once it refuses later events
(dropped, ``closed``), waits up to ``close_timeout_s`` for what librdkafka holds to be
acknowledged (librdkafka's acknowledgements need no lock), and logs WARNING
``event=close_deferred reason=inside_emit|inside_counters|inside_logging`` once (inside
logging: when it finishes); ``stats.close_deferred`` names the reason from then on. The
rest -- the flush of what is left, the sender's journaling and stop -- is done when the
interrupted ``emit()`` returns (its ``finally``), else at the next ``close()`` or at
interpreter exit, within the same ``close_timeout_s``; the ``event=closed`` line then
says ``close_deferred=<reason> interrupted=<n>``. A close() anywhere else is never
deferred: it does not wait for ``_lock`` at all (the sender's last turn does, bounded:
:meth:`producer.sender.Sender._quiesce_emits`).

The events of the calls the handler interrupted keep their place:

* An ``emit()`` the close interrupted is not refused: its event is placed as if the
  producer were open (to librdkafka, or the spill queue in journal mode, past its bound if
  it is full), after the events emitted before it, and the close's flush covers it -- unless
  the close is finished elsewhere before that emit() resumes (another thread's close(), or
  exit while the handler still runs): the sender is stopped then, and the event is dropped
  (``closed``), counted and logged.
* An ``emit()`` the handler makes before the interrupted one has placed its event, or while
  it is inside ``_lock``, is held and placed right after it (taking the re-entrant lock
  would put it ahead); so is one made in a handler interrupting that handler's emit(), after
  both. Until the interrupted emit() resumes, flush() on another thread does not count it.
* If the handler raises (``sys.exit()``, ``KeyboardInterrupt``), the interrupted ``emit()``
  places its event before the exception goes on (``_rescue``). One that had handed its
  record to librdkafka with no sign yet of produce() having returned is settled by that
  record's delivery report if it came already; else it places the record again (it may be
  sent twice: at-least-once), and the first copy's report is ignored when it comes.

``flush()`` in such a handler waits only for what librdkafka holds and returns the rest as
pending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from producer.journal import Record

log = logging.getLogger("producer.kafka")

#: How long a sender turn waits for ``_lock`` before leaving the step that needs it to the
#: next turn: the main thread may hold it while a signal handler runs.
LOCK_SLICE_S = 0.05


@dataclass
class DeferredClose:
    """A close() that could not finish where it was called."""

    reason: str
    deadline: float          # time.monotonic() by which the close is to be done
    thread: int              # where it was called ...
    depth: int               # ... and how many emit() calls deep (0: none); those go on as open
    warned: bool = False
    interrupted: int = 0     # events of interrupted emit() calls placed after the close began


class DeferredClosing:
    """LineageProducer's re-entrant close; see the module docstring."""

    _lock: threading.RLock
    _count_lock: threading.RLock
    _closed: bool
    _closing: bool
    _topic: str
    _kafka_down: bool
    _space: threading.Condition
    _direct_outstanding: Callable[[], int]
    _wait: Callable[[float | None, Callable[[], bool]], None]
    close: Callable[..., None]   # LineageProducer's

    def _init_deferred_close(self) -> None:
        self._stopped = False          # close() finished: the sender is stopped
        self._deferred: DeferredClose | None = None
        # Thread id -> the innermost emit() call in progress on it (held_emits.Emit: its depth,
        # the call it interrupted).
        self._emitting: dict[int, Any] = {}
        # Records of emit() calls a signal handler made inside another emit()'s _lock: placed
        # after that one's record (LineageProducer._enqueue).
        self._held_back: deque[Record] = deque()

    def _reentered(self, thread: int) -> str | None:
        """Why a close() or flush() on ``thread`` cannot wait for the sender, if it cannot."""
        if self._emitting.get(thread) or self._lock._is_owned():  # type: ignore[attr-defined]
            return "inside_emit"
        if self._count_lock._is_owned():  # type: ignore[attr-defined]
            return "inside_counters"
        if inside_logging(log):
            return "inside_logging"
        return None

    def _librdkafka_settled(self) -> bool:
        """What a handler's close() or flush() waits for: librdkafka holds none of the
        records handed to it, or Kafka is not taking records."""
        return self._direct_outstanding() <= 0 or self._kafka_down

    def _defer_close(self, reason: str, deadline: float, thread: int) -> None:
        deferred = self._deferred
        if deferred is None:
            current = self._emitting.get(thread)
            deferred = self._deferred = DeferredClose(reason, deadline, thread, current.depth if current else 0)
        self._closing = self._closed = True    # without _lock: this thread may be inside it
        # An emit() of another thread waiting for room in the spill queue sees it at once
        # (this thread may own _lock: re-entrant; if another thread does, it sees it later).
        if self._lock.acquire(blocking=False):
            try:
                self._space.notify_all()
            finally:
                self._lock.release()
        if reason != "inside_logging":
            self._warn_deferred()
        self._wait(max(0.0, deadline - time.monotonic()), self._librdkafka_settled)

    def _warn_deferred(self) -> None:
        deferred = self._deferred
        if deferred is not None and not deferred.warned:
            deferred.warned = True
            log.warning("event=close_deferred topic=%s reason=%s detail=close() called where it cannot wait for "
                        "the sender (a signal handler?): later events are dropped, the rest is sent or journaled "
                        "when the interrupted call returns or at exit", self._topic, deferred.reason)

    def _was_interrupted(self, thread: int, depth: int) -> bool:
        """Whether an emit() at ``depth`` on ``thread``, finding the producer closed, began
        before the deferred close (it was interrupted by it): its event is placed."""
        deferred = self._deferred
        return deferred is not None and deferred.thread == thread and depth <= deferred.depth

    def _placed_late(self) -> None:
        """Under ``_lock``: an event was placed after a close() began (interrupted or held back)."""
        deferred = self._deferred
        if deferred is not None:
            deferred.interrupted += 1

    def _refuses(self, thread: int | None, depth: int) -> bool:
        """Whether an emit() at ``depth`` on ``thread`` is refused (``closed``); a held-back
        record (``thread`` None) never is: it was accepted before any close()."""
        return self._closed and thread is not None and not self._was_interrupted(thread, depth)

    def _emit_returned(self, thread: int, depth: int) -> None:
        """emit()'s ``finally`` while a close is deferred: the interrupted one finishes it."""
        deferred = self._deferred
        if deferred is None or deferred.thread != thread or depth > deferred.depth:
            return
        deferred.depth = depth - 1
        if deferred.depth == 0 and not self._stopped:
            self.close()

    def _finishing(self) -> str:
        """close()'s last part: what the ``event=closed`` line adds about a deferral."""
        deferred = self._deferred
        if deferred is None:
            return ""
        deferred.depth = 0      # no emit() resuming from here on goes on as open: the sender stops
        self._warn_deferred()
        return f" close_deferred={deferred.reason} interrupted={deferred.interrupted}"


def inside_logging(logger: logging.Logger) -> bool:
    """Whether this thread is inside a log handler ``logger``'s records reach (it holds the
    handler's lock): the sender, logging, would wait for it."""
    current: logging.Logger | None = logger
    handlers: list[logging.Handler] = []
    while current is not None:
        handlers.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        lock = getattr(handler, "lock", None)
        owned = getattr(lock, "_is_owned", None)
        if owned is not None and owned():
            return True
    return False
