"""Adaptive concurrency: how many requests one collector gets at once, learnt from its answers.

A collector's ``concurrency`` is a fixed ceiling. A collector that slows down or sheds load
(Marquez behind a busy database, a SaaS endpoint with rate limits) is better served by fewer
requests in flight: the same events go through, with less queueing on its side and fewer
429s to retry. With ``adaptive_concurrency`` set, :class:`AdaptiveLimit` keeps a limit
between ``min`` and the ceiling, AIMD style (additive increase, multiplicative decrease),
as TCP congestion control and Netflix's concurrency-limits do:

* **Increase**: every answer that counts as success and came back within
  ``latency_tolerance`` times the baseline latency adds ``1 / limit`` (about one more
  request in flight per round trip), while the limit is in use (at least half of it in
  flight when the request went out): a quiet collector does not earn a limit it never tried.
* **Decrease on latency**: a success slower than that (and by more than
  :data:`LATENCY_SLACK_S`) multiplies the limit by :data:`LATENCY_DECREASE`; the collector
  is queueing requests.
* **Decrease on overload**: 429, 503 and the other retriable statuses, timeouts and
  connection errors multiply it by :data:`OVERLOAD_DECREASE`.
* A decrease happens once per round trip: only an answer to a request sent after the last
  decrease can cause another (the requests in flight at the time answer with the old
  state), so one burst of slow answers shrinks the limit once, not once per request.
* The baseline is the lowest latency of the last :data:`BASELINE_WINDOWS` windows of
  :data:`WINDOW` answers: it follows a collector whose normal latency changes, and one
  slow period does not become the norm.

Answers that say nothing about load (a 400, a 401) leave the limit alone. The limit is
the number of requests in flight; a request waits in :meth:`AdaptiveLimit.acquire`
before it is sent (its time limit starts once it is sent), first come first served.

:class:`FixedLimit` is the same gate with a limit that never changes: a batch collector's
``batch.max_requests`` without ``adaptive_concurrency`` (batches and events sent alone share it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from enum import Enum

#: Factor applied to the limit on an overload signal (429, 5xx, timeout, no connection).
OVERLOAD_DECREASE = 0.75
#: Factor applied to the limit on an answer slower than the tolerance allows.
LATENCY_DECREASE = 0.9
#: A slow answer must also be this much slower than the baseline: a collector answering in
#: well under a millisecond (loopback, a cache) shows jitter of several times that from
#: the relay's own event loop alone, which says nothing about the collector's load.
LATENCY_SLACK_S = 0.005
#: Answers per baseline window, and windows the baseline remembers.
WINDOW = 100
BASELINE_WINDOWS = 10


class Outcome(Enum):
    """What one answer says about the collector's load."""

    OK = "ok"  # a success: its latency is a sample
    OVERLOAD = "overload"  # 429, 408, 5xx, a timeout, no connection
    NEUTRAL = "neutral"  # a refusal that says nothing about load (400, 401, 413, ...)


#: What :meth:`AdaptiveLimit.acquire` gives for :meth:`AdaptiveLimit.release`: when the
#: request went out, and how many requests were in flight then (itself included).
Sent = tuple[float, int]


class AdaptiveLimit:
    """Requests in flight to one collector, under a limit that follows its answers (see the
    module docstring). ``on_change(limit)`` is called with the new whole limit when it
    changes (for the metric)."""

    def __init__(self, *, minimum: int, maximum: int, initial: int | None = None, latency_tolerance: float = 2.0,
                 use_latency: bool = True, on_change: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        start = initial if initial is not None else min(maximum, max(minimum, 4))
        self.limit = float(min(maximum, max(minimum, start)))
        self.in_flight = 0
        #: Decreases so far (overload or latency).
        self.decreases = 0
        self._tolerance = latency_tolerance if use_latency else math.inf
        self._on_change = on_change
        self._clock = clock
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: When the last decrease happened: answers to requests sent before it cannot decrease again.
        self._last_decrease = -math.inf
        self._window_min = math.inf
        self._window_count = 0
        self._window_mins: deque[float] = deque(maxlen=BASELINE_WINDOWS)
        self._reported = int(self.limit)
        if on_change is not None:
            on_change(self._reported)

    @property
    def uses_latency(self) -> bool:
        """Whether slow answers shrink the limit (not for batch requests: see the module)."""
        return self._tolerance != math.inf

    @property
    def baseline_s(self) -> float:
        """The lowest recent latency of a success (``inf`` before the first)."""
        return min(self._window_min, min(self._window_mins, default=math.inf))

    async def acquire(self) -> Sent:
        """Wait for room, take it; returns what :meth:`release` needs: when the request went
        out and how many were in flight with it."""
        if not self._waiters and self.in_flight < int(self.limit):
            self.in_flight += 1
            return self._clock(), self.in_flight
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # in_flight was counted for us by whoever woke us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # woken and cancelled at once: give the room back
                self.in_flight -= 1
                self._wake()
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise
        return self._clock(), self.in_flight

    def release(self, sent: Sent, outcome: Outcome) -> None:
        """The answer to a request (``sent`` is what :meth:`acquire` returned for it)."""
        sent_at, in_flight_then = sent
        self.in_flight -= 1
        now = self._clock()
        if outcome is Outcome.OK:
            latency = now - sent_at
            self._sample(latency)
            baseline = self.baseline_s
            if latency > self._tolerance * baseline and latency > baseline + LATENCY_SLACK_S:
                self._decrease(sent_at, now, LATENCY_DECREASE)
            elif in_flight_then >= self.limit / 2:
                self._set(self.limit + 1 / self.limit)
        elif outcome is Outcome.OVERLOAD:
            self._decrease(sent_at, now, OVERLOAD_DECREASE)
        self._wake()

    def _sample(self, latency: float) -> None:
        if latency < self._window_min:
            self._window_min = latency
        self._window_count += 1
        if self._window_count >= WINDOW:
            self._window_mins.append(self._window_min)
            self._window_min = math.inf
            self._window_count = 0

    def _decrease(self, sent_at: float, now: float, factor: float) -> None:
        if sent_at < self._last_decrease:
            return  # sent before the last decrease: that one already answered for it
        self._last_decrease = now
        self.decreases += 1
        self._set(self.limit * factor)

    def _set(self, limit: float) -> None:
        self.limit = min(float(self.maximum), max(float(self.minimum), limit))
        whole = int(self.limit)
        if whole != self._reported:
            self._reported = whole
            if self._on_change is not None:
                self._on_change(whole)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self.in_flight < int(self.limit):
            waiter = waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)


class FixedLimit(AdaptiveLimit):
    """An :class:`AdaptiveLimit` whose limit never changes: the same gate (first come first
    served, cancellation-safe), answers say nothing to it."""

    def __init__(self, limit: int) -> None:
        super().__init__(minimum=limit, maximum=limit, initial=limit)

    def release(self, sent: Sent, outcome: Outcome) -> None:
        self.in_flight -= 1
        self._wake()
