"""``lineage-relay dlq list|redrive``: inspect the dead-letter topic and re-drive records.

``list`` groups the records by reason (count, first/last offset, collectors, a sample
detail) and with ``--show`` prints them. ``redrive`` re-sends selected records after the
cause was fixed, once (:mod:`relay.ops.redrive`). Both commands read with ``assign()``
and never touch the relay's consumer group.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import TextIO

from confluent_kafka import KafkaException

from relay.config import RelayConfig, load_config
from relay.errors import ConfigError
from relay.logs import setup_logging
from relay.ops import OpsError, kafka_error_text
from relay.ops.dead_letters import DeadLetter, scan
from relay.ops.kafka_range import open_consumer
from relay.ops.ledger import RedriveLedger, group_id
from relay.ops.redrive import run_redrive

_SHOW_VALUE_CHARS = 1000


def render_list(topic: str, records: list[DeadLetter], ledger: RedriveLedger, *, show: bool) -> str:
    redriven = sum(r.redriven for r in records)
    positions = ", ".join(f"{p}:{o}" for p, o in sorted(ledger.positions.items()) if o is not None) or "none"
    lines = [f"dead-letter topic {topic}: {len(records)} record(s), {redriven} re-driven "
             f"(redrive position {positions}, group {ledger.group_id})"]
    groups: dict[str, list[DeadLetter]] = defaultdict(list)
    for record in records:
        groups[record.reason].append(record)
    for reason, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        pending = sum(not r.redriven for r in members)
        collectors = sorted({r.collector for r in members if r.collector}) or ["-"]
        lines.append(f"{reason:<24} {len(members):>7} record(s) {pending:>7} pending  "
                     f"offsets {members[0].ref} .. {members[-1].ref}  collectors: {', '.join(collectors)}")
        lines.append(f"    e.g. {members[0].ref} from {members[0].source or '?'}: {members[0].detail[:200]}")
    if show:
        for r in records:
            state = "re-driven" if r.redriven else "pending"
            value = (r.value or b"").decode("utf-8", "replace")
            if len(value) > _SHOW_VALUE_CHARS:
                value = value[:_SHOW_VALUE_CHARS] + f"... ({len(r.value or b'')} bytes)"
            if r.value_omitted is not None:
                value = (f"(omitted: {r.value_omitted} bytes, too large for the dead-letter topic; "
                         f"the original is at {r.source or '?'})")
            lines += [f"--- {r.ref} {r.reason} [{state}] collector={r.collector or '-'} source={r.source or '-'} "
                      f"at={r.relay_time or '-'}",
                      f"    detail: {r.detail}",
                      f"    key: {(r.key or b'').decode('utf-8', 'replace')}",
                      f"    value: {value}"]
    return "\n".join(lines)


def run_list(args: argparse.Namespace, config: RelayConfig, stream: TextIO) -> int:
    consumer = open_consumer(config.kafka, group_id(config.kafka))
    try:
        ledger = RedriveLedger(config.kafka, consumer)
        records, _, _ = scan(config, consumer, ledger, from_position=False, stream=stream,
                             keep_value=lambda r: args.show and args.reason in (None, r.reason))
    finally:
        consumer.close()
    if args.reason:
        records = [r for r in records if r.reason == args.reason]
    if args.limit is not None:
        records = records[:args.limit]
    print(render_list(config.kafka.dlq_topic, records, ledger, show=args.show))
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
    redrive = commands.add_parser("redrive", help="re-send selected dead-letter records, once")
    redrive.add_argument("--config", required=True, help="the relay's YAML config file")
    redrive.add_argument("--reason", help="only records with this reason")
    redrive.add_argument("--offsets", action="append", metavar="P:O,...",
                         help="only these dead-letter records (partition:offset, as `dlq list --show` prints)")
    redrive.add_argument("--collector", metavar="NAME",
                         help="deliver to this collector instead of the one named in each record")
    redrive.add_argument("--to-topic", action="store_true",
                         help="produce the records back to the input topic for the relay to process")
    redrive.add_argument("--dry-run", action="store_true", help="show what would be re-driven; change nothing")
    redrive.add_argument("--max-attempts", type=int, metavar="N",
                         help="give up on a record after N attempts (default: the collector's "
                                   "retry.max_attempts, or 10 where that is unlimited)")
    redrive.set_defaults(ops_handler=main)
