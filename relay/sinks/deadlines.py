"""Time limits for HTTP requests with one loop timer for all of them, not one each.

aiohttp's own total timeout arms a loop timer for every request, wraps the request in a
timer context, and cancels the timer when the answer is in. With one event per POST that
was measured at 13 µs of the relay's CPU per event, 8% of its events/s to one collector
(bench/relay_throughput.py, paired rounds). Here a request only notes which task runs it
and when it started (a dict entry); one timer, armed for the oldest request's deadline,
cancels the tasks whose requests are over time, and the request turns that cancellation
into a timeout (:meth:`Deadlines.expired`).

Usage, in the task that makes the request::

    task = deadlines.begin()
    try:
        ...  # the request, answer read included
    except asyncio.CancelledError:
        if deadlines.expired(task):
            raise TimeoutError(...) from None
        raise  # somebody else cancelled the task
    finally:
        deadlines.end(task)

A task makes one request at a time, so entries are in start order and the oldest is first.
A cancellation of the task by anybody else is never swallowed: when both happen, the
request still raises CancelledError.
"""

from __future__ import annotations

import asyncio
import time

_current_task = asyncio.current_task
_monotonic = time.monotonic
#: Added to every wait of the timer. uvloop rounds timers to whole milliseconds of a clock
#: it reads once per loop iteration, so a timer may run up to ~1 ms before
#: ``time.monotonic()`` reaches its deadline; without slack the timer then found its request
#: not yet over time and re-armed for the rest, several wake-ups per deadline instead of one.
#: With it a request is never cancelled before its deadline, and at most this much after.
_SLACK_S = 0.002


class Deadlines:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        #: task -> when its request started, oldest first.
        self._started: dict[asyncio.Task, float] = {}
        #: Tasks this cancelled whose request has not seen the cancellation yet.
        self._expired: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> asyncio.Task:
        """The calling task starts a request now; returns the task, for :meth:`end`."""
        task = _current_task()
        assert task is not None, "a request runs in a task"
        if self._expired:  # a cancellation of ours that the task swallowed: stale now
            self._expired.discard(task)
        self._started[task] = _monotonic()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout_s + _SLACK_S, self._expire)
        return task

    def end(self, task: asyncio.Task) -> None:
        """The request of ``task`` is over (answered or failed)."""
        self._started.pop(task, None)

    def expired(self, task: asyncio.Task) -> bool:
        """Whether the CancelledError ``task`` just got in its request is this request's
        timeout and nothing else: then the cancellation is taken back (``uncancel``) and
        the caller raises a timeout instead. False when somebody else cancelled the task
        too (or only): the caller lets CancelledError go on."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() == 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def in_flight(self) -> int:
        return len(self._started)

    def _expire(self) -> None:
        self._timer = None
        started = self._started
        now = _monotonic()
        while started:
            task, at = next(iter(started.items()))
            left = at + self.timeout_s - now
            if left > 0:
                self._timer = asyncio.get_running_loop().call_later(left + _SLACK_S, self._expire)
                return
            del started[task]
            if not task.done():
                self._expired.add(task)
                task.cancel()
