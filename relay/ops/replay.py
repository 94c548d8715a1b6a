"""``lineage-relay replay``: re-forward a range of the topic to ONE configured collector.

For back-filling a collector added later, or one that lost data. What the collector gets
is what the relay would have sent it for that range: records decoded by the relay's
decoder, the collector's ``route`` and ``rewrite`` applied, duplicates (same content)
sent once, each run through the relay's own per-run stage for the collector's ``mode``
(:mod:`relay.ops.run_plan`): ``passthrough``, the relay's sequencer (START first, the
run's first terminal in topic order once its START is out, what it drops dropped);
``consolidated``, START plus one merged terminal per run; ``coalesce``, RUNNINGs merged;
through the relay's HTTP collector with its retries.

Guarantees and limits:

* The topic is read with ``assign()``; nothing is committed and the relay's consumer
  group is not touched, so a running relay is not disturbed.
* The range ends where the topic ended when the command started (``--to-end``), or at the
  given offsets/time, whichever comes first; reading always terminates.
* The whole range is held in memory to order each run, so it is bounded by
  ``--max-events`` (default 1,000,000): a larger range is refused, not truncated.
* The range is offered to that stage as one backlog read at once: time windows
  (``terminal_grace_s``, ``settle_s``, ``coalesce_window_s``) take in the whole range.
* A range boundary can cut a run: its events in the range are still sent in run order
  (``consolidated``/``coalesce``: a run cut by its start gets the START its
  ``missing_start`` policy gives it; one cut by the range's end, what it held, as when
  the relay expires an open run).
* Records the relay cannot decode are skipped and counted (the relay dead-lettered them;
  see ``dlq redrive``). Nothing is written to the dead-letter topic by a replay.
* Exit status: 0 when every event was delivered, 1 when some failed (listed), 2 when the
  command could not run (bad arguments, configuration, broker).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TextIO

from confluent_kafka import Consumer, KafkaException

from relay import event_loop
from relay.config import CollectorConfig, RelayConfig, load_config
from relay.errors import ConfigError
from relay.events import LineageEvent, Rejection, SourceRef
from relay.logs import setup_logging
from relay.ops import OpsError, kafka_error_text
from relay.ops.delivery import BatchDelivery, Failure, collector_config, plan_for
from relay.ops.kafka_range import PartitionRange, open_consumer, parse_offsets, parse_time, read, resolve
from relay.ops.progress import ProgressBar
from relay.stages.decode import decode_record
from relay.stages.route import Router

DEFAULT_MAX_EVENTS = 1_000_000
_FAILURES_SHOWN = 20


@dataclass(frozen=True)
class ReplayRequest:
    topic: str
    collector: CollectorConfig
    from_offsets: dict[int, int] | None = None
    from_ms: int | None = None
    to_offsets: dict[int, int] | None = None
    to_ms: int | None = None
    dry_run: bool = False
    max_events: int = DEFAULT_MAX_EVENTS


@dataclass
class ReplaySummary:
    topic: str
    collector: str
    ranges: list[PartitionRange]
    dry_run: bool = False
    mode: str = "passthrough"
    read: int = 0
    invalid: int = 0
    routed_away: int = 0
    duplicates: int = 0
    after_terminal: int = 0
    delivered: int = 0
    retries: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    def render(self) -> str:
        spans = ", ".join(f"{r.partition}:{r.start}-{r.end - 1}" if r.size else f"{r.partition}:(empty)"
                          for r in self.ranges)
        verb = "would deliver" if self.dry_run else "delivered"
        rows = [("records read", self.read),
                ("invalid (skipped)", self.invalid),
                ("routed away", self.routed_away),
                ("duplicates skipped", self.duplicates),
                ("after terminal", self.after_terminal),
                (verb, self.delivered),
                ("failed", self.failed)]
        lines = [f"replay {self.topic} -> {self.collector}{' (dry run)' if self.dry_run else ''}",
                 f"  offsets scanned    {spans or '(none)'}"]
        if self.mode != "passthrough":  # delivered counts what was sent: merged events, not read ones
            lines.append(f"  {'mode':<18} {self.mode}")
        lines += [f"  {name:<18} {value}" for name, value in rows]
        if self.retries:
            lines.append(f"  {'retries':<18} {self.retries}")
        for failure in self.failures[:_FAILURES_SHOWN]:
            lines.append(f"  FAILED {_where(failure.event)}: {failure.reason}: {failure.detail[:300]}")
        if self.failed > _FAILURES_SHOWN:
            lines.append(f"  ... and {self.failed - _FAILURES_SHOWN} more failures")
        return "\n".join(lines)


def _where(event: LineageEvent) -> str:
    """The record an event came from; a built one (merged terminal...) by its run."""
    if event.source is not None:
        return str(event.source)
    return f"{event.event_type} of run {event.run_id} (built by mode)"


def request_from_args(args: argparse.Namespace, config: RelayConfig) -> ReplayRequest:
    by_name = {c.name: c for c in config.collectors}
    if args.collector not in by_name:
        raise OpsError(f"--collector {args.collector!r} is not in the configuration; "
                       f"configured: {', '.join(by_name)}")
    topic = args.topic
    if topic is None:
        if len(config.kafka.topics) != 1:
            raise OpsError(f"the configuration consumes {', '.join(config.kafka.topics)}; choose one with --topic")
        topic = config.kafka.topics[0]
    if args.max_events < 1:
        raise OpsError("--max-events must be at least 1")
    from_offsets = parse_offsets(args.from_offset, "--from-offset") or None
    to_offsets = parse_offsets(args.to_offset, "--to-offset") or None
    # `is not None`: a blank value (an unset variable) is refused, not read as no bound.
    from_ms = parse_time(args.from_time, "--from-time") if args.from_time is not None else None
    to_ms = parse_time(args.to_time, "--to-time") if args.to_time is not None else None
    if from_offsets and to_offsets:
        backwards = sorted(p for p in from_offsets if p in to_offsets and to_offsets[p] < from_offsets[p])
        if backwards:
            raise OpsError(f"--to-offset is before --from-offset for partition(s) {backwards}")
    if from_ms is not None and to_ms is not None and to_ms <= from_ms:
        raise OpsError("--to-time must be after --from-time")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise OpsError("--max-attempts must be at least 1")
    return ReplayRequest(topic=topic, collector=collector_config(by_name[args.collector], args.max_attempts),
                         from_offsets=from_offsets, from_ms=from_ms, to_offsets=to_offsets, to_ms=to_ms,
                         dry_run=args.dry_run, max_events=args.max_events)


def collect(config: RelayConfig, request: ReplayRequest, summary: ReplaySummary,
            consumer: Consumer, stream: TextIO) -> list[LineageEvent]:
    """Read the range; return the events to deliver (decoded, routed, deduplicated)."""
    router = Router(request.collector.route, request.collector.event_kinds)
    seen: set[bytes] = set()
    # The consolidating modes merge documents: they are kept (held in memory with the range).
    keep_doc = request.collector.mode != "passthrough"
    kept: list[LineageEvent] = []
    total = sum(r.size for r in summary.ranges)
    time_bounded = request.from_ms is not None or request.to_ms is not None
    if not time_bounded and total > request.max_events:
        raise OpsError(f"the range holds {total} records, over --max-events {request.max_events}; "
                       f"narrow the range or raise --max-events (it is held in memory to order runs)")
    with ProgressBar("replay: reading", total, stream=stream) as bar:
        for msg in read(consumer, request.topic, summary.ranges, progress=bar.advance):
            summary.read += 1
            if summary.read > request.max_events:
                raise OpsError(f"the range holds more than --max-events {request.max_events} records; "
                               f"narrow the range or raise --max-events (it is held in memory to order runs)")
            source = SourceRef(msg.topic(), msg.partition(), msg.offset())
            result = decode_record(msg.value(), max_bytes=config.pipeline.max_event_bytes, source=source)
            if type(result) is Rejection:
                summary.invalid += 1
                continue
            event: LineageEvent = result
            if router.accepts(event) is not None:
                summary.routed_away += 1
                continue
            if event.digest in seen:
                summary.duplicates += 1
                continue
            seen.add(event.digest)
            if not keep_doc:
                event.doc = None  # the parsed tree is not needed any more; keep memory down
            kept.append(event)
    return kept


def replay(config: RelayConfig, request: ReplayRequest, *, stream: TextIO | None = None) -> ReplaySummary:
    """Run a replay; progress goes to ``stream`` (stderr by default)."""
    stream = stream if stream is not None else sys.stderr
    consumer = open_consumer(config.kafka, f"{config.kafka.group_id}.replay")
    try:
        ranges = resolve(consumer, request.topic, from_offsets=request.from_offsets, from_ms=request.from_ms,
                         to_offsets=request.to_offsets, to_ms=request.to_ms)
        summary = ReplaySummary(request.topic, request.collector.name, ranges, dry_run=request.dry_run,
                                mode=request.collector.mode)
        events = collect(config, request, summary, consumer, stream)
    finally:
        consumer.close()
    ordering = config.pipeline.ordering
    ordered = plan_for(events, request.collector, ordered=ordering.enabled, ordering=ordering)
    del events  # a consolidating mode holds what it merged, not every event
    summary.after_terminal = len(ordered.dropped)
    delivery = BatchDelivery(request.collector, dry_run=request.dry_run)
    label = "replay: checking" if request.dry_run else "replay: delivering"
    with ProgressBar(label, ordered.events, stream=stream) as bar:
        def delivered(_event: LineageEvent) -> None:
            summary.delivered += 1
            bar.advance()

        def failed(failure: Failure) -> None:
            summary.failures.append(failure)
            bar.advance()

        event_loop.run(delivery.run(ordered.chains, on_delivered=delivered, on_failed=failed), config.event_loop)
    summary.retries = delivery.retries
    return summary


def main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        request = request_from_args(args, config)
    except (ConfigError, OpsError) as err:
        print(f"lineage-relay replay: {err}", file=sys.stderr)
        return 2
    setup_logging("warning")  # retries are worth seeing; per-event info is not
    try:
        summary = replay(config, request)
    except (OpsError, ConfigError) as err:
        print(f"lineage-relay replay: {err}", file=sys.stderr)
        return 2
    except KafkaException as err:
        print(f"lineage-relay replay: Kafka error: {kafka_error_text(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lineage-relay replay: interrupted; events already delivered stay delivered", file=sys.stderr)
        return 130
    print(summary.render())
    return 1 if summary.failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="re-forward a range of the topic to one collector (back-fill)",
        description="Re-forward a range of the topic to ONE collector of the configuration, as the relay "
                    "would have: decoded, routed, rewritten, deduplicated, in run order and by the "
                    "collector's delivery mode (consolidated: START and one merged terminal per run; "
                    "coalesce: RUNNINGs merged). Reads with assign(); the relay's consumer group is "
                    "not touched.")
    p.add_argument("--config", required=True, help="the relay's YAML config file")
    p.add_argument("--collector", required=True, metavar="NAME", help="the collector to back-fill")
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-offset", action="append", metavar="P:O",
                       help="first offset per partition, inclusive (repeatable or comma-separated); "
                            "only the partitions named are replayed")
    start.add_argument("--from-time", metavar="ISO8601",
                       help="from the first record with a timestamp >= this, in every partition")
    end = p.add_mutually_exclusive_group(required=True)
    end.add_argument("--to-offset", action="append", metavar="P:O", help="last offset per partition, inclusive")
    end.add_argument("--to-time", metavar="ISO8601", help="up to, not including, the first record at or after this")
    end.add_argument("--to-end", action="store_true", help="up to the end of each partition when the command starts")
    p.add_argument("--topic", help="topic to read (default: the configured topic)")
    p.add_argument("--dry-run", action="store_true", help="read, route, dedupe, order and merge, but POST nothing")
    p.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                   help=f"refuse a range with more records than this (default {DEFAULT_MAX_EVENTS:,})")
    p.add_argument("--max-attempts", type=int, metavar="N",
                   help="give up on an event after N attempts (default: the collector's "
                        "retry.max_attempts, or 10 where that is unlimited)")
    p.set_defaults(ops_handler=main)
