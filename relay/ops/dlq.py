"""``lineage-relay dlq list|redrive``: inspect the dead-letter topic and re-drive records.

``list`` groups the records by reason (count, first/last offset, collectors, a sample
detail) and with ``--show`` prints them, each as it is read (then the summary): it holds
no record, however large the topic. ``redrive`` re-sends the records ``--reason`` and
``--offsets`` select (or, with ``--all``, every pending one) after the cause was fixed,
once (:mod:`relay.ops.redrive`). Both commands read with ``assign()`` and never touch
the relay's consumer group.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import TextIO

from confluent_kafka import KafkaException

from relay.config import RelayConfig, load_config
from relay.errors import ConfigError
from relay.logs import setup_logging
from relay.ops import OpsError, kafka_error_text
from relay.ops.dead_letters import DeadLetter, DeadLetterScan
from relay.ops.kafka_range import LARGE_RECORD_OVERRIDES, open_consumer
from relay.ops.ledger import RedriveLedger, group_id
from relay.ops.progress import ProgressBar
from relay.ops.redrive import run_redrive

_SHOW_VALUE_CHARS = 1000


@dataclass
class ReasonGroup:
    """The records of one reason, as ``list`` summarises them."""

    first: DeadLetter
    count: int = 0
    pending: int = 0
    collectors: set[str] = field(default_factory=set)
    #: Per dead-letter partition, the first and last offset of the reason's records there
    #: (offsets of different partitions do not compare: one range would mix them).
    spans: dict[int, list[int]] = field(default_factory=dict)

    def offsets(self) -> str:
        return ", ".join(f"{p}:{first} .. {p}:{last}" for p, (first, last) in sorted(self.spans.items()))


class DeadLetterListing:
    """What ``dlq list`` prints, built one record at a time (nothing per record is kept)."""

    def __init__(self) -> None:
        self.groups: dict[str, ReasonGroup] = {}
        self.count = 0
        self.redriven = 0

    def add(self, record: DeadLetter) -> None:
        record = replace(record, key=None, value=None)
        group = self.groups.get(record.reason)
        if group is None:
            group = self.groups[record.reason] = ReasonGroup(first=record)
        span = group.spans.setdefault(record.partition, [record.offset, record.offset])
        span[0], span[1] = min(span[0], record.offset), max(span[1], record.offset)
        group.count += 1
        group.pending += not record.redriven
        if record.collector:
            group.collectors.add(record.collector)
        self.count += 1
        self.redriven += record.redriven

    def render(self, topic: str, ledger: RedriveLedger) -> str:
        positions = ", ".join(f"{p}:{o}" for p, o in sorted(ledger.positions.items()) if o is not None) or "none"
        lines = [f"dead-letter topic {topic}: {self.count} record(s), {self.redriven} re-driven "
                 f"(redrive position {positions}, group {ledger.group_id})"]
        for reason, group in sorted(self.groups.items(), key=lambda kv: -kv[1].count):
            collectors = sorted(group.collectors) or ["-"]
            lines.append(f"{reason:<24} {group.count:>7} record(s) {group.pending:>7} pending  "
                         f"offsets {group.offsets()}  collectors: {', '.join(collectors)}")
            lines.append(f"    e.g. {group.first.ref} from {group.first.source or '?'}: {group.first.detail[:200]}")
        return "\n".join(lines)


def render_record(r: DeadLetter) -> str:
    """One record as ``list --show`` prints it (the value cut to a thousand characters)."""
    state = "re-driven" if r.redriven else "pending"
    value = (r.value or b"")[:_SHOW_VALUE_CHARS * 4].decode("utf-8", "replace")
    if len(value) > _SHOW_VALUE_CHARS:
        value = value[:_SHOW_VALUE_CHARS] + f"... ({len(r.value or b'')} bytes)"
    if r.value_omitted is not None:
        value = (f"(omitted: {r.value_omitted} bytes, too large for the dead-letter topic; "
                 f"the original is at {r.source or '?'})")
    return "\n".join([f"--- {r.ref} {r.reason} [{state}] collector={r.collector or '-'} source={r.source or '-'} "
                      f"at={r.relay_time or '-'}",
                      f"    detail: {r.detail}",
                      f"    key: {(r.key or b'').decode('utf-8', 'replace')}",
                      f"    value: {value}"])


def run_list(args: argparse.Namespace, config: RelayConfig, stream: TextIO) -> int:
    """Read the topic once, printing each record as it comes (``--show``), then the
    summary: no record is held, whatever the size of the topic."""
    if args.limit is not None and args.limit < 1:  # 0 listed a full topic as empty, exit 0
        raise OpsError("--limit must be at least 1")
    listing = DeadLetterListing()
    consumer = open_consumer(config.kafka, group_id(config.kafka), overrides=LARGE_RECORD_OVERRIDES)
    try:
        ledger = RedriveLedger(config.kafka, consumer)
        scan = DeadLetterScan(config, consumer, ledger, from_position=False)
        keep = (lambda r: args.reason in (None, r.reason)) if args.show else (lambda r: False)
        with ProgressBar("dlq: reading", scan.size, stream=stream) as bar, \
                closing(scan.records(keep_value=keep, progress=bar.advance)) as records:
            for record in records:
                if args.reason and record.reason != args.reason:
                    continue
                if args.limit is not None and listing.count >= args.limit:
                    break
                listing.add(record)
                if args.show:
                    print(render_record(record))
    finally:
        consumer.close()
    print(listing.render(config.kafka.dlq_topic, ledger))
    return 0


def main(args: argparse.Namespace) -> int:
    name = f"lineage-relay dlq {args.dlq_command}"
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    setup_logging("warning")
    try:
        if args.dlq_command == "list":
            return run_list(args, config, sys.stderr)
        return run_redrive(args, config, sys.stderr)
    except (OpsError, ConfigError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    except KafkaException as err:  # e.g. a producer made fatal by the broker's answer
        print(f"{name}: Kafka error: {kafka_error_text(err)}; what was re-driven before it is remembered: "
              "run the command again", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def add_parser(sub: argparse._SubParsersAction) -> None:
    dlq = sub.add_parser("dlq", help="inspect the dead-letter topic and re-drive records",
                         description="Inspect the dead-letter topic (list) and re-send records after a fix "
                                     "(redrive). A record is re-driven once; failures stay pending.")
    commands = dlq.add_subparsers(dest="dlq_command", required=True)
    show = commands.add_parser("list", help="group dead-letter records by reason; --show prints them")
    show.add_argument("--config", required=True, help="the relay's YAML config file")
    show.add_argument("--reason", help="only records with this reason, e.g. collector_rejected")
    show.add_argument("--limit", type=int, metavar="N", help="only the first N (matching) records")
    show.add_argument("--show", action="store_true", help="print each record: headers, key and value")
    show.set_defaults(ops_handler=main)
    redrive = commands.add_parser(
        "redrive", help="re-send selected dead-letter records, once",
        description="Re-send the dead-letter records chosen by --reason and/or --offsets, or every pending one "
                    "with --all; one of them is required (--dry-run alone previews every pending record).")
    redrive.add_argument("--config", required=True, help="the relay's YAML config file")
    redrive.add_argument("--reason", help="only records with this reason")
    redrive.add_argument("--offsets", action="append", metavar="P:O,...",
                         help="only these dead-letter records (partition:offset, as `dlq list --show` prints)")
    redrive.add_argument("--all", action="store_true",
                         help="every pending record (excludes --reason and --offsets)")
    redrive.add_argument("--collector", metavar="NAME",
                         help="deliver to this collector instead of the one named in each record")
    redrive.add_argument("--to-topic", action="store_true",
                         help="produce the records back to the input topic (and partition) they came from, for the "
                              "relay to process")
    redrive.add_argument("--dry-run", action="store_true", help="show what would be re-driven; change nothing")
    redrive.add_argument("--max-attempts", type=int, metavar="N",
                         help="give up on a record after N attempts (default: the collector's "
                                   "retry.max_attempts, or 10 where that is unlimited)")
    redrive.set_defaults(ops_handler=main)
