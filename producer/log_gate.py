"""``fork()`` never lands inside a log handler one of the producer's threads is running.

A log handler holds locks while it writes: its own, and those of the stream under it (a
buffered file's, which no fork handler renews). A thread of the parent inside a handler at
the fork leaves them held in the child for ever, and the child's first line through that
handler, from its own sender thread, waits for ever: its ``close()`` at exit with it (seen
with pytest's log file handler while librdkafka logged a refused connection).

So the producer's loggers (:data:`GATED`) hand their records to their handlers under one
process-wide re-entrant lock, and a ``fork()`` takes that lock first (an
``os.register_at_fork`` hook): it waits for a producer thread to leave the handlers, up to
:data:`FORK_WAIT_S` (a handler stuck on a dead log server does not stop the fork; the
child then takes its chances, as without this), and the child gets a new lock. A record's
file and line are the caller's, as before: only ``Logger.handle`` is wrapped, after the
record is made. Threads of the application logging elsewhere at the fork are outside this.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

#: The loggers the producer's own threads (the sender, librdkafka's callbacks) write to.
GATED = ("producer.kafka", "producer.librdkafka", "producer.journal")
#: How long a fork waits for a producer thread to leave a log handler.
FORK_WAIT_S = 1.0

_gate = threading.RLock()
_held_for_fork = False


def _gated_handle(handle: Any) -> Any:
    def handle_under_gate(record: logging.LogRecord) -> None:
        with _gate:
            handle(record)
    handle_under_gate.gated = True  # type: ignore[attr-defined]
    return handle_under_gate


def gate(logger: logging.Logger) -> logging.Logger:
    """``logger``, its records handled under the gate (idempotent)."""
    if not getattr(logger.handle, "gated", False):
        logger.handle = _gated_handle(logger.handle)  # type: ignore[method-assign]
    return logger


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _gate.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _gate.release()


def _after_fork_in_child() -> None:
    global _gate, _held_for_fork
    _gate, _held_for_fork = threading.RLock(), False


for _name in GATED:
    gate(logging.getLogger(_name))
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
