"""The runs a :class:`~relay.stages.consolidate.RunConsolidator` knows, within its bounds.

* :attr:`KnownRuns.open`: run id -> :class:`~relay.stages.run_state.RunRecord`, least
  recently touched first (whoever touches a run moves it to the end). A restored run may
  break that order: :meth:`KnownRuns.sort_if_restored` mends it, and must run before the
  order is relied on (the oldest open run is the first to expire). It may replace
  :attr:`~KnownRuns.open` with a new dict: read the attribute again after calling it.
* :attr:`KnownRuns.closed`: run id -> ``(when, outcome)`` of runs that finished or expired
  while open (outcome ``finished``, or their START ``emitted``/``skipped``): at most
  ``max_closed`` of them, the oldest forgotten first, and none older than ``closed_ttl_s``
  once :meth:`KnownRuns.forget_old_closed` ran.
* :attr:`KnownRuns.timers`: a heap of ``(deadline, run id)``. Entries are never taken out
  early: one may name a run that is gone or no longer due, and whoever pops it checks.

Pure bookkeeping: no clock (times are the caller's ``now``), and nothing is emitted here;
what happens to a run is the consolidator's decision.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from relay.stages.run_state import RunRecord


class KnownRuns:
    """Open runs (LRU), recently closed ones (bounded) and the timer heap; see the module docstring."""

    def __init__(self, *, max_closed: int, closed_ttl_s: float) -> None:
        self.open: OrderedDict[str, RunRecord] = OrderedDict()  # least recently touched first
        self.closed: OrderedDict[str, tuple[float, str]] = OrderedDict()  # id -> (when, outcome)
        self.timers: list[tuple[float, str]] = []  # (deadline, run id) heap; stale entries are harmless
        self._max_closed = max_closed
        self._closed_ttl_s = closed_ttl_s
        self._unsorted = False  # reopen() may have broken the order of ``open``

    def push(self, deadline: float, run_id: str) -> None:
        heapq.heappush(self.timers, (deadline, run_id))

    def sort_if_restored(self) -> None:
        if self._unsorted:
            self.open = OrderedDict(sorted(self.open.items(), key=lambda item: item[1].touched))
            self._unsorted = False

    def reopen(self, run: RunRecord) -> None:
        """Put a restored ``run`` among the open runs (it is no longer closed), last; if it
        was touched before the newest open run, the next :meth:`sort_if_restored` mends the
        order."""
        self.closed.pop(run.run_id, None)
        if self.open and next(reversed(self.open.values())).touched > run.touched:
            self._unsorted = True
        self.open[run.run_id] = run

    def remember_closed(self, run_id: str, outcome: str, now: float) -> None:
        closed = self.closed
        closed[run_id] = (now, outcome)
        closed.move_to_end(run_id)
        while len(closed) > self._max_closed:
            closed.popitem(last=False)

    def forget_old_closed(self, now: float) -> None:
        """Forget closed runs remembered for longer than ``closed_ttl_s``."""
        closed = self.closed
        while closed and now - next(iter(closed.values()))[0] > self._closed_ttl_s:
            closed.popitem(last=False)
