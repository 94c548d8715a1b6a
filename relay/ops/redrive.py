"""``lineage-relay dlq redrive``: re-send selected dead-letter records, once.

The records are chosen explicitly: ``--reason R``, ``--offsets P:O,...`` (both: records
matching both) or ``--all`` (every pending record); without one the command refuses, exit
2, so that a bare ``dlq redrive`` does not re-send a whole topic by accident. ``--dry-run``
alone previews every pending record (it sends nothing).

Straight to a collector (the one named in the record, or ``--collector``; a record without
one, rejected before any collector saw it, goes to every collector whose route takes it)
or back to the input topic and partition it came from (``--to-topic``; see
:func:`relay.ops.redrive_targets.placement`), where the relay processes it like any new
record. A dead letter written without its value (header ``value_omitted``) is re-driven
from the original, read back from the source topic at ``source``; one no longer there
(retention) is a failure naming where it was. A record is re-driven at most once, across
runs (:mod:`relay.ops.ledger`); records that fail again stay pending for the next redrive.

Memory does not grow with the size of the records: the dead-letter topic is read once, and
of each selected record only what orders its run is kept; its value is read back right
before it is sent (:mod:`relay.ops.redrive_targets`). What is kept per selected record is
small (offsets, headers but the detail, run id, type, time, digest), so memory still grows
with their number, not with their size.
"""

from __future__ import annotations

import argparse
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from typing import TextIO

from confluent_kafka import KafkaException

from relay.config import RelayConfig
from relay.ops import OpsError, kafka_error_text
from relay.ops.dead_letters import DeadLetter, DeadLetterScan
from relay.ops.kafka_range import LARGE_RECORD_OVERRIDES, open_consumer, parse_refs
from relay.ops.ledger import RedriveLedger, group_id
from relay.ops.progress import ProgressBar
from relay.ops.redrive_lock import LeaseLost, RedriveLock
from relay.ops.redrive_targets import CollectorRedrive, TopicRedrive
from relay.ops.stored_values import StoredValues

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
    #: Records handed to the producer and dropped when the redrive stopped: not marked,
    #: they stay pending, though they may have been written.
    unconfirmed: int = 0
    #: Why the redrive stopped, when it did (the summary's "not confirmed" row says it).
    stopped_by: str = "stopped"
    #: ``--to-topic``: why records did not go back exactly where they came from (topic and
    #: partition; :func:`relay.ops.redrive_targets.placement`) -> how many.
    placements: Counter[str] = field(default_factory=Counter)

    def render(self, target: str, dry_run: bool, group: str) -> str:
        verb = "would re-drive" if dry_run else "re-driven"
        rows = [("records scanned", self.scanned), ("already re-driven", self.already),
                ("not selected", self.not_selected), (verb, self.redriven),
                ("routed to no collector", self.not_routed), ("failed", len(self.failures))]
        if self.unconfirmed:
            rows.append(("not confirmed", self.unconfirmed))
        lines = [f"redrive -> {target}{' (dry run)' if dry_run else ''}"]
        lines += [f"  {name:<22} {value}" for name, value in rows]
        if self.unconfirmed:
            lines.append(f"  NOT CONFIRMED ({self.stopped_by}; may have arrived): {self.unconfirmed} record(s) "
                         f"handed to the producer were dropped unacknowledged; not marked, they stay pending")
        for note, count in sorted(self.placements.items()):
            lines.append(f"  NOTE {count} record(s) {note}")
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


class Selection:
    """Which records a redrive takes: matching ``--reason``/``--offsets`` and not re-driven
    yet. Counts each record it is shown in the summary."""

    def __init__(self, args: argparse.Namespace, summary: RedriveSummary) -> None:
        self._reason = args.reason
        self._wanted = set(parse_refs(args.offsets, "--offsets")) if args.offsets else None
        self._seen: set[tuple[int, int]] = set()
        self._summary = summary

    def matches(self, record: DeadLetter) -> bool:
        return not record.redriven and self._selected(record)

    def _selected(self, r: DeadLetter) -> bool:
        return ((not self._reason or r.reason == self._reason)
                and (self._wanted is None or (r.partition, r.offset) in self._wanted))

    def take(self, record: DeadLetter) -> bool:
        """Whether to re-drive ``record`` (each record of the scan, once)."""
        summary = self._summary
        summary.scanned += 1
        if self._wanted is not None and (record.partition, record.offset) in self._wanted:
            self._seen.add((record.partition, record.offset))
        if not self._selected(record):
            summary.not_selected += 1
            return False
        if record.redriven:
            summary.already += 1
            return False
        return True

    def finish(self, ledger: RedriveLedger, lows: dict[int, int]) -> None:
        """After the scan: ``--offsets`` not read are re-driven already, or missing. Not
        read: below the redrive position, gone (retention), or never written; a marker
        counts only for one gone, as one at an offset the topic never reached is an
        earlier topic's (deleted and created again)."""
        if self._wanted is None:
            return
        for p, o in sorted(self._wanted - self._seen):
            position = ledger.positions.get(p)
            if (position is not None and o < position) or (o < lows.get(p, 0) and ledger.is_done(p, o)):
                self._summary.already += 1  # not even read
            else:
                self._summary.missing.append(f"{p}:{o}")


def check_selection(args: argparse.Namespace) -> None:
    """Refuse a redrive that names no records: ``--reason``, ``--offsets`` or ``--all`` is
    required (``--all`` alone), except for ``--dry-run``, which changes nothing."""
    if args.reason is not None and not args.reason.strip():
        raise OpsError("--reason is empty: name a reason, as `dlq list` shows them (an empty one would select "
                       "every record); --all re-drives every pending record")
    if args.offsets:
        parse_refs(args.offsets, "--offsets")   # refused here, before the broker is asked
    chosen = args.reason is not None or bool(args.offsets)
    if args.all and chosen:
        raise OpsError("--all re-drives every pending record: it excludes --reason and --offsets; "
                       "drop --all to re-drive only the records they select")
    if not args.all and not chosen and not args.dry_run:
        raise OpsError("choose the records to re-drive: --reason R, --offsets P:O,... or --all (every pending "
                       "record); `dlq list` shows them, and --dry-run previews a redrive without sending")


def run_redrive(args: argparse.Namespace, config: RelayConfig, stream: TextIO) -> int:
    check_selection(args)
    if args.collector and args.to_topic:
        raise OpsError("--collector and --to-topic exclude each other: deliver straight to a collector, "
                       "or hand the records back to the relay")
    if args.collector and args.collector not in {c.name for c in config.collectors}:
        raise OpsError(f"--collector {args.collector!r} is not in the configuration; "
                       f"configured: {', '.join(c.name for c in config.collectors)}")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise OpsError("--max-attempts must be at least 1")
    summary = RedriveSummary()
    # One redrive at a time per dead-letter topic; a dry run changes nothing and takes no lock.
    lock = None if args.dry_run else RedriveLock(config.kafka, say=lambda line: print(line, file=stream))
    if lock is not None:
        try:
            lock.acquire()
        except BaseException:
            lock.release()
            raise
    target = "the input topic and partition each record came from" if args.to_topic else \
        f"collector {args.collector}" if args.collector else "the collector named in each record"
    try:
        code = _redrive(args, config, stream, summary, lock)
    except LeaseLost as lost:
        summary.stopped_by = "lease lost"
        print(summary.render(target, args.dry_run, group_id(config.kafka)))
        assert lock is not None  # only a lease is lost
        raise OpsError(_stopped_message(lost, summary, lock.timing.takeover_s)) from lost
    finally:
        if lock is not None:
            lock.release()
    print(summary.render(target, args.dry_run, group_id(config.kafka)))
    return code


def _stopped_message(lost: LeaseLost, summary: RedriveSummary, takeover_s: float) -> str:
    holder = lost.taken_by
    then = (f"the redrive of host {holder.host}, pid {holder.pid} (holding the lock since {holder.since}) took it "
            f"over and goes on; `dlq list` shows what is still pending once it ends" if holder is not None else
            f"run the redrive again: it re-drives what is still pending (`dlq list` shows it), once no other "
            f"redrive holds the lock (a lock without a heartbeat is taken over after {takeover_s:g}s)")
    return (f"{lost}. This redrive stopped: {summary.redriven} record(s) were re-driven before (summary above); "
            f"after the loss was seen nothing more was sent or marked (an HTTP request in flight, or records already "
            f"handed to the producer, may still arrive), markers not yet written were dropped and no redrive "
            f"position was committed; {then}")


def _redrive(args: argparse.Namespace, config: RelayConfig, stream: TextIO, summary: RedriveSummary,
             lock: RedriveLock | None) -> int:
    selection = Selection(args, summary)
    consumer = open_consumer(config.kafka, group_id(config.kafka), overrides=LARGE_RECORD_OVERRIDES)
    # A second reader, for values read back (originals while the topic is read, every
    # value while sending): the first one is in the middle of the dead-letter topic.
    value_reader = open_consumer(config.kafka, group_id(config.kafka), client_id="lineage-relay-ops-values",
                                 overrides=LARGE_RECORD_OVERRIDES)
    try:
        ledger = RedriveLedger(config.kafka, consumer)
        scan = DeadLetterScan(config, consumer, ledger, from_position=True)
        values = StoredValues(value_reader, marks={(scan.topic, p): m for p, m in scan.marks.items()})
        targets: TopicRedrive | CollectorRedrive = (
            TopicRedrive(config, values, summary) if args.to_topic
            else CollectorRedrive(config, args, ledger, values, summary))
        # Values are needed while reading only to decode them for collectors.
        keep_value = (lambda r: False) if args.to_topic else selection.matches
        with ProgressBar("dlq: reading", scan.size, stream=stream) as bar, \
                closing(scan.records(keep_value=keep_value, progress=bar.advance)) as records:
            for record in records:
                if selection.take(record):
                    targets.add(record)
        selection.finish(ledger, scan.lows)
        writer = None if args.dry_run else ledger
        guard = lock.check if lock is not None else (lambda: None)
        if writer is not None:
            writer.guard = guard
            if targets.count:
                writer.open_for_writing()
        failed: BaseException | None = None
        try:
            with ProgressBar("dlq: re-driving", targets.count, stream=stream) as bar:
                targets.run(writer, bar, guard)
        except BaseException as err:
            failed = err
            raise
        finally:
            # Whatever happened, remember what did get through (markers, then position).
            if writer is not None and lock is not None and lock.lost is not None:
                writer.abandon()  # nothing is written once the lease is lost
                if not isinstance(failed, (LeaseLost, KeyboardInterrupt)):
                    raise lock.lost from failed
            elif writer is not None:
                try:
                    summary.committed = writer.checkpoint(scan.offsets, scan.lows)
                except LeaseLost:
                    writer.abandon()
                    raise
                except OpsError as late:
                    if failed is None:
                        raise
                    # Most often the same broker failing again: say what failed first, too.
                    cause = kafka_error_text(failed) if isinstance(failed, KafkaException) else str(failed)
                    raise OpsError(f"{cause or type(failed).__name__}; then {late}") from failed
    finally:
        value_reader.close()
        consumer.close()
    return 1 if summary.failures or summary.missing else 0
