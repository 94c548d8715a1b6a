"""What the relay does when its group assigns, revokes or loses partitions.

The source (:class:`relay.source.kafka.KafkaSource`) calls these on the event loop, from
its rebalance callbacks, before it consumes a newly assigned partition and before it
gives up a revoked one:

- assigned: the run state of consolidated/coalesce collectors is restored, then the
  look-back reads what came before the committed offsets (not for partitions the offset
  check started elsewhere: nothing before their start was delivered). A stop asked for
  meanwhile ends that at once: the partitions are :attr:`PartitionHandover.abandoned`,
  none of their records handled (nor committed);
- revoked: run-state writes are acknowledged, the partitions' queued and held events are
  taken back (the new owner reads them again), deliveries under way are waited for (up to
  ``drain_timeout_s``, :data:`REVOKE_WAIT_MAX_S` at most) and then stopped, the run state
  of the runs whose output was delivered meanwhile is written again (acknowledged: the new
  owner does not send that output again), and what was delivered is handed back for the
  final commit. All of it within the time the consumer gives the handler
  (max.poll.interval.ms, less a margin): the state's acknowledgements get a quarter of it
  each at most, the wait what is left between them. Once the relay is asked to stop, no
  wait outlasts the shutdown: the deliveries are no longer waited for (the drain does
  that), and the state's acknowledgements only for what is left of the shutdown's time. A
  revocation that fails (or is given up) gives the partitions up as if lost;
- lost (another member may own them already): given up at once, nothing written or
  committed, deliveries under way stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from functools import partial
from typing import Any

from relay.lane import CollectorLane
from relay.logs import log_event
from relay.source.lookback import Lookback
from relay.source.offsets import OffsetTracker, Partition, format_partitions
from relay.state.store import RunStateStore

# The relay's logger, as before these handlers had a module of their own: log filters on it keep working.
log = logging.getLogger("relay.app")

#: At most this long, a revocation waits for deliveries under way (and no longer than the
#: max.poll.interval.ms the group gives a rebalance handler leaves: 300 s unless set).
REVOKE_WAIT_MAX_S = 30.0


class PartitionHandover:
    """``stop``: set when the relay is asked to stop; ``time_left()``: seconds until the
    relay must have exited (infinite until ``stop`` is set); ``handover_left()``: seconds
    the handler running now may still take before the consumer gives it up (what is left of
    max.poll.interval.ms, see :meth:`relay.source.kafka.KafkaSource.handover_left`)."""

    def __init__(self, lanes: Sequence[CollectorLane], tracker: OffsetTracker, *, state: RunStateStore | None,
                 lookback: Lookback | None, drain_timeout_s: float, state_settle_s: float,
                 stop: asyncio.Event, time_left: Callable[[], float],
                 reset_at_assignment: Callable[[], Collection[Partition]],
                 handover_left: Callable[[], float] = lambda: float("inf")) -> None:
        self._lanes = lanes
        self._tracker = tracker
        self._state = state
        self._lookback = lookback
        self._drain_timeout_s = drain_timeout_s
        self._state_settle_s = state_settle_s
        self._stop = stop
        self._time_left = time_left
        self._reset_at_assignment = reset_at_assignment
        self._handover_left = handover_left
        #: Assigned partitions whose run state or look-back a stop cut short: their records
        #: must not be handled (nor, hence, committed).
        self.abandoned: set[Partition] = set()

    async def assigned(self, partitions: list[Partition]) -> dict[Partition, int]:
        if not partitions:
            return {}
        self.abandoned.difference_update(partitions)
        if self._state is not None:
            if not await self._unless_stopped(self._state.restore([p for _, p in partitions], time.monotonic())):
                return self._abandon(partitions)
        if self._lookback is not None:
            # Before any of their records: the runs begun before the committed offsets.
            # (Not those that start elsewhere: nothing before their start was delivered.)
            reset = self._reset_at_assignment()
            if not await self._unless_stopped(self._lookback.prime([p for p in partitions if p not in reset])):
                return self._abandon(partitions)
        return {}

    async def _unless_stopped(self, work: Coroutine[Any, Any, object]) -> bool:
        """Run ``work``; False when a stop is asked for first (then ``work`` is cancelled)."""
        if self._stop.is_set():
            work.close()
            return False
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
        if task.cancelled() or not task.done():
            await asyncio.gather(task, return_exceptions=True)  # its cancellation does not wait for threads
            return False
        task.result()  # its failure, if any
        return True

    def _abandon(self, partitions: list[Partition]) -> dict[Partition, int]:
        """A stop came while newly assigned ``partitions`` were being restored or read back:
        given up (the relay exits within its time, whatever the broker does). None of their
        records is handled (they are read again after the restart), so nothing of them is
        committed; what was restored or read back of them is forgotten."""
        self.abandoned.update(partitions)
        # What restore() put in the lanes' run state (and its outboxes) is taken back and
        # forgotten unwritten, as a lost partition's: the shutdown's settle neither writes
        # those records again nor sends their output.
        self._take_back(partitions)
        if self._state is not None:
            self._state.forget_revoked([p for _, p in partitions])
        self._abort(set(partitions), "abandoned_deliveries_aborted")
        log_event(log, logging.INFO, "assignment_abandoned", partitions=format_partitions(partitions),
                  hint="stopping: their records are read again after the restart")
        return {}

    async def revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        if not partitions:
            return {}
        released: list[bool] = []
        try:
            return await self._revoke(partitions, released)
        except BaseException:
            # Failed, or cancelled (outlasted max.poll.interval.ms): the group hands them to
            # another member all the same. Given up as if lost: their queued and held events
            # taken back and their runs forgotten (if that was not done yet), no retry of ours
            # lands after the new owner's events, nothing of them is written or committed any more.
            try:
                if not released:
                    self._release(partitions)
            finally:
                self._give_up(partitions, "revoke_deliveries_aborted")
            raise

    async def _revoke(self, partitions: list[Partition], released: list[bool]) -> dict[Partition, int]:
        # All of it within the handler's time (max.poll.interval.ms, less a margin): past
        # it, the consumer gives the handler up and the relay stops. The state's settles get
        # a quarter of that each at most; the wait for deliveries what is left between them.
        began = time.monotonic()
        handler_by = began + self._handover_left()
        settle_reserve = 0.0
        if self._state is not None:
            settle_reserve = min(self._state_settle_s, (handler_by - began) / 4)
            # Written and acknowledged before the final commit and before the new owner reads it.
            await self._settle(self._state.settle, settle_reserve)
        self._release(partitions)
        released.append(True)
        # The new owner reads these partitions once this returns, and delivers their runs
        # again from the last commit. A delivery of ours still under way (a retry against a
        # failing collector) could land after the new owner's later events of the same run:
        # a START after its COMPLETE. So wait for those, up to drain_timeout_s; what they
        # deliver meanwhile is committed below, and not sent again.
        # Not on the way out, nor once a stop is asked for during the wait: the drain waits
        # (for what is left of drain_timeout_s since the stop was asked for).
        parts = set(partitions)
        wait_s = max(0.0, min(self._drain_timeout_s, REVOKE_WAIT_MAX_S,
                              handler_by - settle_reserve - time.monotonic()))
        deadline = time.monotonic() + wait_s
        sending = sum(lane.sending(parts) for lane in self._lanes)
        if sending and wait_s and not self._stop.is_set():
            log_event(log, logging.INFO, "revoke_waiting_for_deliveries", events=sending, timeout_s=round(wait_s, 1))
            while sending and time.monotonic() < deadline and not self._stop.is_set():
                await asyncio.sleep(0.05)  # verdicts arrive on this loop
                sending = sum(lane.sending(parts) for lane in self._lanes)
        # Still under way: stopped, so that no retry of ours lands after the new owner's
        # later events of the same run; the new owner sends them again.
        self._abort(parts, "revoke_deliveries_aborted")
        if self._state is not None:
            # What was delivered meanwhile is out of the runs' records the new owner restores
            # (their entries were kept for that), or it would send it again.
            await self._settle(partial(self._state.settle_revoked, [p for _, p in partitions]),
                               handler_by - time.monotonic())
        return self._tracker.revoke(partitions)

    async def _settle(self, settle: Callable[..., Awaitable[bool]], within_s: float) -> None:
        """``settle`` for at most ``state_settle_s`` and ``within_s``."""
        timeout_s = max(0.0, min(self._state_settle_s, within_s))
        if self._stop.is_set():  # on the way out (leaving the group): within the shutdown's time
            await settle(min(timeout_s, self._time_left()))
        else:  # given up when a stop is asked for meanwhile: the shutdown settles it again
            await settle(timeout_s, stop=self._stop)

    async def lost(self, partitions: list[Partition]) -> dict[Partition, int]:
        # Another member may own them already: write nothing, commit nothing, and stop our
        # deliveries of them at once (the new owner may be sending the same runs already).
        self._release(partitions)
        self._give_up(partitions, "lost_deliveries_aborted")
        return {}

    def _give_up(self, partitions: list[Partition], message: str) -> None:
        """Forget ``partitions`` unwritten and uncommitted, their deliveries stopped."""
        if self._state is not None:
            self._state.forget_revoked([p for _, p in partitions])
        self._tracker.revoke(partitions)
        self._abort(set(partitions), message)

    def _abort(self, partitions: set[Partition], message: str) -> None:
        aborted = sum(lane.abort(partitions) for lane in self._lanes)
        if aborted:
            log_event(log, logging.WARNING, message, events=aborted,
                      hint="stopped while still being retried: the partitions' new owner sends them again "
                           "(a request already on its way may still reach the collector: a duplicate)")

    def _release(self, partitions: list[Partition]) -> None:
        """Take back the queued and held events of ``partitions`` (read again later)."""
        self.abandoned.difference_update(partitions)
        dropped = self._take_back(partitions)
        if dropped:
            log_event(log, logging.INFO, "revoked_events_released", events=dropped)

    def _take_back(self, partitions: list[Partition]) -> int:
        """The lanes' revoke of ``partitions`` (and the look-back's forget); returns how many
        events were taken back."""
        if self._lookback is not None:
            self._lookback.forget(partitions)
        return sum(lane.revoke(set(partitions)) for lane in self._lanes)
