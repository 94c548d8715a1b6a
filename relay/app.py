"""The relay: Kafka source -> decode/validate (:mod:`relay.intake`) -> per-collector lanes -> commit.

Guarantees:
- at-least-once: an offset is committed only when every record at or below it reached
  every collector (or the dead-letter topic), or was deliberately not forwarded;
- bounded memory: when a lane has ``max_pending`` undelivered events, or the records not
  yet settled weigh ``pipeline.max_pending_bytes``, consumption stops (all assigned
  partitions feed every collector) and goes on at half that: held off first (no polls;
  what the consumer fetched ahead waits in its queue), the partitions paused if that lasts
  :data:`relay.backpressure.HOLD_S`. What the relay holds is then at most that, the batch
  that crossed it and the next one (fetched and decoded while one is handled, or waiting
  in the consumer's queue; each bounded by its ``queued.max.messages.kbytes``), and the
  one event being decoded or rewritten;
- start-up gives way to a stop: one asked for while the relay starts (the broker not
  answering) ends the start at once, and :meth:`run` returns as after a stop, with nothing
  to commit (:mod:`relay.startup`);
- graceful stop: :meth:`request_stop` stops consuming, drains deliveries for up to
  ``drain_timeout_s``, commits what was delivered and closes. Deliveries still running
  then are abandoned uncommitted (re-delivered after restart). The relay has returned at
  most ``drain_timeout_s`` + :data:`CLOSE_MARGIN_S` after the stop was asked for, whatever
  the broker does: every step gets what is left of that (steps still running then are
  given up, logged; what they would have committed is read again). A failure of the main
  loop stops it the same way;
- rebalance: partitions given up in a rebalance have their queued and held events taken
  back, their deliveries under way waited for (up to ``drain_timeout_s``, 30 s at most,
  and within max.poll.interval.ms) and then stopped, and what was delivered committed,
  before the new owner reads them;
  lost partitions (another member may own them already) are given up at once
  (:mod:`relay.rebalance`);
- run state (consolidated/coalesce collectors) is written to its changelog before the
  offsets it absorbed are committed, restored when a partition is assigned and before any
  of its records is handled, and written before a revoked partition is given up
  (:mod:`relay.state`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

import orjson

from relay.backpressure import Backpressure
from relay.config import RelayConfig
from relay.event_loop import loop_name
from relay.events import LineageEvent, Rejection, SourceRef
from relay.intake import RecordIntake
from relay.lag import measure_lag
from relay.lane import CollectorLane
from relay.logs import log_event
from relay.loop_threads import call_on_daemon_thread
from relay.metrics import RelayMetrics
from relay.ops.kafka_range import open_consumer
from relay.process import GC_EVERY_S, PeriodicCollection, decode_priority
from relay.rebalance import PartitionHandover
from relay.sinks.deadletter import DeadLetterWriter
from relay.sinks.kinds import build_collector
from relay.source.broker_contact import BrokerContact
from relay.source.kafka import KafkaSource
from relay.source.lookback import Lookback
from relay.source.offsets import OffsetTracker
from relay.source.record_headers import redriven_have
from relay.source.run_search import RunSearch
from relay.stages.decode_worker import DecodeWorker
from relay.startup import StartInterrupted, component_versions, create_dead_letter_topic, until_stopped
from relay.state.changelog import RunStateChangelog
from relay.state.store import RunStateStore

log = logging.getLogger("relay.app")

#: ``SourceRef(topic, partition, offset)`` without the named tuple's Python-level
#: ``__new__`` (one per record: ~2% of the event loop's time in the batch case).
_new_ref = tuple.__new__

#: Records handled between two turns of the event loop: responses and batch sends are not
#: held up for the whole poll (8000 records take ~80 ms to handle).
_HANDLE_SLICE = 2000
_EXPIRE_EVERY_S = 0.25
_LAG_EVERY_S = 5.0
#: How long a commit or a revocation waits for run-state writes to be acknowledged.
_STATE_SETTLE_S = 20.0
#: What closing may take after the drain (``drain_timeout_s``): the final commit, leaving
#: the group (its revocation commits), flushing the dead-letter and run-state producers,
#: stopping the decode worker. With a reachable broker that takes well under a second; with
#: none, each step would wait its own timeout (~85 s measured with drain_timeout_s 20). The
#: deploy files' grace periods (SIGKILL) allow for drain_timeout_s plus this.
CLOSE_MARGIN_S = 5.0
#: A dead letter carries the original record, whatever its size: the dead-letter producer
#: and topic take what the consumer can receive (librdkafka's receive.message.max.bytes).
_DLQ_MAX_MESSAGE_BYTES = "100000000"



def held_bytes(value: bytes | None, result: LineageEvent | Rejection) -> int:
    """What a record weighs in ``pipeline.max_pending_bytes`` until it settles: its value,
    and for an Avro record the JSON it was decoded to (up to 8x the value), held beside it."""
    held = len(value) if value else 0
    if type(result) is not Rejection and result.body is not value:
        held += len(result.body)
    return held

class Relay:
    def __init__(self, config: RelayConfig, metrics: RelayMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or RelayMetrics()
        k = config.kafka
        self.tracker = OffsetTracker()
        self.dead_letters = DeadLetterWriter(
            bootstrap_servers=k.bootstrap_servers, topic=k.dlq_topic, metrics=self.metrics,
            properties={"message.max.bytes": _DLQ_MAX_MESSAGE_BYTES, **k.producer_properties})
        self.lanes = [
            CollectorLane(build_collector(c, self.metrics.for_collector(c.name)), c, pipeline=config.pipeline,
                          metrics=self.metrics.for_collector(c.name), dead_letters=self.dead_letters)
            for c in config.collectors
        ]
        self.decoder = DecodeWorker(max_bytes=config.pipeline.max_event_bytes,
                                    processes=config.pipeline.decode_processes,
                                    priority=decode_priority(config.pipeline.decode_priority,
                                                             [lane.collector for lane in self.lanes])) \
            if config.pipeline.decode_worker else None
        # Stages that read the parsed tree: consolidators, and routes by dataset namespace
        # (the decode worker keeps its tree, so it is parsed here once for all lanes).
        self._needs_doc = config.keeps_run_state or any(
            rule.dataset_namespace is not None for c in config.collectors
            for rule in (*c.route.include, *c.route.exclude))
        self.state: RunStateStore | None = None
        if config.keeps_run_state:
            changelog = RunStateChangelog(
                bootstrap_servers=k.bootstrap_servers, topic=k.run_state_topic, input_topic=k.topics[0],
                create=k.create_state_topic, producer_properties=k.producer_properties,
                consumer_properties=k.consumer_properties, replication_factor=k.topic_replication_factor,
                on_producer_replaced=self.metrics.producers_replaced.labels(producer="run_state").inc)
            self.state = RunStateStore(changelog, [lane.state_table for lane in self.lanes
                                                   if lane.state_table is not None], self.metrics)
        self._stop = asyncio.Event()
        learners = [lane for lane in self.lanes if lane.learns_from_lookback]
        self.lookback: Lookback | None = None
        if learners and config.pipeline.lookback.max_records:
            def prime(event: LineageEvent, now: float) -> None:
                for lane in learners:
                    lane.prime(event, now)
                self.metrics.lookback_events.inc()
            self.lookback = Lookback(k, config.pipeline.lookback, max_bytes=config.pipeline.max_event_bytes,
                                     prime=prime, stopping=self._stop.is_set)
        self.run_search: RunSearch | None = None
        if self.lookback is not None and config.pipeline.ordering.enabled and config.pipeline.lookback.search_records:
            found = self.metrics.lookback_runs_found
            self.run_search = RunSearch(
                k, config.pipeline.lookback, search_after_s=config.pipeline.search_after_s,
                max_bytes=config.pipeline.max_event_bytes, floors=self.lookback.floors, lanes=self.lanes,
                on_found=lambda lane, finished: found.labels(collector=lane,
                                                             result="finished" if finished else "open").inc())
        #: When the relay must have returned (monotonic; set with the stop).
        self._exit_by = float("inf")
        self._handover = handover = PartitionHandover(
            self.lanes, self.tracker, state=self.state, lookback=self.lookback, drain_timeout_s=config.drain_timeout_s,
            state_settle_s=_STATE_SETTLE_S, stop=self._stop, time_left=lambda: self._left(self._exit_by),
            reset_at_assignment=lambda: self.source.reset_at_assignment,
            handover_left=lambda: self.source.handover_left())
        resets = self.metrics.offset_resets
        #: Whether the cluster has answered yet (/readyz's ``broker_unreachable``).
        self.broker = BrokerContact(k.bootstrap_servers)
        self.source = KafkaSource(bootstrap_servers=k.bootstrap_servers, group_id=k.group_id, topics=k.topics,
                                  properties=k.consumer_properties, on_assign=handover.assigned,
                                  on_revoke=handover.revoked, on_lost=handover.lost,
                                  on_offset_reset=lambda topic, _p: resets.labels(topic=topic).inc(),
                                  open_reader=lambda: open_consumer(k, k.group_id,
                                                                    client_id="lineage-relay-offset-check"),
                                  broker=self.broker, stopping=self._stop.is_set)
        self.backpressure = Backpressure(
            self.source, self.lanes, self.tracker, self.metrics, max_pending_bytes=config.pipeline.max_pending_bytes,
            state_unacked=(lambda: self.state.changelog.unacked) if self.state is not None else (lambda: 0),
            stopping=self._stop.is_set)
        self._intake = RecordIntake(self.source, self.decoder, max_bytes=config.pipeline.max_event_bytes)
        self.started = False
        self.heartbeat = time.monotonic()
        self._gc = PeriodicCollection()

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start every part; :attr:`started` once the consumer subscribed. A stop asked for
        meanwhile ends it (logged ``relay_start_interrupted``), also during the steps that
        wait for the broker: it then returns with :attr:`started` False, and :meth:`run`
        closes what was started. Raises :class:`~relay.state.changelog.StateError` when the
        run-state topic cannot be used."""
        self._intake.start()
        self.broker.start()
        k = self.config.kafka
        try:
            if k.create_dlq_topic:
                await until_stopped(self._stop, "dlq_topic",
                                    create_dead_letter_topic(k, self.broker, max_message_bytes=_DLQ_MAX_MESSAGE_BYTES))
            await self.dead_letters.start()
            if self.decoder is not None:
                self.decoder.start()
            if self.state is not None:
                # Checked again for as long as the broker does not answer.
                await until_stopped(self._stop, "run_state_topic", self.state.start())
                self.broker.mark_answered()  # the run-state topic's metadata
            for lane in self.lanes:
                await lane.start()
            if self._stop.is_set():  # the consumer is not given up half-made: it starts at once
                raise StartInterrupted("consumer")
            await self.source.start()
        except StartInterrupted as interrupted:
            log_event(log, logging.INFO, "relay_start_interrupted", step=interrupted.step)
            return
        self.started = True
        log_event(log, logging.INFO, "relay_started", topics=",".join(k.topics), group=k.group_id,
                  collectors=",".join(c.name for c in self.config.collectors), event_loop=loop_name(),
                  **component_versions())

    def request_stop(self) -> None:
        """Stop consuming, drain and return from :meth:`run` within ``drain_timeout_s`` +
        :data:`CLOSE_MARGIN_S` from now (see the module docstring)."""
        if not self._stop.is_set():
            self._exit_by = time.monotonic() + self.config.drain_timeout_s + CLOSE_MARGIN_S
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def exit_by(self) -> float:
        """When :meth:`run` must have returned (monotonic): ``drain_timeout_s`` +
        :data:`CLOSE_MARGIN_S` after the stop was asked for; infinite before."""
        return self._exit_by

    @property
    def ready(self) -> bool:
        """Consuming its share: started, joined its group (its share may be empty: an idle
        replica is ready), every subscribed topic seen in the cluster, not stopping."""
        return (self.started and not self.stopping and self.source.joined
                and not self.source.unseen_topics)

    @staticmethod
    def _left(until: float) -> float:
        return max(0.0, until - time.monotonic())

    async def run(self) -> None:
        """Start, relay until :meth:`request_stop`, then stop gracefully (also when the stop
        came during the start, or when it failed: what it started is closed)."""
        try:
            await self.start()
            if self.started:
                await self._loop()
        finally:
            await self._shutdown()

    async def _loop(self) -> None:
        commit_every = self.config.kafka.commit_interval_s
        next_commit = next_expire = next_lag = time.monotonic()
        next_gc = next_commit + GC_EVERY_S
        intake = self._intake
        batch = intake.fetch()
        try:
            while not self._stop.is_set():
                (records, decoding), generation = await batch
                await self.backpressure.apply()
                # The next batch is consumed (and sent to the decode worker) while this one
                # is decoded and handled.
                batch = intake.fetch()
                if decoding is None:  # no decode worker: here, which costs less than on the
                    decoded = intake.decode_here(records)  # consumer's thread (GIL contention)
                else:
                    decoded = await decoding
                now = time.monotonic()
                self.heartbeat = now
                if records:
                    self.metrics.consumed.inc(len(records))
                    revoked = self._not_handled(generation)
                    for start in range(0, len(records), _HANDLE_SLICE):
                        if start:
                            await asyncio.sleep(0)
                            # A rebalance may have run meanwhile.
                            revoked = self._not_handled(generation)
                        for message, result in zip(records[start:start + _HANDLE_SLICE],
                                                   decoded[start:start + _HANDLE_SLICE]):
                            if revoked and (message.topic(), message.partition()) in revoked:
                                continue  # its new owner reads it (again)
                            self._handle(message, result, now)
                # A consumed message keeps librdkafka's copy of the record until it is freed
                # (and the decoding future holds the decoded events).
                del records, decoded, decoding
                if now >= next_expire:
                    for lane in self.lanes:
                        lane.expire(now)
                    if self.run_search is not None:
                        self.run_search.tick(now)
                    next_expire = now + _EXPIRE_EVERY_S
                if self.state is not None:
                    self.state.flush()  # what held runs forward is sent once this is acknowledged
                if now >= next_commit:
                    await self.commit(stop=self._stop)
                    next_commit = now + commit_every
                if now >= next_lag:
                    await measure_lag(self.source, self.tracker, self.metrics)
                    await self.source.check_topics()  # only while some are missing
                    next_lag = now + _LAG_EVERY_S
                if now >= next_gc:
                    self._gc.collect()
                    next_gc = now + GC_EVERY_S
        finally:
            # Fetched but not handled, hence never tracked: read again after a restart.
            await asyncio.gather(batch, return_exceptions=True)

    def _not_handled(self, generation: int) -> set:
        """Partitions whose records polled at ``generation`` are skipped: revoked or lost
        since (their new owner reads them), or assigned while a stop cut their run-state
        restore or look-back short (read again after the restart)."""
        skipped = self.source.revoked_since(generation)
        abandoned = self._handover.abandoned
        return skipped | abandoned if abandoned else skipped

    def _handle(self, message, result: LineageEvent | Rejection, now: float) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        value = message.value()
        ticket = self.tracker.track((topic, partition), offset, held_bytes(value, result), message.timestamp()[1])
        source = _new_ref(SourceRef, (topic, partition, offset))
        if type(result) is Rejection:
            ticket.acquire()
            self.dead_letters.send(value, message.key(), reason=result.reason, detail=result.detail,
                                   source=source, on_done=ticket.release)
        else:
            event: LineageEvent = result
            event.source = source
            event.ticket = ticket
            event.key = message.key()
            event.consumed_at = now
            if event.body is not value:
                event.raw = value
            if self._needs_doc and event.doc is None:
                event.doc = orjson.loads(event.body)
            have = redriven_have(message, source)
            if have is not None:
                for lane in self.lanes:
                    if lane.name not in have:
                        lane.offer_again(event, now)
            else:
                for lane in self.lanes:
                    lane.offer(event, now)
            # Only routing and consolidators read the parsed tree (they keep what they need);
            # keeping thousands of them alive in the delivery queues makes every garbage
            # collection walk them (measured: -35% throughput).
            event.doc = None
        ticket.release()

    async def commit(self, settle_s: float = _STATE_SETTLE_S, stop: asyncio.Event | None = None) -> None:
        """Commit what settled. Run-state writes are first acknowledged, for up to
        ``settle_s``, and no longer once ``stop`` is set (what is not acknowledged then is
        not committed)."""
        if self.state is not None:
            # Captured events settle their tickets only once the state holding them is durable.
            await self.state.settle(settle_s, stop=stop)
        offsets = self.tracker.committable()
        still_own = self.tracker.still_owned(offsets)
        if offsets and await self.source.commit(offsets, still_own):
            self.tracker.mark_committed({part: o for part, o in offsets.items() if still_own(part)})
            self.metrics.commits.inc()

    async def _shutdown(self) -> None:
        # After a failure of the loop too: /readyz says so, and a revocation (leaving the
        # group) does not wait for deliveries again.
        self.request_stop()
        self.broker.close()
        exit_by = self._exit_by
        drained_by = exit_by - CLOSE_MARGIN_S
        left = self._left
        log_event(log, logging.INFO, "relay_draining", pending=sum(lane.pending for lane in self.lanes),
                  held=sum(lane.held for lane in self.lanes), timeout_s=round(left(drained_by), 1))
        # Held runs' output reaches the dispatcher once written; a terminal may wait for the
        # write that follows its run's earlier deliveries, hence a second round.
        for _ in range(2 if self.state is not None else 1):
            if self.state is not None:
                await self.state.settle(left(drained_by))
            for lane in self.lanes:
                await lane.drain(left(drained_by))
        while self.dead_letters.in_flight and time.monotonic() < drained_by:
            await asyncio.sleep(0.05)  # acks arrive from the producer thread
        abandoned = sum(lane.pending for lane in self.lanes)
        # From here on each step gets what is left until exit_by, and is given up past it.
        await self._within(exit_by, "commit", self.commit(settle_s=left(drained_by)))
        for lane in self.lanes:
            await lane.close()
        await self.source.close(left(exit_by))
        await self.dead_letters.close(left(exit_by))
        if self.decoder is not None:
            closing = call_on_daemon_thread(self._close_decoder, "relay-close")
            await self._within(exit_by, "decode_worker_close", closing)
        if self.state is not None:
            await self.state.close(left(exit_by))
        if self.run_search is not None:
            self.run_search.close()
        if self.lookback is not None:
            self.lookback.close()
        log_event(log, logging.INFO, "relay_stopped", abandoned=abandoned)

    def _close_decoder(self) -> None:
        """On a daemon thread: a failure to close is logged, and the shutdown goes on."""
        assert self.decoder is not None
        try:
            self.decoder.close()
        except Exception as err:  # noqa: BLE001 - the processes die with the relay anyway
            log.error("decode_worker_close_failed", exc_info=err, extra={"fields": {"error": repr(err)}})

    async def _within(self, until: float, step: str, work: Awaitable[object]) -> None:
        """Await ``work`` until ``until`` (monotonic); past it, cancel it and log ``shutdown_step_timeout``."""
        try:
            await asyncio.wait_for(work, self._left(until))
        except asyncio.TimeoutError:
            log_event(log, logging.WARNING, "shutdown_step_timeout", step=step,
                      hint="given up to exit within drain_timeout_s + CLOSE_MARGIN_S of the stop")
