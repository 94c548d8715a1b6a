"""Between the event loop and other threads: results handed to the loop, work given up on.

* :func:`settle_soon`: from any thread, set a loop future's result on its loop; nothing
  happens if the future was cancelled meanwhile or the loop is closed.
* :func:`call_on_daemon_thread`: run a blocking call on a daemon thread of its own, awaited
  as a loop future carrying its result or its exception; given up on, the thread does not
  hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_on_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Start ``fn()`` on a daemon thread of its own (named ``name``); the future gets what
    it returned, or what it raised. Given up on (the future cancelled), the thread runs on
    until ``fn`` returns but does not hold up the process's exit: ``asyncio.run()`` joins
    the default executor's threads, and the interpreter every ThreadPoolExecutor's, so a
    broker call left blocking there kept a stopping relay alive for its whole timeout."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn()
        except BaseException as err:  # noqa: BLE001 - handed to whoever awaits the future
            _hand_over(loop, done, None, err)
        else:
            _hand_over(loop, done, result, None)
    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def settle_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: object) -> None:
    """From another thread: ``future.set_result(result)`` on ``loop``."""
    _hand_over(loop, future, result, None)


def _hand_over(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: object,
               error: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop is closed: nobody waits for it any more
        pass


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile: at shutdown, or a start-up step given up on
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
