"""``lineage-relay dlq redrive``: re-send selected dead-letter records, once.

Straight to a collector (the one named in the record, or ``--collector``; a record without
one, rejected before any collector saw it, goes to every collector whose route takes it)
or back to the input topic (``--to-topic``), where the relay processes it like any new
record. A dead letter written without its value (header ``value_omitted``) is re-driven
from the original, read back from the source topic at ``source``; one no longer there
(retention) is a failure naming where it was. A record is re-driven at most once, across
runs (:mod:`relay.ops.ledger`); records that fail again stay pending for the next redrive.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from relay.config import RelayConfig
from relay.events import REDRIVEN_FROM, LineageEvent, Rejection, SourceRef
from relay.kafka_log import with_log
from relay.ops import OpsError, kafka_error_text
from relay.ops.dead_letters import DeadLetter, scan
from relay.ops.delivery import BatchDelivery, Failure, collector_config, plan
from relay.ops.kafka_range import PartitionRange, open_consumer, parse_refs, read, watermarks
from relay.ops.ledger import RedriveLedger, group_id
from relay.ops.progress import ProgressBar
from relay.stages.decode import decode_record
from relay.stages.route import Router

_FAILURES_SHOWN = 20


@dataclass
class RedriveSummary:
    scanned: int = 0
    already: int = 0
    not_selected: int = 0
    redriven: int = 0
    not_routed: int = 0
    failures: list[tuple[DeadLetter, str]] = field(default_factory=list)
    #: ``--offsets`` that name no record of the dead-letter topic.
    missing: list[str] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)

    def render(self, target: str, dry_run: bool, group: str) -> str:
        verb = "would re-drive" if dry_run else "re-driven"
        rows = [("records scanned", self.scanned), ("already re-driven", self.already),
                ("not selected", self.not_selected), (verb, self.redriven),
                ("routed to no collector", self.not_routed), ("failed", len(self.failures))]
        lines = [f"redrive -> {target}{' (dry run)' if dry_run else ''}"]
        lines += [f"  {name:<22} {value}" for name, value in rows]
        for record, why in self.failures[:_FAILURES_SHOWN]:
            lines.append(f"  FAILED {record.ref} ({record.reason}, from {record.source or '?'}): {why[:300]}")
        if len(self.failures) > _FAILURES_SHOWN:
            lines.append(f"  ... and {len(self.failures) - _FAILURES_SHOWN} more failures")
        if self.missing:
            lines.append(f"  NOT FOUND (no such dead-letter record): {', '.join(self.missing)}")
        if self.committed:
            where = ", ".join(f"{p}:{o}" for p, o in sorted(self.committed.items()))
            lines.append(f"  redrive position {where} committed (group {group})")
        return "\n".join(lines)


def select(records: list[DeadLetter], args: argparse.Namespace, ledger: RedriveLedger,
           summary: RedriveSummary) -> list[DeadLetter]:
    """The records to re-drive: matching ``--reason``/``--offsets`` and not re-driven yet."""
    wanted = set(parse_refs(args.offsets, "--offsets")) if args.offsets else None
    chosen = []
    for r in records:
        summary.scanned += 1
        if (args.reason and r.reason != args.reason) or (wanted is not None and (r.partition, r.offset) not in wanted):
            summary.not_selected += 1
        elif r.redriven:
            summary.already += 1
        else:
            chosen.append(r)
    if wanted is not None:
        seen = {(r.partition, r.offset) for r in records}
        for p, o in sorted(wanted - seen):
            if ledger.is_done(p, o):
                summary.already += 1  # below the redrive position: not even read
            else:
                summary.missing.append(f"{p}:{o}")
    return chosen


def fetch_originals(consumer: Consumer, chosen: list[DeadLetter], summary: RedriveSummary) -> list[DeadLetter]:
    """``chosen``, each dead letter written without its value given the original's, read
    back from the source topic; one no longer there is a failure (and left out)."""
    out = []
    for record in chosen:
        if record.value_omitted is None or record.value is not None:
            out.append(record)
            continue
        position = SourceRef.parse(record.source)
        if position is None:
            summary.failures.append((record, f"its value was omitted ({record.value_omitted} bytes) and its "
                                             f"source {record.source!r} names no record to read it from"))
            continue
        topic, partition, offset = position
        (low, high), = watermarks(consumer, topic, [partition]).values()
        original = None
        if low <= offset < high:
            original = next((m for m in read(consumer, topic, [PartitionRange(partition, offset, offset + 1)])
                             if m.offset() == offset), None)
        if original is None or original.value() is None:
            summary.failures.append((record, f"its value was omitted ({record.value_omitted} bytes) and the "
                                             f"original is no longer at {record.source} (offsets {low}..{high - 1} "
                                             f"remain): it cannot be re-driven"))
            continue
        record.value = original.value()
        out.append(record)
    return out


def to_topic(config: RelayConfig, chosen: list[DeadLetter], ledger: RedriveLedger | None,
             summary: RedriveSummary, bar: ProgressBar) -> None:
    """Produce each record back to its source topic (the first configured topic when
    the source is not one the relay consumes), then mark it."""
    if ledger is None:  # dry run
        summary.redriven += len(chosen)
        bar.advance(len(chosen))
        return
    topics = config.kafka.topics
    conf = {**config.kafka.producer_properties, "bootstrap.servers": config.kafka.bootstrap_servers,
            "enable.idempotence": True, "acks": "all", "linger.ms": 20}
    producer = Producer(with_log(conf))
    dlq = config.kafka.dlq_topic

    def done(record: DeadLetter, topic: str, err: KafkaError | None) -> None:
        bar.advance()
        if err is not None:
            summary.failures.append((record, f"producing to {topic} failed: {err}"))
        else:
            summary.redriven += 1
            ledger.mark(record.partition, record.offset, f"topic:{topic}")

    try:
        for record in chosen:
            source = SourceRef.parse(record.source)
            topic = source.topic if source is not None and source.topic in topics else topics[0]
            headers = [(REDRIVEN_FROM, f"{dlq}/{record.partition}/{record.offset}".encode())]
            while True:
                try:
                    producer.produce(topic, key=record.key, value=record.value, headers=headers,
                                     on_delivery=lambda err, _m, r=record, t=topic: done(r, t, err))
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        # poll(), not flush(): confluent-kafka raises a fatal error from poll() cleanly.
        deadline = time.monotonic() + 60
        while len(producer) and time.monotonic() < deadline:
            producer.poll(0.1)
    except KafkaException as err:  # e.g. made fatal by the broker's answer
        raise OpsError(f"producing to the input topic failed: {kafka_error_text(err)}; what was re-driven "
                       "before it is remembered: run redrive again") from err
    if len(producer):
        raise OpsError("some records were not acknowledged by the broker within 60s; run redrive again")


def to_collectors(config: RelayConfig, chosen: list[DeadLetter], args: argparse.Namespace,
                  ledger: RedriveLedger | None, summary: RedriveSummary, bar: ProgressBar) -> None:
    """Decode each record and deliver it to its collector(s) in run order; a record is
    marked once every collector it was meant for has it."""
    by_name = {c.name: c for c in config.collectors}
    dlq = config.kafka.dlq_topic
    routers = [(c.name, Router(c.route, c.event_kinds)) for c in config.collectors]
    remaining: dict[tuple[int, int], int] = {}
    # collector -> digest -> records carrying that content (sent once, settles all).
    per_collector: dict[str, dict[bytes, list[DeadLetter]]] = defaultdict(dict)
    events: dict[str, list[LineageEvent]] = defaultdict(list)
    for record in chosen:
        key = (record.partition, record.offset)
        result = decode_record(record.value, max_bytes=config.pipeline.max_event_bytes,
                               source=SourceRef(dlq, record.partition, record.offset))
        if type(result) is Rejection:
            summary.failures.append((record, f"still not a valid event ({result.reason}): {result.detail}"))
            bar.advance()
            continue
        name = args.collector or record.collector
        if name is not None and name not in by_name:
            summary.failures.append((record, f"collector {name!r} is not in the configuration; "
                                             f"choose one with --collector"))
            bar.advance()
            continue
        targets = [name] if name else [n for n, router in routers if router.accepts(result) is None]
        if not targets:
            summary.not_routed += 1
            bar.advance()
            if ledger is not None:
                ledger.mark(record.partition, record.offset, "no collector")
            continue
        remaining[key] = len(targets)
        for target in targets:
            sharing = per_collector[target].setdefault(result.digest, [])
            if not sharing:
                events[target].append(result)
            sharing.append(record)

    def delivered(name: str, event: LineageEvent) -> None:
        for record in per_collector[name][event.digest]:
            key = (record.partition, record.offset)
            remaining[key] -= 1
            if remaining[key] == 0:
                summary.redriven += 1
                bar.advance()
                if ledger is not None:
                    ledger.mark(record.partition, record.offset, "collector")

    def failed(name: str, failure: Failure) -> None:
        for record in per_collector[name][failure.event.digest]:
            key = (record.partition, record.offset)
            if remaining[key] > 0:
                remaining[key] = -1  # never marked: it stays pending
                bar.advance()
                summary.failures.append((record, f"collector {name}: {failure.reason}: {failure.detail}"))

    async def deliver_all() -> None:
        jobs = []
        for name, batch in events.items():
            delivery = BatchDelivery(collector_config(by_name[name], args.max_attempts), dry_run=args.dry_run)
            jobs.append(delivery.run(_chains(batch, config.pipeline.ordering.enabled),
                                     on_delivered=lambda e, n=name: delivered(n, e),
                                     on_failed=lambda f, n=name: failed(n, f)))
        await asyncio.gather(*jobs)

    asyncio.run(deliver_all())


def _chains(batch: list[LineageEvent], ordered: bool) -> list[list[LineageEvent]]:
    """Run order, but no event dropped: an operator chose each of these records. A terminal
    the relay would drop (one after the run's first) goes at the end of its run's chain,
    never in a chain of its own, which another worker would send alongside the run's START."""
    result = plan(batch, ordered=ordered)
    by_run = {chain[0].run_id: chain for chain in result.chains if chain and chain[0].run_id is not None}
    for event, _reason in result.dropped:
        chain = by_run.get(event.run_id)
        if chain is None:
            result.chains.append([event])
        else:
            chain.append(event)
    return result.chains


def run_redrive(args: argparse.Namespace, config: RelayConfig, stream: TextIO) -> int:
    if args.collector and args.to_topic:
        raise OpsError("--collector and --to-topic exclude each other: deliver straight to a collector, "
                       "or hand the records back to the relay")
    if args.collector and args.collector not in {c.name for c in config.collectors}:
        raise OpsError(f"--collector {args.collector!r} is not in the configuration; "
                       f"configured: {', '.join(c.name for c in config.collectors)}")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise OpsError("--max-attempts must be at least 1")
    wanted = set(parse_refs(args.offsets, "--offsets")) if args.offsets else None
    summary = RedriveSummary()
    consumer = open_consumer(config.kafka, group_id(config.kafka))
    try:
        ledger = RedriveLedger(config.kafka, consumer)
        records, offsets, lows = scan(
            config, consumer, ledger, from_position=True, stream=stream,
            keep_value=lambda r: (not r.redriven and args.reason in (None, r.reason)
                                  and (wanted is None or (r.partition, r.offset) in wanted)))
        chosen = select(records, args, ledger, summary)
        chosen = fetch_originals(consumer, chosen, summary)
        writer = None if args.dry_run else ledger
        if writer is not None and chosen:
            writer.open_for_writing()
        target = "the input topic each record came from" if args.to_topic else \
            f"collector {args.collector}" if args.collector else "the collector named in each record"
        try:
            with ProgressBar("dlq: re-driving", len(chosen), stream=stream) as bar:
                if args.to_topic:
                    to_topic(config, chosen, writer, summary, bar)
                else:
                    to_collectors(config, chosen, args, writer, summary, bar)
        finally:
            # Whatever happened, remember what did get through (markers, then position).
            if writer is not None:
                summary.committed = writer.checkpoint(offsets, lows)
    finally:
        consumer.close()
    print(summary.render(target, args.dry_run, ledger.group_id))
    return 1 if summary.failures or summary.missing else 0
