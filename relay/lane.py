"""One collector's lane: dedupe -> per-run ordering -> ordered concurrent delivery.

Every event offered to a lane takes one obligation on its offset ticket, released when
the lane is done with it: delivered, dead-lettered, or deliberately not forwarded
(duplicate, after-terminal), each counted under its reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from relay.config import CollectorConfig, PipelineConfig
from relay.dispatch import RunOrderedDispatcher
from relay.events import LineageEvent
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.base import Collector
from relay.sinks.deadletter import DeadLetterWriter
from relay.stages.dedupe import Deduper
from relay.stages.rewrite import Rewriter
from relay.stages.route import Router
from relay.stages.sequence import DeadLetter, Drop, Forward, RunSequencer

log = logging.getLogger("relay.lane")


class CollectorLane:
    def __init__(self, collector: Collector, config: CollectorConfig, *, pipeline: PipelineConfig,
                 metrics: CollectorMetrics, dead_letters: DeadLetterWriter) -> None:
        self.name = collector.name
        self.collector = collector
        self.max_pending = config.max_pending
        router = Router(config.route)
        self._router = None if router.routes_everything else router
        rewriter = Rewriter(config.rewrite)
        self._rewriter = None if rewriter.is_noop else rewriter
        self._metrics = metrics
        self._dlq = dead_letters
        d, o = pipeline.dedupe, pipeline.ordering
        self._deduper = Deduper(ttl_s=d.ttl_s, max_entries=d.max_entries) if d.enabled else None
        self._sequencer = RunSequencer(
            hold_timeout_s=o.hold_timeout_s, on_hold_timeout=o.on_hold_timeout, max_held_events=o.max_held_events,
            max_tracked_runs=o.max_tracked_runs, finished_ttl_s=o.finished_ttl_s,
            terminal_grace_s=o.terminal_grace_s,
            forward_other_after_terminal=o.forward_other_after_terminal) if o.enabled else None
        self._dispatcher = RunOrderedDispatcher(self._deliver, config.concurrency)

    async def start(self) -> None:
        await self.collector.start()
        self._dispatcher.start()

    @property
    def pending(self) -> int:
        return self._dispatcher.pending

    @property
    def held(self) -> int:
        return self._sequencer.held_count if self._sequencer else 0

    def offer(self, event: LineageEvent, now: float) -> None:
        if self._router is not None:
            reason = self._router.accepts(event)
            if reason is not None:
                self._metrics.dropped(reason).inc()
                return
        if self._deduper is not None and self._deduper.check_and_remember(event.digest, now):
            self._metrics.deduplicated.inc()
            return
        event.ticket.acquire()
        if self._sequencer is None:
            self._dispatcher.submit(event)
            return
        self._apply(self._sequencer.offer(event, now))

    def expire(self, now: float) -> None:
        if self._sequencer is not None:
            self._apply(self._sequencer.expire(now))
            self._metrics.held.set(self._sequencer.held_count)
        self._metrics.pending.set(self._dispatcher.pending)

    def _apply(self, decisions: list) -> None:
        for decision in decisions:
            event = decision.event
            if type(decision) is Forward:
                self._dispatcher.submit(event)
            elif type(decision) is Drop:
                self._metrics.dropped(decision.reason).inc()
                event.ticket.release()
            elif type(decision) is DeadLetter:
                self._dead_letter(event, decision.reason, decision.detail)

    def _dead_letter(self, event: LineageEvent, reason: str, detail: str) -> None:
        self._dlq.send(event.original, event.key, reason=reason, detail=detail, source=event.source,
                       collector=self.name, on_done=event.ticket.release)

    async def _deliver(self, event: LineageEvent) -> None:
        body = event.body
        if self._rewriter is not None:
            result = self._rewriter.apply(orjson.loads(body), original=body)
            if result.rejection is not None:
                self._dead_letter(event, *result.rejection)
                return
            if result.dropped:
                self._metrics.facets_dropped.inc(len(result.dropped))
            body = result.body
        failure = await self.collector.deliver(body)
        if failure is None:
            self._metrics.forwarded.inc()
            self._metrics.latency.observe(time.monotonic() - event.consumed_at)
            event.ticket.release()
        else:
            log_event(log, logging.WARNING, "delivery_failed", collector=self.name, reason=failure.reason,
                      status=failure.status, source=str(event.source))
            self._dead_letter(event, failure.reason, failure.detail)

    def revoke(self, owned_by_revoked: Callable[[LineageEvent], bool]) -> int:
        """Drop queued and held events of revoked partitions (the new owner re-reads them)
        and forget their digests so that a re-read here is not taken for a duplicate."""
        dropped = self._dispatcher.remove_where(owned_by_revoked)
        if self._sequencer is not None:
            dropped += self._sequencer.discard(owned_by_revoked)
        if self._deduper is not None:
            for event in dropped:
                self._deduper.forget(event.digest)
        return len(dropped)

    async def drain(self, timeout_s: float) -> bool:
        return await self._dispatcher.wait_idle(timeout_s)

    async def close(self) -> None:
        await self._dispatcher.stop()
        await self.collector.close()
