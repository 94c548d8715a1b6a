"""close() and flush() called where the producer cannot finish them: in a signal handler.

A signal handler runs on the main thread between two bytecodes of whatever it interrupted:
possibly an ``emit()`` holding ``_lock``, a counter update holding ``_count_lock``, or a
log handler holding its own lock. The locks are re-entrant, so the handler does not
deadlock on them; but the sender thread may need one of them (``_lock`` to journal, a log
handler's lock to log a line), and it cannot have it until the handler returns. A
``close()`` there that waited for the sender to journal and stop would wait out its whole
timeout, then leave what was not journaled behind.

So such a close() is *deferred* (:class:`DeferredClosing`): at once it refuses later events
(dropped, ``closed``), waits up to ``close_timeout_s`` for what librdkafka holds to be
acknowledged (librdkafka's acknowledgements need no lock), and logs WARNING
``event=close_deferred reason=inside_emit|inside_counters|inside_logging|lock_busy`` once
(inside logging: when it finishes). The rest -- the sender's journaling and stop -- is done
when the interrupted ``emit()`` returns (its ``finally``), else at the next ``close()`` or
at interpreter exit, within the same ``close_timeout_s``. An event whose ``emit()`` the
close interrupted is journaled (WARNING ``event=journaled reason=emit_interrupted``), not
dropped: nothing new goes to librdkafka once close() began. ``flush()`` there waits only
for what librdkafka holds and returns the rest as pending.

``lock_busy``: another thread holds ``_lock`` for longer than the close may wait. The next
close() waits for it again, for what is left of ``close_timeout_s`` (at least
:data:`LOCK_WAIT_S`), then goes on without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("producer.kafka")

#: The shortest wait for ``_lock`` in close(): other emits hold it for microseconds, the
#: sender for the time of a queue swap or a new librdkafka instance.
LOCK_WAIT_S = 0.5


@dataclass
class DeferredClose:
    """A close() that could not finish where it was called."""

    reason: str
    deadline: float          # time.monotonic() by which the close is to be done
    thread: int              # where it was called ...
    depth: int               # ... and how many emit() calls deep (0: none); those resume as interrupted
    warned: bool = False
    interrupted: int = 0     # events of interrupted emit() calls, journaled


class DeferredClosing:
    """LineageProducer's re-entrant close; see the module docstring."""

    _lock: threading.RLock
    _count_lock: threading.RLock
    _closed: bool
    _closing: bool
    _topic: str
    _kafka_down: bool
    _direct_outstanding: Callable[[], int]
    _wait: Callable[[float | None, Callable[[], bool]], None]
    close: Callable[..., None]   # LineageProducer's

    def _init_deferred_close(self) -> None:
        self._stopped = False          # close() finished: the sender is stopped
        self._deferred: DeferredClose | None = None
        self._emitting: dict[int, int] = {}   # thread id -> emit() calls in progress on it

    def _reentered(self, thread: int) -> str | None:
        """Why a close() or flush() on ``thread`` cannot wait for the sender, if it cannot."""
        if self._emitting.get(thread):
            return "inside_emit"
        if self._count_lock._is_owned():
            return "inside_counters"
        if inside_logging(log):
            return "inside_logging"
        return None

    def _defer_close(self, reason: str, deadline: float, thread: int) -> None:
        deferred = self._deferred
        if deferred is None:
            deferred = self._deferred = DeferredClose(reason, deadline, thread, self._emitting.get(thread, 0))
        self._closing = self._closed = True    # without _lock: this thread or another holds it
        if reason != "inside_logging":
            self._warn_deferred()
        self._wait(max(0.0, deadline - time.monotonic()),
                   lambda: self._direct_outstanding() <= 0 or self._kafka_down)

    def _warn_deferred(self) -> None:
        deferred = self._deferred
        if deferred is not None and not deferred.warned:
            deferred.warned = True
            log.warning("event=close_deferred topic=%s reason=%s detail=close() called where it cannot wait for "
                        "the sender (a signal handler?): later events are dropped, the rest is journaled when "
                        "the interrupted call returns or at exit", self._topic, deferred.reason)

    def _was_interrupted(self, thread: int, depth: int) -> bool:
        """Whether an emit() at ``depth`` on ``thread``, finding the producer closed, began
        before the deferred close (it was interrupted by it): its event is journaled."""
        deferred = self._deferred
        return deferred is not None and deferred.thread == thread and depth <= deferred.depth

    def _emit_returned(self, thread: int, depth: int) -> None:
        """emit()'s ``finally`` while a close is deferred: the interrupted one finishes it."""
        deferred = self._deferred
        if deferred is None or deferred.thread != thread or depth > deferred.depth:
            return
        deferred.depth = depth - 1
        if deferred.depth == 0 and not self._stopped:
            self.close()

    def _finishing(self) -> None:
        """close()'s last part, after a deferral: what was put off is said now."""
        deferred = self._deferred
        if deferred is None:
            return
        deferred.depth = 0      # no emit() resuming from here on is journaled: the sender stops
        self._warn_deferred()
        if deferred.interrupted:
            log.warning("event=journaled reason=emit_interrupted topic=%s count=%d",
                        self._topic, deferred.interrupted)


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
