"""Between the event loop and other threads: results handed to the loop, work given up on.

* :func:`settle_soon`: from any thread, set a loop future's result on its loop; nothing
  happens if the future was cancelled meanwhile or the loop is closed.
* :func:`on_daemon_thread`: run a blocking call on a daemon thread of its own, awaited as
  a loop future; given up on, the thread does not hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


def on_daemon_thread(fn: Callable[[], object]) -> asyncio.Future[object]:
    """Start ``fn()`` on a daemon thread of its own; the future is done when it returned.
    Given up on (the future cancelled), the thread does not hold up the process's exit, as
    a thread of an executor would."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[object] = loop.create_future()

    def run() -> None:
        try:
            fn()
        finally:
            settle_soon(loop, done, None)
    threading.Thread(target=run, name="relay-close", daemon=True).start()
    return done


def settle_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: object) -> None:
    """From another thread: ``future.set_result(result)`` on ``loop``."""
    try:
        loop.call_soon_threadsafe(_settle, future, result)
    except RuntimeError:  # the loop is closed: nobody waits for it any more
        pass


def _settle(future: asyncio.Future, result: object) -> None:
    if not future.done():  # cancelled meanwhile: at shutdown
        future.set_result(result)
