"""What the relay does when its group assigns, revokes or loses partitions.

The source (:class:`relay.source.kafka.KafkaSource`) calls these on the event loop, from
its rebalance callbacks, before it consumes a newly assigned partition and before it
gives up a revoked one:

- assigned: the run state of consolidated/coalesce collectors is restored, then the
  look-back reads what came before the committed offsets (not for partitions the offset
  check started elsewhere: nothing before their start was delivered);
- revoked: run-state writes are acknowledged, the partitions' queued and held events are
  taken back (the new owner reads them again), deliveries under way are waited for (up to
  ``drain_timeout_s``, :data:`REVOKE_WAIT_MAX_S` at most) and then stopped, the run state
  of the runs whose output was delivered meanwhile is written again (acknowledged: the new
  owner does not send that output again), and what was delivered is handed back for the
  final commit. Once the relay is asked to stop, no wait outlasts the shutdown: the
  deliveries are no longer waited for (the drain does that), and the state's
  acknowledgements only for what is left of the shutdown's time;
- lost (another member may own them already): given up at once, nothing written or
  committed, deliveries under way stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial

from relay.lane import CollectorLane
from relay.logs import log_event
from relay.source.lookback import Lookback
from relay.source.offsets import OffsetTracker, Partition
from relay.state.store import RunStateStore

# The relay's logger, as before these handlers had a module of their own: log filters on it keep working.
log = logging.getLogger("relay.app")

#: At most this long, a revocation waits for deliveries under way (with the state settles
#: before and after it, well within the max.poll.interval.ms the group gives a rebalance
#: handler: 300 s unless set).
REVOKE_WAIT_MAX_S = 30.0


class PartitionHandover:
    """``stop``: set when the relay is asked to stop; ``time_left()``: seconds until the
    relay must have exited (infinite until ``stop`` is set)."""

    def __init__(self, lanes: Sequence[CollectorLane], tracker: OffsetTracker, *, state: RunStateStore | None,
                 lookback: Lookback | None, drain_timeout_s: float, state_settle_s: float,
                 stop: asyncio.Event, time_left: Callable[[], float],
                 reset_at_assignment: Callable[[], Collection[Partition]]) -> None:
        self._lanes = lanes
        self._tracker = tracker
        self._state = state
        self._lookback = lookback
        self._drain_timeout_s = drain_timeout_s
        self._state_settle_s = state_settle_s
        self._stop = stop
        self._time_left = time_left
        self._reset_at_assignment = reset_at_assignment

    async def assigned(self, partitions: list[Partition]) -> dict[Partition, int]:
        if self._state is not None and partitions:
            await self._state.restore([p for _, p in partitions], time.monotonic())
        if self._lookback is not None and partitions:
            # Before any of their records: the runs begun before the committed offsets.
            # (Not those that start elsewhere: nothing before their start was delivered.)
            reset = self._reset_at_assignment()
            await self._lookback.prime([p for p in partitions if p not in reset])
        return {}

    async def revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        if not partitions:
            return {}
        if self._state is not None:
            # Written and acknowledged before the final commit and before the new owner reads it.
            await self._settle(self._state.settle)
        self._release(partitions)
        # The new owner reads these partitions once this returns, and delivers their runs
        # again from the last commit. A delivery of ours still under way (a retry against a
        # failing collector) could land after the new owner's later events of the same run:
        # a START after its COMPLETE. So wait for those, up to drain_timeout_s; what they
        # deliver meanwhile is committed below, and not sent again.
        # Not on the way out, nor once a stop is asked for during the wait: the drain waits
        # (for what is left of drain_timeout_s since the stop was asked for).
        parts = set(partitions)
        wait_s = min(self._drain_timeout_s, REVOKE_WAIT_MAX_S)
        deadline = time.monotonic() + wait_s
        sending = sum(lane.sending(parts) for lane in self._lanes)
        if sending and wait_s and not self._stop.is_set():
            log_event(log, logging.INFO, "revoke_waiting_for_deliveries", events=sending, timeout_s=wait_s)
            while sending and time.monotonic() < deadline and not self._stop.is_set():
                await asyncio.sleep(0.05)  # verdicts arrive on this loop
                sending = sum(lane.sending(parts) for lane in self._lanes)
        # Still under way: stopped, so that no retry of ours lands after the new owner's
        # later events of the same run; the new owner sends them again.
        self._abort(parts, "revoke_deliveries_aborted")
        if self._state is not None:
            # What was delivered meanwhile is out of the runs' records the new owner restores
            # (their entries were kept for that), or it would send it again.
            await self._settle(partial(self._state.settle_revoked, [p for _, p in partitions]))
        return self._tracker.revoke(partitions)

    async def _settle(self, settle: Callable[..., Awaitable[bool]]) -> None:
        if self._stop.is_set():  # on the way out (leaving the group): within the shutdown's time
            await settle(min(self._state_settle_s, self._time_left()))
        else:  # given up when a stop is asked for meanwhile: the shutdown settles it again
            await settle(self._state_settle_s, stop=self._stop)

    async def lost(self, partitions: list[Partition]) -> dict[Partition, int]:
        # Another member may own them already: write nothing, commit nothing, and stop our
        # deliveries of them at once (the new owner may be sending the same runs already).
        self._release(partitions)
        if self._state is not None:
            self._state.forget_revoked([p for _, p in partitions])
        self._tracker.revoke(partitions)
        self._abort(set(partitions), "lost_deliveries_aborted")
        return {}

    def _abort(self, partitions: set[Partition], message: str) -> None:
        aborted = sum(lane.abort(partitions) for lane in self._lanes)
        if aborted:
            log_event(log, logging.WARNING, message, events=aborted,
                      hint="stopped while still being retried: the partitions' new owner sends them again "
                           "(a request already on its way may still reach the collector: a duplicate)")

    def _release(self, partitions: list[Partition]) -> None:
        """Take back the queued and held events of ``partitions`` (read again later)."""
        if self._lookback is not None:
            self._lookback.forget(partitions)
        dropped = sum(lane.revoke(set(partitions)) for lane in self._lanes)
        if dropped:
            log_event(log, logging.INFO, "revoked_events_released", events=dropped)
