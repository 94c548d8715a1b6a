"""One collector's lane: route -> dedupe -> per-run ordering -> ordered concurrent delivery.

With route rules naming ``dataset_namespace``, routing is decided per run
(:class:`RunRouter`): events wait there until their run is decided, and go on to dedupe
and ordering once it is routed.

The per-run stage depends on the collector's ``mode``: ``passthrough`` orders each run with
:class:`RunSequencer`; ``consolidated`` and ``coalesce`` hold runs in a
:class:`RunConsolidator` instead (it puts the START first and nothing after the terminal
itself), whose state a :class:`RunStateTable` makes durable (:mod:`relay.state`): what it
forwards is sent once the state holding it is written, and a run's dedupe memory is its
state's ``seen`` digests; an OTHER of a finished run (forwarded in coalesce mode) goes through
the pipeline's deduper instead, as a passthrough collector's events do: that state is gone.

Every event offered to a lane takes one obligation on its offset ticket, released when
the lane is done with it: delivered, dead-lettered, captured in durable run state, or
deliberately not forwarded (duplicate, after-terminal), each counted under its reason.
What a lane gives back when partitions are revoked or lost: :mod:`relay.lane_takeback`.
"""

from __future__ import annotations

import logging
import time
from operator import attrgetter

import orjson

from relay.config import CollectorConfig, PipelineConfig
from relay.dispatch import RunOrderedDispatcher
from relay.events import LineageEvent
from relay.lane_takeback import PartitionTakeBack
from relay.logs import log_event
from relay.memory import release_after
from relay.metrics import CollectorMetrics
from relay.sinks.base import Collector, Undeliverable, relay_error
from relay.sinks.deadletter import DeadLetterWriter
from relay.stages import run_state
from relay.stages.consolidate import RunConsolidator
from relay.stages.decisions import DeadLetter, Drop, Forward
from relay.stages.dedupe import Deduper
from relay.stages.rewrite import Rewriter
from relay.stages.route import Router, start_router
from relay.stages.run_route import HELD, RunRouter
from relay.stages.sequence import RunSequencer
from relay.state.table import RunStateTable

log = logging.getLogger("relay.lane")
_body = attrgetter("body")


class CollectorLane(PartitionTakeBack):
    def __init__(self, collector: Collector, config: CollectorConfig, *, pipeline: PipelineConfig,
                 metrics: CollectorMetrics, dead_letters: DeadLetterWriter) -> None:
        self.name = collector.name
        self.collector = collector
        self.max_pending = config.max_pending
        d, o = pipeline.dedupe, pipeline.ordering
        router = Router(config.route, config.event_kinds)
        self._route = router
        self._run_router: RunRouter | None = None
        if router.by_run:
            self._run_router = RunRouter(router, hold_timeout_s=o.hold_timeout_s, max_held_events=o.max_held_events,
                                         max_tracked_runs=o.max_tracked_runs, finished_ttl_s=o.finished_ttl_s)
            # Routed by run before offer()'s stages, which then route nothing: lanes without
            # such rules keep offer() as it is, with no per-event cost for this.
            self.offer = self._offer_by_run  # type: ignore[method-assign]
        #: offer()'s per-event routing; None when everything is routed, or routed by run.
        self._router = None if router.routes_everything or self._run_router is not None else router
        rewriter = Rewriter(config.rewrite)
        self._rewriter = None if rewriter.is_noop else rewriter
        self._metrics = metrics
        self._dlq = dead_letters
        self._deduper = Deduper(ttl_s=d.ttl_s, max_entries=d.max_entries) if d.enabled else None
        # Without a rewrite, an event's body is what it sends (a C-level getter: no Python
        # call per event).
        self._dispatcher = RunOrderedDispatcher(collector.deliver, config.concurrency,
                                                prepare=self._prepare if self._rewriter is not None else _body,
                                                settle=self._delivered,
                                                deliver_soon=getattr(collector, "deliver_soon", None),
                                                failed=relay_error)
        self._sequencer = self._consolidator = self.table = None
        #: A passthrough collector's runs saved while it had another mode (restored by the
        #: run-state store, when the relay keeps one): their output is sent, then forgotten.
        self.former: RunStateTable | None = None
        #: Runs whose state the last revoke gave up (see _moved).
        self._moved_runs: set[str] = set()
        self._moved_former: set[str] = set()  # and a former mode's (see _moved)
        #: Events on their way to the dead-letter topic (by id), until it has them.
        self._dead_lettering: dict[int, LineageEvent] = {}
        if config.mode != "passthrough":
            k = config.consolidation
            self._consolidator = RunConsolidator(
                mode=config.mode, settle_s=k.settle_s, coalesce_window_s=k.coalesce_window_s,
                missing_start_timeout_s=k.missing_start.timeout_s, on_missing_start=k.missing_start.policy,
                parent_hold_s=k.parent_hold_s, max_open_runs=k.max_open_runs, run_ttl_s=k.run_ttl_s,
                max_finished_runs=k.max_finished_runs, finished_ttl_s=k.finished_ttl_s)
            self.table = RunStateTable(self.name, self._consolidator, self._dispatcher.submit)
            self._synthesized = 0
        else:
            self.former = RunStateTable(self.name, RunConsolidator(mode="passthrough"), self._dispatcher.submit)
        if config.mode == "passthrough" and o.enabled:
            self._sequencer = RunSequencer(
                hold_timeout_s=o.hold_timeout_s, on_hold_timeout=o.on_hold_timeout,
                max_held_events=o.max_held_events, max_tracked_runs=o.max_tracked_runs,
                finished_ttl_s=o.finished_ttl_s, terminal_grace_s=o.terminal_grace_s,
                forward_other_after_terminal=o.forward_other_after_terminal)
        #: Which START left out is left out by its event type alone, so still begins its run
        #: (see _left_out); None without rules naming event_types (then nothing is done, at
        #: no cost per event) or without a sequencer (consolidated/coalesce: not handled).
        self._starts = start_router(config.route, config.event_kinds) if self._sequencer is not None else None

    async def start(self) -> None:
        await self.collector.start()
        self._dispatcher.start()

    @property
    def pending(self) -> int:
        return self._dispatcher.pending

    @property
    def held(self) -> int:
        """Events held for their run's START, or for their run's routing."""
        held = self._sequencer.held_count if self._sequencer else 0
        if self._run_router is not None:
            held += self._run_router.held_count
        return held

    @property
    def state_table(self) -> RunStateTable | None:
        """The table the run-state store writes and restores: the run state of a
        consolidated/coalesce collector, or a passthrough one's runs of a former mode."""
        return self.table if self.table is not None else self.former

    @property
    def open_runs(self) -> int:
        return self._consolidator.open_runs if self._consolidator else 0

    def offer(self, event: LineageEvent, now: float) -> None:
        if self._router is not None:
            reason = self._router.accepts(event)
            if reason is not None:
                self._metrics.dropped(reason).inc()
                if self._starts is not None:
                    self._left_out(event, now)
                return
        if self.table is not None and event.run_id is not None and event.kind == "run":
            if self.table.refill(event):  # left out of its run's restored record: sent in its place
                event.ticket.acquire()  # settled once delivered, as any forwarded event's
                return
            if self.table.is_duplicate(event):
                self._metrics.deduplicated.inc()
                return
            if self._deduper is not None and event.event_type == "OTHER" and self._consolidator.finished(event.run_id) \
                    and self._deduper.check_and_remember(event.digest, now, event.source):
                # Forwarded after its run's terminal (coalesce): the run's digests went with
                # its state, so a copy of it is caught as a passthrough collector's would be.
                self._metrics.deduplicated.inc()
                return
            event.ticket.acquire()
            self._apply_run_actions(self._consolidator.offer(event, now))
            return
        former = self.former
        if former is not None and former.has_marks and event.run_id is not None and former.refill(event):
            event.ticket.acquire()  # left out of a record saved in a former mode: sent in its place
            return
        if self._deduper is not None and self._deduper.check_and_remember(event.digest, now, event.source):
            self._metrics.deduplicated.inc()
            if event.event_type == "START" and self._sequencer is not None and event.run_id is not None:
                # This collector has the run's START (delivered or under way) though the
                # sequencer may not know the run: read again after a revoke took back its
                # early terminal, which forgets it. Its events must not wait for another.
                self._apply(self._sequencer.pass_start(event.run_id, now))
            return
        event.ticket.acquire()
        sequencer = self._sequencer
        if sequencer is None or sequencer.admit(event, now):
            self._dispatcher.submit(event)
            return
        self._apply(sequencer.offer(event, now))

    def _offer_by_run(self, event: LineageEvent, now: float) -> None:
        """:meth:`offer` when routing is decided per run: a held event keeps an obligation
        on its ticket until its run is decided; a routed one goes on to offer's stages."""
        verdict, due = self._run_router.offer(event, now)
        if verdict is HELD:
            event.ticket.acquire()  # before due: the overflow may drop it at once
        if due:
            self._run_routed(due, now)
        if verdict is None:
            CollectorLane.offer(self, event, now)
        elif verdict is not HELD:
            self._metrics.dropped(verdict).inc()
            if self._starts is not None:
                self._left_out(event, now)

    def _left_out(self, event: LineageEvent, now: float, *, primed: bool = False) -> None:
        """A RunEvent this collector's route leaves out. A START left out by its event type
        alone still begins the run for the ordering: with ``event_types: [COMPLETE]``
        (OpenMetadata's) the routed events would otherwise wait ``hold_timeout_s`` for a
        START that never comes here (and be dead-lettered with ``on_hold_timeout:
        dead_letter``). A START left out otherwise (another job namespace) is its whole
        run's: tracking it would only push routed runs out of ``max_tracked_runs``. A
        terminal left out (FAIL under a COMPLETE-only route) does not end the run here (a
        revoke could not reopen it) but has it forgotten ``finished_ttl_s`` later, or it
        would stay tracked, open, for ever. ``primed``: read back by the look-back (see
        :meth:`prime`)."""
        run_id = event.run_id
        if run_id is None:
            return
        if event.event_type == "START":
            if self._starts.may_route(event):
                if primed:
                    self._sequencer.prime(event, now)
                else:
                    self._apply(self._sequencer.pass_start(run_id, now))
        elif event.is_terminal:
            self._sequencer.end_left_out(run_id, now)

    def _run_routed(self, decisions: list, now: float) -> None:
        """Held events whose run was decided: routed ones go on to offer's stages (in
        order), the others are counted as not routed."""
        for decision in decisions:
            event = decision.event
            if type(decision) is Forward:
                if self.table is not None and event.doc is None:
                    # Run state keeps the parsed tree, which the relay let go once the event
                    # was offered (see Relay._handle).
                    event.doc = orjson.loads(event.body)
                    CollectorLane.offer(self, event, now)
                    event.doc = None
                else:
                    CollectorLane.offer(self, event, now)
            else:
                self._metrics.dropped(decision.reason).inc()
                if self._starts is not None:
                    self._left_out(event, now)
            event.ticket.release()

    def prime(self, event: LineageEvent, now: float) -> None:
        """``event`` came before the committed offset (read back on assignment, see
        :mod:`relay.source.lookback`): this collector had it, or it was dead-lettered or
        not forwarded on purpose. Learn what forwarding it taught (its run's progress, its
        digest) without sending anything. Consolidated/coalesce collectors restore their
        run state instead."""
        if self._run_router is not None:
            if not self._run_router.prime(event, now):
                if self._starts is not None:
                    self._left_out(event, now, primed=True)  # it began (or ended) the run all the same
                return
        elif self._router is not None and self._router.accepts(event) is not None:
            if self._starts is not None:
                self._left_out(event, now, primed=True)
            return
        if self.table is not None and event.run_id is not None and event.kind == "run":
            return
        if self._deduper is not None:
            src = event.source
            if src is not None:
                # Only for its own partition: a copy elsewhere may not have reached the
                # collector although this one's offset was committed (see Deduper).
                self._deduper.remember_settled(event.digest, now, src.topic, src.partition)
            else:
                self._deduper.check_and_remember(event.digest, now)
        if self._sequencer is not None:
            self._sequencer.prime(event, now)

    @property
    def learns_from_lookback(self) -> bool:
        """Whether :meth:`prime` can teach this lane anything."""
        return self._deduper is not None or self._sequencer is not None or self._run_router is not None

    def held_runs(self) -> list[tuple[str, float, LineageEvent]]:
        """Runs holding events for their START: id, since when, first event held."""
        return self._sequencer.held_since() if self._sequencer is not None else []

    def routes(self, event: LineageEvent) -> bool:
        """Whether this collector takes ``event`` by its route (pure: safe from another
        thread, as the run search's). Routed by run: whether it may have (see
        :meth:`Router.may_route`). A START left out by its event type alone counts: it
        begins its run here all the same (see :meth:`_left_out`). A terminal left out does
        not: it does not end the run here either, so the run search must not take the run
        for finished (its held events would be dropped as after_terminal)."""
        if self._starts is not None and event.event_type == "START" and self._starts.may_route(event):
            return True
        if self._run_router is not None:
            return self._route.may_route(event)
        return self._router is None or self._router.accepts(event) is None

    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> None:
        """Held run ``run_id`` began before the committed offset, further back than the
        look-back read (found by :mod:`relay.source.run_search`): release its hold."""
        if self._sequencer is not None:
            self._apply(self._sequencer.learn_earlier(run_id, finished=finished, now=now))
            self._metrics.held.set(self.held)

    def offer_again(self, event: LineageEvent, now: float) -> None:
        """:meth:`offer` for a record ``dlq redrive --to-topic`` wrote back: the operator
        wants it delivered although its content was seen before (it was dead-lettered, not
        delivered), so its digest is forgotten first and, for a START or a terminal, what
        forwarding the original taught the sequencer (its run begins again, or is open
        again). Consolidated/coalesce collectors take it by their run state."""
        if self._deduper is not None:
            self._deduper.forget(event.digest)
        if self._sequencer is not None:  # and a run it forgot counts as started: see RunSequencer.redriven
            self._apply(self._sequencer.redriven(event, now))
        self.offer(event, now)

    def expire(self, now: float) -> None:
        if self._run_router is not None:
            self._run_routed(self._run_router.expire(now), now)
        if self._sequencer is not None:
            self._apply(self._sequencer.expire(now))
        if self._sequencer is not None or self._run_router is not None:
            self._metrics.held.set(self.held)
        if self._consolidator is not None:
            self._apply_run_actions(self._consolidator.tick(now))
            self._metrics.open_runs.set(self._consolidator.open_runs)
        self._metrics.pending.set(self._dispatcher.pending)

    def _apply_run_actions(self, actions: list[run_state.Action]) -> None:
        table = self.table
        for action in actions:
            kind = type(action)
            if kind is run_state.Forward:
                table.forwarded(action.event)  # sent once durable
            elif kind is run_state.Release:
                table.captured(action.event)  # its ticket settles once durable
            elif kind is run_state.Drop:
                self._metrics.dropped(action.reason).inc()
                action.event.ticket.release()
            else:
                self._metrics.runs_expired(action.reason).inc()
                table.touched(action.run_id)
                log_event(log, logging.INFO, "run_expired", collector=self.name, run_id=action.run_id,
                          reason=action.reason, detail=action.detail)
        synthesized = self._consolidator.starts_synthesized
        if synthesized != self._synthesized:
            self._metrics.starts_synthesized.inc(synthesized - self._synthesized)
            self._synthesized = synthesized

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
        table = self.state_table
        if table is not None and event.run_id is not None:
            # The dispatcher lets runs waiting for it go right after this: so must the table.
            table.leaving(event)
        dead_lettering = self._dead_lettering
        dead_lettering[id(event)] = event

        def written() -> None:
            dead_lettering.pop(id(event), None)
            self._settled(event)
        self._dlq.send(event.original, event.key, reason=reason, detail=detail, source=event.source,
                       collector=self.name, on_done=written)

    def _settled(self, event: LineageEvent) -> None:
        """``event`` reached the collector or the dead-letter topic."""
        table = self.table if self.table is not None else self.former
        if table is not None and event.run_id is not None and table.holds_output and table.delivered(event):
            return  # its ticket settles with its run's next record (see RunStateTable.delivered)
        if event.ticket is not None:  # None: built from a held run
            event.ticket.release()

    def _prepare(self, event: LineageEvent) -> bytes | None:
        """The body to send for ``event``, rewritten for this collector (the dispatcher's
        ``prepare`` only when there is a rewrite), or None when the rewrite refused it (then
        it is dead-lettered)."""
        body = event.body
        result = self._rewriter.apply(orjson.loads(body), original=body, big_int=event.big_int)
        release_after(len(body))
        if result.rejection is not None:
            self._dead_letter(event, *result.rejection)
            return None
        if result.dropped:
            self._metrics.facets_dropped.inc(len(result.dropped))
        return result.body

    def _delivered(self, event: LineageEvent, failure: Undeliverable | None) -> None:
        """The collector's verdict on ``event``'s body (see :meth:`_prepare`)."""
        if failure is None:
            self._metrics.delivered.record(time.monotonic() - event.consumed_at)
            self._settled(event)
        else:
            log_event(log, logging.WARNING, "delivery_failed", collector=self.name, reason=failure.reason,
                      status=failure.status, source=str(event.source))
            self._dead_letter(event, failure.reason, failure.detail)

    async def drain(self, timeout_s: float) -> bool:
        return await self._dispatcher.wait_idle(timeout_s)

    async def close(self) -> None:
        await self._dispatcher.stop()
        await self.collector.close()
