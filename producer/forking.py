"""``fork()`` and the producer (used by :mod:`producer.kafka`).

A child made by ``fork()`` (``multiprocessing``'s default start method on Linux before
Python 3.14, ``os.fork()``) inherits the producer object but not its threads: neither the
sender thread nor librdkafka's. Records given to the inherited instance would sit in
memory for ever, and its ``flush()`` would return at once with them pending: lost without
a word. So, in the child, every live producer is reset to fresh state by the fork hook
and started (a new librdkafka instance, a new sender thread, its own journal) on the
child's first ``emit``: a worker that emits nothing opens no connection. The parent keeps
sending what it had queued and keeps its journals. A ``multiprocessing`` child ends with
``os._exit``, which skips ``atexit``: its producers are closed by a ``multiprocessing``
finalizer instead (flushed for ``close_timeout_s``, the rest journaled), which that exit
runs. A child killed (``Pool.terminate()``, which the ``with Pool()`` block calls) loses
what it had not delivered, as any killed process does.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

#: In a forked child: what each producer inherited (its librdkafka instance, journals).
#: Kept referenced, never closed or used: librdkafka's destroy would wait for threads the
#: child does not have, and the journals are the parent's.
_inherited: list[tuple[Any, ...]] = []
_exit_registered = False


def reset_in_forked_children(live: Iterable[Any], close_all: Callable[[], None]) -> None:
    """The fork hook, in the child. It only builds locks and containers: a lock a parent
    thread held at the fork would never be released in the child, so none is taken."""
    global _exit_registered, _close_all
    _exit_registered = False
    _close_all = close_all
    for producer in list(live):
        if getattr(producer, "_forked", None) is False and not producer._closed:
            _inherited.append((producer._producer, producer._journals, producer._own))
            producer._init_sender(producer.config.queue_max_events)
            producer._journals = []
            producer._fork_lock = threading.Lock()
            producer._forked = True


def start_in_forked_child(producer: Any) -> None:
    """On a forked child's first emit: a new librdkafka instance and sender thread."""
    with producer._fork_lock:
        if not producer._forked:
            return
        producer._producer = producer._new_producer()
        producer._start_sender()
        producer._forked = False
    _close_at_multiprocessing_exit()


_close_all: Callable[[], None] = lambda: None


def _close_at_multiprocessing_exit() -> None:
    global _exit_registered
    mp_util = sys.modules.get("multiprocessing.util")
    if _exit_registered or mp_util is None:
        return
    _exit_registered = True
    # Registered here, not in the fork hook: a multiprocessing child clears the finalizers
    # it inherited after the fork hooks ran. Priority >= 0: run before the child's exit.
    mp_util.Finalize(None, _close_all, exitpriority=100)
