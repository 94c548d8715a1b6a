"""Where ``dlq redrive`` sends the records it selected: :class:`CollectorRedrive` (to
collectors, in run order) and :class:`TopicRedrive` (back to the input topic).

Both work in two steps, so that memory does not grow with the records: ``add`` takes each
selected record as the dead-letter topic is read and keeps what the step after needs (for
collectors: what orders the runs -- run, type, time, digest -- and the targets), not its
value; ``run`` sends them, reading each value back (:class:`relay.ops.stored_values.StoredValues`)
right before it is sent. Values then held: the read-ahead budget, plus one per request in
flight (the collectors' ``concurrency``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Producer

from relay import event_loop
from relay.config import RelayConfig
from relay.events import REDRIVEN_FROM, REDRIVEN_HAVE, LineageEvent, Rejection, SourceRef
from relay.kafka_log import with_log
from relay.ops import OpsError, kafka_error_text
from relay.ops.dead_letters import DeadLetter
from relay.ops.delivery import BatchDelivery, BodyUnavailable, Failure, collector_config, plan
from relay.ops.ledger import RedriveLedger
from relay.ops.progress import ProgressBar
from relay.ops.stored_values import StoredValues, ValueGone
from relay.stages.decode import decode_record
from relay.stages.route import Router

if TYPE_CHECKING:
    from relay.ops.redrive import RedriveSummary

#: How long produced records may take to be acknowledged, and a full queue to drain.
_ACK_TIMEOUT_S = 60.0
#: ``--to-topic`` waits for every record produced to be acknowledged after this many: at
#: most these can still be written after the lease is lost (relay.ops.redrive_lock).
TOPIC_FLUSH_EVERY = 50
#: The ``--to-topic`` producer's ``linger.ms``, whatever the relay's producer properties say:
#: the drain every :data:`TOPIC_FLUSH_EVERY` records waits for the records to linger.
_LINGER_MS = 20
#: How long reading a topic's partitions may take (one request).
_METADATA_TIMEOUT_S = 15.0
#: What a record dropped by ``purge()`` is reported with.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def _gone(record: DeadLetter, at: SourceRef | None, err: ValueGone | None = None) -> str:
    """Why the value of ``record`` cannot be read back to be re-driven."""
    if record.value_omitted is None:
        return f"it cannot be read back from the dead-letter topic: {err}"
    if at is None:
        return (f"its value was omitted ({record.value_omitted} bytes) and its source {record.source!r} "
                f"names no record to read it from")
    return (f"its value was omitted ({record.value_omitted} bytes) and the original is no longer there: "
            f"{err}: it cannot be re-driven")


def placement(source: SourceRef | None, topics: list[str],
              partitions_of: Callable[[str], int | None]) -> tuple[str, int | None, str | None]:
    """Where ``--to-topic`` produces a record that came from ``source``: ``(topic, partition,
    note)``. The topic is the source's when the relay consumes it, else the first of
    ``topics``; the partition is the source's number when that topic has it (a run keeps to
    the partition of its first event, and the relay replica that owns it holds the run), else
    None: the producer's partitioner picks (librdkafka's, by key: not the one of a Java
    producer, and a null key goes anywhere). ``note`` says why the record does not go back
    to exactly where it came from (None when it does). ``partitions_of(topic)``: how many
    partitions it has, None when not known."""
    if source is None:
        return topics[0], None, f"named no source record: produced to {topics[0]}, partition chosen by the partitioner"
    topic = source.topic if source.topic in topics else topics[0]
    count = partitions_of(topic)
    moved = "" if topic == source.topic else f"came from {source.topic}, which the relay does not consume: "
    if count is not None and source.partition < count:
        return topic, source.partition, (f"{moved}produced to {topic}, partition {source.partition} as in the source"
                                         if moved else None)
    gone = f"{topic} has no partition {source.partition}" if count is not None else f"{topic} is not known"
    return topic, None, f"{moved}{gone}: produced to {topic}, partition chosen by the partitioner (by key)"


class TopicRedrive:
    """``--to-topic``: each record produced back to its source topic (the first configured
    topic when the source is not one the relay consumes) and its source partition (see
    :func:`placement`), in dead-letter order, then marked. The relay sends it to the
    collectors it does not name in ``redriven_have``: for a record one configured collector
    refused (header ``collector``), that collector alone; else those an earlier redrive did
    not reach."""

    def __init__(self, config: RelayConfig, values: StoredValues, summary: RedriveSummary) -> None:
        self._config = config
        self._values = values
        self._summary = summary
        self._chosen: list[tuple[DeadLetter, SourceRef]] = []

    @property
    def count(self) -> int:
        return len(self._chosen)

    def add(self, record: DeadLetter) -> None:
        at = record.value_at(self._config.kafka.dlq_topic)
        if at is None:
            self._summary.failures.append((record, _gone(record, at)))
            return
        record.value, record.detail = None, ""  # read back when produced; the detail is not shown
        self._values.want(at)
        self._chosen.append((record, at))

    def run(self, ledger: RedriveLedger | None, bar: ProgressBar, guard: Callable[[], None] = lambda: None) -> None:
        """Produce the records; ``ledger`` None: a dry run. ``guard`` (the lease's check) is
        called right before each record is produced and while they are acknowledged: what
        it raises purges what the producer still holds, and nothing more is marked."""
        summary = self._summary
        if ledger is None:  # dry run
            summary.redriven += len(self._chosen)
            bar.advance(len(self._chosen))
            return
        topics = self._config.kafka.topics
        kafka = self._config.kafka
        names = frozenset(c.name for c in self._config.collectors)
        conf = {**kafka.producer_properties, "bootstrap.servers": kafka.bootstrap_servers,
                "enable.idempotence": True, "acks": "all", "linger.ms": _LINGER_MS}
        producer = Producer(with_log(conf))
        stopped = False
        counts: dict[str, int | None] = {}

        def partitions_of(topic: str) -> int | None:
            if topic not in counts:
                try:
                    meta = producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
                except KafkaException as err:
                    raise OpsError(f"reading the partitions of {topic} failed: {kafka_error_text(err)}; is the "
                                   f"broker reachable? What was re-driven before is remembered: run redrive "
                                   f"again") from err
                counts[topic] = len(meta.partitions) if meta is not None and meta.error is None else None
            return counts[topic]

        def done(record: DeadLetter, topic: str, err: KafkaError | None) -> None:
            bar.advance()
            if err is not None and stopped and err.code() in _PURGED:
                summary.unconfirmed += 1  # dropped by the stop: perhaps written, not known
                return
            if err is not None:
                summary.failures.append((record, f"producing to {topic} failed: {err}"))
                return
            summary.redriven += 1
            if not stopped:
                ledger.mark(record.partition, record.offset, f"topic:{topic}", record.identity)

        def drain(what: str) -> None:
            """Wait until the producer holds nothing (each record acknowledged)."""
            deadline = time.monotonic() + _ACK_TIMEOUT_S
            while len(producer):
                guard()
                if time.monotonic() > deadline:
                    raise OpsError(f"the broker acknowledged {what} within {_ACK_TIMEOUT_S:g}s; is it reachable? "
                                   f"What was re-driven before is remembered: run redrive again")
                producer.poll(0.1)  # poll(), not flush(): confluent-kafka raises a fatal error from poll() cleanly

        produced = 0  # since the producer last held nothing
        try:
            for record, at in self._chosen:
                try:
                    value = self._values.get(at)
                except ValueGone as err:
                    summary.failures.append((record, _gone(record, at, err)))
                    bar.advance()
                    continue
                topic, partition, note = placement(SourceRef.parse(record.source), topics, partitions_of)
                if note is not None:
                    summary.placements[note] += 1
                headers = [(REDRIVEN_FROM, f"{kafka.dlq_topic}/{record.partition}/{record.offset}".encode())]
                have = ledger.delivered_to(record.partition, record.offset, record.identity)
                if record.collector in names:
                    # Refused by that collector alone: the others took it (or dead-lettered it
                    # in a record of their own), so the relay must not send it to them again.
                    have = have | (names - {record.collector})
                if have:  # an earlier redrive (or the relay) reached these: the relay leaves them out
                    headers.append((REDRIVEN_HAVE, ",".join(sorted(have)).encode()))
                if produced >= TOPIC_FLUSH_EVERY:
                    drain(f"none of the last {produced} records produced")
                    produced = 0
                deadline = time.monotonic() + _ACK_TIMEOUT_S
                while True:
                    guard()
                    try:
                        producer.produce(topic, key=record.key, value=value, headers=headers,
                                         on_delivery=lambda err, _m, r=record, t=topic: done(r, t, err),
                                         **({} if partition is None else {"partition": partition}))
                        break
                    except BufferError:  # records of many MB: the queue's bytes are full
                        if time.monotonic() > deadline:
                            raise OpsError(f"the broker acknowledged none of the records produced for "
                                           f"{_ACK_TIMEOUT_S:g}s; is it reachable? What was re-driven before "
                                           f"is remembered: run redrive again") from None
                        producer.poll(0.1)
                produced += 1
                producer.poll(0)
            drain("not every record produced")
        except KafkaException as err:  # e.g. made fatal by the broker's answer
            stopped = True
            _purge(producer)
            raise OpsError(f"producing to the input topic failed: {kafka_error_text(err)}; what was re-driven "
                           "before it is remembered: run redrive again") from err
        except BaseException:
            stopped = True
            _purge(producer)
            raise


def _purge(producer: Producer) -> None:
    """Drop what ``producer`` still holds (queued, and in flight: not retried); what was on
    the wire may still be written. Their delivery reports come as ``_PURGE_*`` errors,
    counted as not confirmed."""
    try:
        producer.purge()
        deadline = time.monotonic() + 1.0  # the reports of records purged in flight come a little later
        while len(producer) and time.monotonic() < deadline:
            producer.poll(0.05)
    except KafkaException:
        pass


class CollectorRedrive:
    """Each record decoded and delivered to its collector(s) in run order; a record is
    marked once every collector it was meant for has it. A record meant for several that
    reached only some stays pending, with a collector marker for each that has it: the
    next redrive sends it to the others only."""

    def __init__(self, config: RelayConfig, args: argparse.Namespace, ledger: RedriveLedger,
                 values: StoredValues, summary: RedriveSummary) -> None:
        self._config = config
        self._args = args
        self._ledger = ledger
        self._values = values
        self._summary = summary
        self._by_name = {c.name: c for c in config.collectors}
        self._routers = [(c.name, Router(c.route, c.event_kinds)) for c in config.collectors]
        #: Records to mark before delivering (routed nowhere, or every target has them).
        self._marks: list[tuple[int, int, str, str]] = []
        #: (partition, offset) -> deliveries still to succeed (-1: one failed).
        self._remaining: dict[tuple[int, int], int] = {}
        #: Records meant for several collectors: each one that gets it is remembered.
        self._shared: set[tuple[int, int]] = set()
        #: Where the value is, for records written without it (else the record itself).
        self._originals: dict[tuple[int, int], SourceRef] = {}
        # collector -> digest -> records carrying that content (sent once, settles all).
        self._per_collector: dict[str, dict[bytes, list[DeadLetter]]] = defaultdict(dict)
        self._events: dict[str, list[LineageEvent]] = defaultdict(list)

    @property
    def count(self) -> int:
        return len(self._remaining) + len(self._marks)

    def add(self, record: DeadLetter) -> None:
        """Decode ``record`` (its value, or its original's) and plan its deliveries; keep
        neither the value nor the decoded document."""
        summary, dlq = self._summary, self._config.kafka.dlq_topic
        # Neither the key nor the detail is needed any more; the value is read back when sent.
        value, record.value, record.key, record.detail = record.value, None, None, ""
        at = record.value_at(dlq)
        if record.value_omitted is not None:
            if at is None:
                summary.failures.append((record, _gone(record, at)))
                return
            self._values.want(at)
            try:
                value = self._values.get(at)
            except ValueGone as err:
                summary.failures.append((record, _gone(record, at, err)))
                return
        result = decode_record(value, max_bytes=self._config.pipeline.max_event_bytes,
                               source=SourceRef(dlq, record.partition, record.offset))
        del value
        if type(result) is Rejection:
            summary.failures.append((record, f"still not a valid event ({result.reason}): {result.detail}"))
            return
        name = self._args.collector or record.collector
        if name is not None and name not in self._by_name:
            summary.failures.append((record, f"collector {name!r} is not in the configuration; "
                                             f"choose one with --collector"))
            return
        targets = [name] if name else [n for n, router in self._routers if router.accepts(result) is None]
        if not targets:
            summary.not_routed += 1
            self._marks.append((record.partition, record.offset, "no collector", record.identity))
            return
        have = self._ledger.delivered_to(record.partition, record.offset, record.identity)
        if have:
            targets = [t for t in targets if t not in have]
            if not targets:  # each got it in an earlier redrive, which ended before marking it
                summary.already += 1
                self._marks.append((record.partition, record.offset, "collector", record.identity))
                return
        key = (record.partition, record.offset)
        event: LineageEvent = result
        event.doc, event.body, event.raw = None, b"", None  # type: ignore[assignment] # read back when sent
        if record.value_omitted is not None:
            assert at is not None
            self._originals[key] = at
        self._remaining[key] = len(targets)
        if len(targets) > 1:
            self._shared.add(key)
        for target in targets:
            sharing = self._per_collector[target].setdefault(event.digest, [])
            if not sharing:
                self._events[target].append(event)
                self._values.want(at)
            sharing.append(record)

    def run(self, ledger: RedriveLedger | None, bar: ProgressBar, guard: Callable[[], None] = lambda: None) -> None:
        """Deliver; ``ledger`` None: a dry run (nothing is marked). ``guard`` (the lease's
        check) is called right before each HTTP request, once its value was read back."""
        for partition, offset, how, identity in self._marks:
            bar.advance()
            if ledger is not None:
                ledger.mark(partition, offset, how, identity)
        summary, remaining, per_collector = self._summary, self._remaining, self._per_collector

        def delivered(name: str, event: LineageEvent) -> None:
            for record in per_collector[name][event.digest]:
                key = (record.partition, record.offset)
                remaining[key] -= 1
                if remaining[key] == 0:
                    summary.redriven += 1
                    bar.advance()
                    if ledger is not None:
                        ledger.mark(record.partition, record.offset, "collector", record.identity)
                elif key in self._shared and ledger is not None:
                    ledger.mark_collector(record.partition, record.offset, name, record.identity)

        def failed(name: str, failure: Failure) -> None:
            for record in per_collector[name][failure.event.digest]:
                key = (record.partition, record.offset)
                if remaining[key] > 0:
                    remaining[key] = -1  # never marked: it stays pending
                    bar.advance()
                    summary.failures.append((record, f"collector {name}: {failure.reason}: {failure.detail}"))

        # One thread reads the values back (its consumer is not shared) and decodes them,
        # while the event loop goes on with the other requests.
        with ThreadPoolExecutor(1, thread_name_prefix="redrive-values") as reader:
            def body_of(event: LineageEvent) -> bytes:
                source = event.source
                assert source is not None
                at = self._originals.get((source.partition, source.offset), source)
                try:
                    value = self._values.get(at)
                except ValueGone as err:
                    raise BodyUnavailable(str(err)) from err
                result = decode_record(value, max_bytes=self._config.pipeline.max_event_bytes, source=source)
                if type(result) is Rejection:  # it decoded when the topic was read
                    raise BodyUnavailable(f"read back from {at}, it no longer decodes: {result.detail}")
                return result.body

            async def deliver_all() -> None:
                loop = asyncio.get_running_loop()

                async def load_body(event: LineageEvent) -> bytes:
                    return await loop.run_in_executor(reader, body_of, event)

                jobs = []
                for name, batch in self._events.items():
                    config = collector_config(self._by_name[name], self._args.max_attempts)
                    delivery = BatchDelivery(config, dry_run=self._args.dry_run, before_post=guard)
                    jobs.append(delivery.run(_chains(batch, self._config.pipeline.ordering.enabled),
                                             on_delivered=lambda e, n=name: delivered(n, e),
                                             on_failed=lambda f, n=name: failed(n, f), load_body=load_body))
                await asyncio.gather(*jobs)

            event_loop.run(deliver_all(), self._config.event_loop)


def _chains(batch: list[LineageEvent], ordered: bool) -> list[list[LineageEvent]]:
    """Run order, but no event dropped: an operator chose each of these records. What the
    relay's sequencer would drop after a run's terminal still goes in its run's chain,
    never in a chain of its own, which another worker would send alongside the run's START:
    a later terminal at the end, another event (RUNNING...) before the terminal.

    Not through the collector's delivery mode: a consolidating collector's dead letters are
    what the relay built for it (its START, merged terminal, merged RUNNING); merged again,
    a terminal whose START was delivered would get a second, synthesized one."""
    result = plan(batch, ordered=ordered)
    by_run = {chain[0].run_id: chain for chain in result.chains if chain and chain[0].run_id is not None}
    for event, _reason in result.dropped:
        chain = by_run.get(event.run_id)
        if chain is None:
            chain = by_run[event.run_id] = [event]
            result.chains.append(chain)
        elif event.is_terminal or not chain[-1].is_terminal:
            chain.append(event)
        else:
            chain.insert(next(i for i, e in enumerate(chain) if e.is_terminal), event)
    return result.chains
