"""Read a bounded range of a topic with ``assign()``: no group membership, no commits.

Contract:

* A range is per partition: ``[start, end)`` in offsets, optionally narrowed by record
  timestamps. ``end`` is never beyond the end offset snapshotted when the range was
  resolved, so reading always terminates, however fast the topic grows.
* Timestamps follow ``offsets_for_times``: a range ``--from-time T`` starts at the first
  record whose timestamp is >= T and includes everything after it; ``--to-time T`` stops
  before the first record whose timestamp is >= T. Both are also checked on the records
  themselves, so a broker that answers ``offsets_for_times`` coarsely (with the start of a
  batch, or the log start) costs extra reading, never a wrong range.
* End offsets are confirmed by a fetch: some Kafka-compatible brokers answer ListOffsets
  with the last batch's base offset + 1, which would cut a range short.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from relay.config import KafkaConfig
from relay.kafka_log import with_log
from relay.ops import OpsError, kafka_error_text
from relay.source.admin import connection_properties, create_topic

#: How long one request to the broker (metadata, offsets) may take.
_TIMEOUT_S = 15.0
#: How long a read may go without a record before it gives up.
_STALL_S = 60.0
#: Said when the broker did not answer (the relay's offset check reads with these too).
UNREACHABLE_HINT = "is the broker reachable?"


def create_ops_topic(kafka: KafkaConfig, topic: str, config: dict[str, str], *, what: str, how: str,
                     timeout_s: float = 15.0) -> None:
    """Create ``topic`` (1 partition, ``config``) unless it exists; an :class:`OpsError`
    naming the fix when the broker refuses or does not answer. ``what`` is the topic's role
    ("redrive lock topic"), ``how`` what to create by hand instead."""
    try:
        create_topic(kafka.bootstrap_servers, topic, 1, config,
                     client_properties=connection_properties(kafka.producer_properties),
                     replication_factor=kafka.topic_replication_factor, timeout_s=timeout_s)
    except KafkaException as err:
        # librdkafka's own timeout (no controller found: no broker answered) is no refusal.
        if not (err.args and isinstance(err.args[0], KafkaError) and err.args[0].code() == KafkaError._TIMED_OUT):
            raise OpsError(f"cannot create the {what} {topic}: {kafka_error_text(err)}; create it ({how}) "
                           f"or grant the relay's credentials CREATE on it") from err
        raise _no_answer(what, topic, timeout_s) from err
    except concurrent.futures.TimeoutError as err:
        raise _no_answer(what, topic, timeout_s) from err


def _no_answer(what: str, topic: str, timeout_s: float) -> OpsError:
    return OpsError(f"the broker did not answer the creation of the {what} {topic} within {timeout_s:g}s; "
                    f"{UNREACHABLE_HINT}")


_BATCH = 1000
#: For topics of large records (dead letters of tens of MB): consumer properties that fetch
#: ahead about 4 MB (librdkafka's default is 64 MB; some brokers answer a fetch with more
#: than asked), and the bytes of records to take from the consumer at once
#: (``read(batch_bytes=...)``; one consume() hands a whole batch to Python).
LARGE_RECORD_OVERRIDES = {"queued.max.messages.kbytes": "4096"}
LARGE_RECORD_BATCH_BYTES = 4 << 20
#: Consumer properties an assign-only reader must not take from the relay's config.
_GROUP_KEYS = ("group.", "partition.assignment.strategy", "group.protocol", "enable.auto.", "auto.commit.",
               "group.instance.id")


@dataclass(frozen=True)
class PartitionRange:
    partition: int
    start: int
    #: Exclusive; never past the end offset seen when the range was resolved.
    end: int
    #: Skip records until the first one whose timestamp (ms) is >= from_ms.
    from_ms: int | None = None
    #: Stop at the first record whose timestamp (ms) is >= to_ms.
    to_ms: int | None = None

    @property
    def size(self) -> int:
        """Offsets covered: an upper bound on the records read from this partition."""
        return max(0, self.end - self.start)


def parse_refs(values: list[str] | None, flag: str) -> list[tuple[int, int]]:
    """``["0:10", "1:5,1:7"]`` -> ``[(0, 10), (1, 5), (1, 7)]``; a message naming ``flag`` otherwise,
    also for a value that names no offset at all (``""``, ``","``: an unset shell variable),
    which would otherwise mean "no bound" and select a whole topic."""
    out: list[tuple[int, int]] = []
    for value in values or []:
        if not value.replace(",", "").strip():
            raise OpsError(f"{flag} {value!r} names no offset; expected PARTITION:OFFSET[,PARTITION:OFFSET...], "
                           f"e.g. {flag} 0:1200")
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            part, sep, offset = item.partition(":")
            try:
                p, o = int(part), int(offset)
            except ValueError:
                p = o = -1
            if not sep or p < 0 or o < 0:
                raise OpsError(f"{flag} {item!r}: expected PARTITION:OFFSET with non-negative numbers, "
                               f"e.g. {flag} 0:1200")
            out.append((p, o))
    return out


def parse_offsets(values: list[str] | None, flag: str) -> dict[int, int]:
    """One offset per partition: ``["0:10", "1:5,2:7"]`` -> ``{0: 10, 1: 5, 2: 7}``."""
    out: dict[int, int] = {}
    for p, o in parse_refs(values, flag):
        if p in out and out[p] != o:
            raise OpsError(f"{flag}: partition {p} is given twice ({out[p]} and {o})")
        out[p] = o
    return out


def parse_time(text: str, flag: str) -> int:
    """An ISO-8601 date-time with a UTC offset -> epoch milliseconds."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OpsError(f"{flag} {text!r}: expected an ISO-8601 date-time such as 2024-05-01T10:00:00Z") from None
    if when.tzinfo is None:
        raise OpsError(f"{flag} {text!r}: add a UTC offset (Z or +HH:MM), a bare time is ambiguous")
    return int(when.astimezone(timezone.utc).timestamp() * 1000)


def open_consumer(kafka: KafkaConfig, group_id: str, *, client_id: str = "lineage-relay-ops",
                  overrides: dict[str, Any] | None = None) -> Consumer:
    """A consumer for ``assign()`` reads: the relay's connection settings, never its group.

    ``group_id`` only names the client for commits made on purpose (``dlq redrive``) and
    for reading the group's committed offsets; the consumer never subscribes, so it never
    joins or rebalances a group. ``overrides`` win over the relay's properties."""
    props = {k: v for k, v in kafka.consumer_properties.items() if not k.startswith(_GROUP_KEYS)}
    # A short fetch wait: these reads end at a partition's end, where a fetch would idle.
    # And a short backoff once the fetched-ahead queue has been full (librdkafka's default
    # is a second): these reads empty it as fast as they can (the search of
    # relay.source.run_search took 30 s instead of 9 for 200,000 records with 16 MB ahead).
    conf: dict[str, Any] = {"fetch.wait.max.ms": "100", "fetch.queue.backoff.ms": "20", **props, **(overrides or {}),
                            "bootstrap.servers": kafka.bootstrap_servers, "group.id": group_id,
                            "enable.auto.commit": False, "enable.auto.offset.store": False,
                            "enable.partition.eof": True, "auto.offset.reset": "earliest"}
    conf.setdefault("client.id", client_id)
    try:
        return Consumer(with_log(conf))
    except KafkaException as err:
        raise OpsError(f"cannot create a Kafka consumer: {err}") from err


def partitions_of(consumer: Consumer, topic: str, *, missing_ok: bool = False) -> list[int]:
    """The topic's partitions; ``[]`` for a topic that does not exist when ``missing_ok``."""
    try:
        md = consumer.list_topics(topic, timeout=_TIMEOUT_S)
    except KafkaException as err:
        raise OpsError(f"cannot read metadata of topic {topic!r}: {kafka_error_text(err)}; "
                       f"{UNREACHABLE_HINT}") from err
    meta = md.topics.get(topic)
    if missing_ok and (meta is None or (meta.error is not None
                                        and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)):
        return []
    if meta is None or meta.error is not None or not meta.partitions:
        why = meta.error if meta is not None and meta.error is not None else "no such topic"
        raise OpsError(f"topic {topic!r} is not available: {why}")
    return sorted(meta.partitions)


def watermarks(consumer: Consumer, topic: str, partitions: list[int], *,
               timeout_s: float = _TIMEOUT_S) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` now; ``high`` is confirmed by fetching (see module doc),
    all within ``timeout_s``. The consumer needs ``enable.partition.eof`` (:func:`open_consumer`)."""
    deadline = time.monotonic() + timeout_s
    marks: dict[int, tuple[int, int]] = {}
    for p in partitions:
        try:
            marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                      timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as err:
            raise OpsError(f"cannot read the offsets of {topic}/{p}: {kafka_error_text(err)}; "
                           f"{UNREACHABLE_HINT}") from err
    consumer.assign([TopicPartition(topic, p, max(lo, hi - 1)) for p, (lo, hi) in marks.items()])
    try:
        waiting = set(partitions)
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(_BATCH, 0.1):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF and msg.partition() in waiting:
                    lo, hi = marks[msg.partition()]
                    marks[msg.partition()] = (lo, max(hi, msg.offset()))
                    waiting.discard(msg.partition())
        if waiting:
            raise OpsError(f"could not confirm the end of {topic} partitions {sorted(waiting)} "
                           f"within {timeout_s:g}s; {UNREACHABLE_HINT}")
    finally:
        consumer.unassign()
    return marks


def resolve(consumer: Consumer, topic: str, *, from_offsets: dict[int, int] | None = None,
            from_ms: int | None = None, to_offsets: dict[int, int] | None = None,
            to_ms: int | None = None) -> list[PartitionRange]:
    """Turn a user's range into per-partition offset ranges (``to_offsets`` inclusive).

    Partitions: those named by ``from_offsets``, else by ``to_offsets``, else all of the
    topic. With neither ``to_offsets`` nor ``to_ms`` the range ends at the snapshot."""
    existing = partitions_of(consumer, topic)
    named = from_offsets or to_offsets
    if from_offsets and to_offsets and set(from_offsets) != set(to_offsets):
        raise OpsError(f"--from-offset names partitions {sorted(from_offsets)} but --to-offset names "
                       f"{sorted(to_offsets)}; give both for the same partitions")
    partitions = sorted(named) if named else existing
    unknown = sorted(set(partitions) - set(existing))
    if unknown:
        raise OpsError(f"topic {topic!r} has partitions {existing}, not {unknown}")
    marks = watermarks(consumer, topic, partitions)
    starts: dict[int, int] = {p: marks[p][0] for p in partitions}
    if from_offsets:
        starts = dict(from_offsets)
    elif from_ms is not None:
        try:
            found = consumer.offsets_for_times([TopicPartition(topic, p, from_ms) for p in partitions],
                                               timeout=_TIMEOUT_S)
        except KafkaException as err:
            raise OpsError(f"cannot look up offsets by time in {topic}: {kafka_error_text(err)}; "
                           f"{UNREACHABLE_HINT}") from err
        for tp in found:   # answered per partition: -1 with an error is no answer, not "no record"
            if tp.error is not None:
                raise OpsError(f"cannot look up offsets by time in {topic}/{tp.partition}: "
                               f"{tp.error.str()}; run the command again (a "
                               "partition whose leader is moving answers once it has moved)")
        # -1: no record at or after the time; the partition contributes nothing.
        starts = {tp.partition: (tp.offset if tp.offset >= 0 else marks[tp.partition][1]) for tp in found}
    ranges = []
    for p in partitions:
        low, high = marks[p]
        end = min(high, to_offsets[p] + 1) if to_offsets else high
        ranges.append(PartitionRange(p, max(low, starts[p]), end, from_ms=from_ms, to_ms=to_ms))
    return ranges


class OutOfTime(OpsError):
    """:func:`read` passed its ``deadline``; ``partitions`` were not read to their end."""

    def __init__(self, message: str, partitions: list[int]) -> None:
        super().__init__(message)
        self.partitions = partitions


def read(consumer: Consumer, topic: str, ranges: list[PartitionRange], *,
         progress: Callable[[int], None] = lambda n: None, deadline: float | None = None,
         stop: Callable[[], bool] | None = None, batch_bytes: int | None = None) -> Generator[Message, None, None]:
    """Yield every record in ``ranges``, partition by partition in offset order.

    ``progress(n)`` is told how many offsets were covered (records yielded, skipped by
    timestamp, or a partition's remainder when it ends early), adding up to the sum of
    the ranges' ``size``. Past ``deadline`` (``time.monotonic()``), or once ``stop()``
    says so (asked before each fetch, at least every 0.1 s, records or not), it raises
    :class:`OutOfTime`. The consumer is left unassigned.

    Records are taken from the consumer in batches, each held at once in memory: with
    ``batch_bytes``, batches of about that many bytes (at least one record), sized on the
    records seen so far, rather than of up to a thousand records."""
    pending = {r.partition: r for r in ranges if r.size > 0}
    started = {p: r.from_ms is None for p, r in pending.items()}
    covered = {p: r.start for p, r in pending.items()}
    if not pending:
        return
    consumer.assign([TopicPartition(topic, p, r.start) for p, r in pending.items()])

    paused: list[int] = []

    def finish(p: int) -> None:
        r = pending.pop(p)
        progress(r.end - covered[p])
        consumer.pause([TopicPartition(topic, p)])
        paused.append(p)

    def cover(p: int, offset: int) -> None:
        progress(offset + 1 - covered[p])
        covered[p] = offset + 1

    # Start with one record when batches are bounded in bytes: their size is not known yet.
    count = _BATCH if batch_bytes is None else 1
    seen_bytes = seen_records = 0
    try:
        last_progress = time.monotonic()
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                raise OutOfTime(f"reading {topic} out of time", sorted(pending))
            if stop is not None and stop():
                raise OutOfTime(f"reading {topic} stopped", sorted(pending))
            messages = consumer.consume(count, 0.1)
            if batch_bytes is not None and messages:
                seen_bytes += sum(len(m.value() or b"") for m in messages)
                seen_records += len(messages)
                count = max(1, min(_BATCH, batch_bytes * seen_records // max(1, seen_bytes)))
            if not messages and time.monotonic() - last_progress > _STALL_S:
                where = ", ".join(f"{topic}/{p} at {covered[p]} (end {r.end})" for p, r in pending.items())
                raise OpsError(f"no records arrived for {_STALL_S:g}s while reading {where}; {UNREACHABLE_HINT}")
            for msg in messages:
                p = msg.partition()
                r = pending.get(p)
                if r is None:
                    continue
                last_progress = time.monotonic()
                offset = msg.offset()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if offset >= r.end:
                            finish(p)
                        continue
                    if err.fatal() or not err.retriable():
                        raise OpsError(f"reading {topic}/{p} failed: {err}")
                    continue
                if offset < covered[p]:
                    continue  # a stale fetch from before assign(); already covered
                if offset >= r.end:
                    finish(p)
                    continue
                _kind, ts = msg.timestamp()
                if r.to_ms is not None and ts >= r.to_ms:
                    finish(p)
                    continue
                cover(p, offset)
                if not started[p]:
                    if ts < (r.from_ms or 0):
                        continue
                    started[p] = True
                yield msg
                if offset + 1 >= r.end:
                    finish(p)
    finally:
        # A paused partition stays paused through unassign(): reading it again would wait for ever.
        consumer.resume([TopicPartition(topic, p) for p in paused])
        consumer.unassign()


def read_topics(consumer: Consumer, ranges: dict[str, list[PartitionRange]], deadline: float,
                unfinished: set[tuple[str, int]], *,
                stop: Callable[[], bool] | None = None) -> Generator[Message, None, None]:
    """:func:`read` over several topics, one after the other, until ``deadline`` (or
    ``stop()``): then the generator ends, and the (topic, partition) pairs not read to
    their end are added to ``unfinished``. Closing it early leaves the consumer unassigned."""
    topics = list(ranges.items())
    for i, (topic, parts) in enumerate(topics):
        try:
            yield from read(consumer, topic, parts, deadline=deadline, stop=stop)
        except OutOfTime as late:
            unfinished.update((topic, p) for p in late.partitions)
            unfinished.update((t, r.partition) for t, rest in topics[i + 1:] for r in rest)
            return
