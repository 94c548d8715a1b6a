"""When the relay stops taking records, and how: bounded memory without a costly pause."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from relay.lane import CollectorLane
from relay.logs import log_event
from relay.metrics import RelayMetrics
from relay.source.kafka import KafkaSource
from relay.source.offsets import OffsetTracker

log = logging.getLogger("relay.backpressure")

#: How long consumption is held off at a limit (see Backpressure.apply) before the
#: partitions are paused, and how often the hold checks whether the pipeline drained.
HOLD_S = 3.0
_HOLD_CHECK_S = 0.005
#: Run-state writes not yet acknowledged (the broker is slow or down) before consumption pauses.
_MAX_UNACKED_STATE_WRITES = 20_000
#: Records tracked before consumption pauses: one event retried for ever (a collector that
#: answers 500 to it alone) stops its partition's commits, and every record read after it
#: keeps its ticket (~100 bytes) until it settles, although everything else was delivered.
MAX_TRACKED_RECORDS = 500_000


class Backpressure:
    """Stops taking records while a lane (``max_pending``), the pending record bytes
    (``max_pending_bytes``), the unacknowledged run-state writes or the records tracked
    behind an unsettled one (:data:`MAX_TRACKED_RECORDS`) are at their limit, until they
    are down to half. The relay's loop calls :meth:`apply` before each poll."""

    def __init__(self, source: KafkaSource, lanes: Sequence[CollectorLane], tracker: OffsetTracker,
                 metrics: RelayMetrics, *, max_pending_bytes: int, state_unacked: Callable[[], int],
                 stopping: Callable[[], bool]) -> None:
        self._source = source
        self._lanes = lanes
        self._tracker = tracker
        self._metrics = metrics
        self._max_pending_bytes = max_pending_bytes
        self._state_unacked = state_unacked
        self._stopping = stopping
        self._stall_logged: tuple | None = None  # (partition, offset) of the last commit_stalled

    async def apply(self) -> None:
        """Returns once the relay may poll again.

        First by holding off: no poll, while what librdkafka fetched ahead (bounded by
        ``queued.max.messages.kbytes``) waits in its queue, and consumption goes on at once
        when the pipeline has drained. Only a hold longer than :data:`HOLD_S` (a collector
        down, a slow one) pauses the partitions, so that polls go on (group membership,
        rebalances) and librdkafka frees what it holds. A pause alone cost every backlog's
        drain dearly: librdkafka purges its queue and, once resumed, fetched nothing for
        0.5-1 s (its broker thread wakes on its own timer), ~40% of the time when each
        drain to half took ~0.2 s (measured draining 120,000 events to a batch collector:
        ~30,000 -> ~42,000 events/s, the machine ~35% -> ~9% idle)."""
        source, metrics = self._source, self._metrics
        if source.paused:
            if self._drained():
                await source.set_paused(False)
                metrics.paused.set(0)
            return
        if not self._at_limit():
            return
        metrics.paused.set(1)
        deadline = time.monotonic() + HOLD_S
        while not self._drained():
            if time.monotonic() >= deadline:
                await source.set_paused(True)
                return
            if self._stopping():
                break
            await asyncio.sleep(_HOLD_CHECK_S)
        metrics.paused.set(0)

    def _at_limit(self) -> bool:
        return any(lane.pending >= lane.max_pending for lane in self._lanes) \
            or self._state_unacked() >= _MAX_UNACKED_STATE_WRITES \
            or self._tracker.pending_bytes >= self._max_pending_bytes \
            or self._commits_stalled()

    def _drained(self) -> bool:
        return all(lane.pending <= lane.max_pending // 2 for lane in self._lanes) \
            and self._state_unacked() <= _MAX_UNACKED_STATE_WRITES // 2 \
            and self._tracker.pending_bytes <= self._max_pending_bytes // 2 \
            and self._tracker.outstanding() <= MAX_TRACKED_RECORDS // 2

    def _commits_stalled(self) -> bool:
        if self._tracker.outstanding() < MAX_TRACKED_RECORDS:
            return False
        stalled = self._tracker.oldest_unsettled()
        if stalled is not None and stalled[:2] != self._stall_logged:
            self._stall_logged = stalled[:2]
            (topic, partition), offset, held = stalled
            log_event(log, logging.WARNING, "commit_stalled", partition=f"{topic}/{partition}", offset=offset,
                      records_behind=held,
                      hint="one record there is still being delivered (a collector refusing it with a retriable "
                           "status?) and every record after it waits to be committed: consumption pauses; "
                           "collectors.<name>.retry.max_attempts bounds the retries (then it is dead-lettered)")
        return True
