"""What ``dlq redrive`` has already re-driven, so that a record is re-driven once.

Two parts, both written only after the record reached its destination:

* the **position** of the consumer group ``<group_id>.dlq-redrive`` on the dead-letter
  topic: every record below it was re-driven. It is what a redrive starts reading from.
* **markers** in ``<dlq_topic>.redriven`` (compacted, key ``<dlq topic>/<partition>/<offset>``):
  one per record re-driven *above* the position. A selective redrive (``--reason``,
  ``--offsets``) or a failed delivery leaves records behind it, so the position cannot
  pass them; the markers remember the selected records re-driven beyond them. A consumer
  group's commit metadata could hold this, but not every Kafka-compatible broker keeps it.
* **collector markers** in the same topic (key ``<dlq topic>/<partition>/<offset>/<collector>``):
  a record meant for several collectors (one dead-lettered before any collector saw it)
  that reached only some of them stays pending, and these say which already have it, so
  that the next redrive sends it to the others only. (A reader that knows only record
  markers skips these keys: their offset part is not a number.)

A marker names its record by offset and also carries the record's identity (its ``source``
and ``relay_time`` headers, :func:`identity`): a dead-letter topic deleted and created again
starts at offset 0, and the markers of the records it held then (the marker topic is
compacted, they stay) must not pass its new records off as re-driven. A marker whose
identity differs from the record at its offset is forgotten when the scan meets that
record (so neither the scan nor the position committed after it counts the record as
re-driven); one written before markers carried it (no ``record`` field) is trusted.

A marker is produced (and acknowledged) right after its record's delivery, before the
position is committed, so a crash in between costs at most the deliveries in flight:
delivery is at-least-once, collectors and the relay treat an event's repeat as a repeat.
Two redrives do not run at the same time: :mod:`relay.ops.redrive_lock`. ``guard`` (the
lease's check) is called before each marker is produced and before the position is
committed: once the lease is lost, nothing more is written.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import orjson
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from relay.config import KafkaConfig
from relay.kafka_log import with_log
from relay.ops import OpsError, kafka_error_text
from relay.ops.kafka_range import UNREACHABLE_HINT, PartitionRange, create_ops_topic, partitions_of, read, watermarks
from relay.source.admin import connection_properties

#: How long one request to the broker (read or commit the position) may take.
_TIMEOUT_S = 15.0
#: How long the markers of a run may take to be acknowledged.
_ACK_TIMEOUT_S = 60.0


def group_id(kafka: KafkaConfig) -> str:
    return f"{kafka.group_id}.dlq-redrive"


def marker_topic(kafka: KafkaConfig) -> str:
    return f"{kafka.dlq_topic}.redriven"


def identity(source: str, relay_time: str) -> str:
    """What tells one dead letter from another written at the same offset of an earlier
    incarnation of the topic: the record it stands for and when the relay wrote it."""
    return f"{source}@{relay_time}"


def advance(position: int, offsets: Iterable[int], done: Callable[[int], bool]) -> int:
    """The new position: past every record, in offset order from ``position``, that is
    done, up to the first that is not. ``offsets`` are the records that exist (sorted);
    offsets with no record (compaction, retention) are skipped over."""
    for offset in offsets:
        if offset < position:
            continue
        if not done(offset):
            break
        position = offset + 1
    return position


def _record_of(value: bytes) -> str | None:
    """The identity a marker carries; None for a marker without one (or not readable)."""
    try:
        record = orjson.loads(value).get("record")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return record if isinstance(record, str) else None


def _same(marked: str | None, record: str | None) -> bool:
    """Whether a marker carrying ``marked`` stands for the record of identity ``record``
    (either unknown: taken as the same)."""
    return marked is None or record is None or marked == record


class RedriveLedger:
    """The redrive state of one dead-letter topic: load it, consult it, extend it."""

    def __init__(self, kafka: KafkaConfig, consumer: Consumer) -> None:
        self.kafka = kafka
        self.topic = kafka.dlq_topic
        self.group_id = group_id(kafka)
        self.marker_topic = marker_topic(kafka)
        self._consumer = consumer
        #: partition -> committed position (None: nothing committed yet).
        self.positions: dict[int, int | None] = {}
        #: (partition, offset) -> the identity of the record re-driven there (None: not known).
        self._marked: dict[tuple[int, int], str | None] = {}
        #: (partition, offset) -> collectors a pending record was re-driven to, with its identity.
        self._delivered: dict[tuple[int, int], dict[str, str | None]] = {}
        self._producer: Producer | None = None
        #: Raises when this redrive may no longer write (its lease is lost).
        self.guard: Callable[[], None] = lambda: None
        self._unacked = 0
        self._errors: list[str] = []

    def load(self, partitions: list[int]) -> None:
        try:
            got = self._consumer.committed([TopicPartition(self.topic, p) for p in partitions], timeout=_TIMEOUT_S)
        except KafkaException as err:
            raise OpsError(f"cannot read the redrive position of group {self.group_id}: {kafka_error_text(err)}; "
                           f"{UNREACHABLE_HINT}") from err
        self.positions = {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}
        self._read_markers()

    def _read_markers(self) -> None:
        self._marked, self._delivered = {}, {}
        partitions = partitions_of(self._consumer, self.marker_topic, missing_ok=True)
        if not partitions:
            return  # no redrive has written markers yet
        marks = watermarks(self._consumer, self.marker_topic, partitions)
        ranges = [PartitionRange(p, lo, hi) for p, (lo, hi) in marks.items()]
        prefix = f"{self.topic}/"
        for msg in read(self._consumer, self.marker_topic, ranges):
            key = (msg.key() or b"").decode("utf-8", "replace")
            if not key.startswith(prefix) or msg.value() is None:
                continue  # another topic's, or a tombstone
            partition, _, rest = key[len(prefix):].partition("/")
            offset, _, collector = rest.partition("/")
            if not ((partition + offset).isascii() and partition.isdigit() and offset.isdigit()):
                continue
            record = _record_of(msg.value())
            if collector:
                self._delivered.setdefault((int(partition), int(offset)), {})[collector] = record
            else:
                self._marked[(int(partition), int(offset))] = record

    def start_offset(self, partition: int, low: int) -> int:
        """Where a redrive reads from: the position, or the log start."""
        position = self.positions.get(partition)
        return low if position is None else max(low, position)

    def is_done(self, partition: int, offset: int, record: str | None = None) -> bool:
        """Whether record ``partition:offset`` was re-driven; ``record``: its :func:`identity`
        (None: the record is not at hand, a marker at its offset is taken as its)."""
        position = self.positions.get(partition)
        if position is not None and offset < position:
            return True
        key = (partition, offset)
        if key not in self._marked:
            return False
        if _same(self._marked[key], record):
            return True
        del self._marked[key]  # an earlier topic's record at this offset: not this one
        return False

    def delivered_to(self, partition: int, offset: int, record: str | None = None) -> frozenset[str]:
        """The collectors that pending record ``partition:offset`` (identity ``record``) was
        already re-driven to."""
        key = (partition, offset)
        have = self._delivered.get(key, {})
        kept = {name: marked for name, marked in have.items() if _same(marked, record)}
        if len(kept) != len(have):  # an earlier topic's record at this offset
            self._delivered[key] = kept
        return frozenset(kept)

    # -- writing -----------------------------------------------------------------------
    def open_for_writing(self) -> None:
        props = self.kafka.producer_properties
        create_ops_topic(self.kafka, self.marker_topic, {"cleanup.policy": "compact"}, what="redrive marker topic",
                         how="1 partition, cleanup.policy=compact", timeout_s=_TIMEOUT_S)
        conf: dict[str, Any] = {**props, "bootstrap.servers": self.kafka.bootstrap_servers,
                                "enable.idempotence": True, "acks": "all", "linger.ms": 20}
        self._producer = Producer(with_log(conf))

    def mark(self, partition: int, offset: int, how: str, record: str | None = None) -> None:
        """Remember that record ``partition:offset`` (identity ``record``) was re-driven
        (``how``: where to)."""
        self._marked[(partition, offset)] = record
        self._produce(f"{self.topic}/{partition}/{offset}", partition, offset, how, record)

    def mark_collector(self, partition: int, offset: int, collector: str, record: str | None = None) -> None:
        """Remember that record ``partition:offset`` (identity ``record``), still pending for
        other collectors, reached ``collector``."""
        self._delivered.setdefault((partition, offset), {})[collector] = record
        self._produce(f"{self.topic}/{partition}/{offset}/{collector}", partition, offset,
                      f"collector:{collector}", record)

    def _produce(self, key: str, partition: int, offset: int, how: str, record: str | None) -> None:
        assert self._producer is not None, "open_for_writing() first"
        self.guard()
        fields: dict[str, str] = {"redriven_at": datetime.now(timezone.utc).isoformat(), "to": how}
        if record is not None:
            fields["record"] = record
        value = orjson.dumps(fields)

        def acked(err: KafkaError | None, _msg: Any) -> None:
            self._unacked -= 1
            if err is not None:
                self._errors.append(f"{partition}:{offset}: {err}")

        deadline = time.monotonic() + _ACK_TIMEOUT_S
        while True:
            try:
                self._producer.produce(self.marker_topic, key=key.encode(), value=value, on_delivery=acked)
                self._unacked += 1
                break
            except BufferError:
                # The queue is full of markers the broker has not acknowledged: wait for
                # room, not for ever (checkpoint() reports the marker as not written).
                if time.monotonic() > deadline:
                    self._errors.append(f"{partition}:{offset}: no room to queue it, the broker acknowledged "
                                        f"no marker for {_ACK_TIMEOUT_S:g}s")
                    break
                self._producer.poll(0.1)
        self._producer.poll(0)

    def checkpoint(self, read_offsets: Mapping[int, Iterable[int]], lows: dict[int, int]) -> dict[int, int]:
        """Wait for every marker, then commit the group position over what is done.

        ``read_offsets``: the offsets of the records read, per partition, ascending.
        Returns the committed positions. Raises if a marker could not be written (the
        position is then not moved, so nothing is forgotten)."""
        self.guard()
        if self._producer is not None:
            deadline = time.monotonic() + _ACK_TIMEOUT_S
            while self._unacked and time.monotonic() < deadline:
                self._producer.flush(1.0)
                self.guard()
            if self._unacked or self._errors:
                raise OpsError(f"{self._unacked + len(self._errors)} redrive marker(s) were not written "
                               f"(first error: {self._errors[:1]}); the records may be re-driven again")
        commits: dict[int, int] = {}
        for partition, offsets in read_offsets.items():
            start = self.start_offset(partition, lows.get(partition, 0))
            new = advance(start, offsets, lambda o, p=partition: self.is_done(p, o))
            committed = self.positions.get(partition)
            if new != committed and not (committed is None and new == start):
                commits[partition] = new
        if commits:
            self.guard()
            self._commit(commits)
            self.positions.update(commits)
        return commits

    def abandon(self) -> None:
        """The lease is lost: drop the markers not yet sent (their records may be
        re-driven again by a later redrive: at least once)."""
        if self._producer is not None:
            self._producer.purge()
            self._producer.poll(0)
            self._producer = None

    def _commit(self, commits: dict[int, int]) -> None:
        """Commit the group's position, or raise within about :data:`_TIMEOUT_S`.

        Through the admin API, not the consumer: a consumer's commit waits for the group
        coordinator with no time limit (a broker that stopped answering hung the command,
        and the consumer's close behind it), where an admin request ends at its timeout."""
        fix = (f"the records re-driven are remembered by their markers in {self.marker_topic} and will not "
               f"be sent again: run the command again once the broker answers")
        admin = AdminClient(with_log({**connection_properties(self.kafka.consumer_properties),
                                      "bootstrap.servers": self.kafka.bootstrap_servers}))
        request = ConsumerGroupTopicPartitions(
            self.group_id, [TopicPartition(self.topic, p, o) for p, o in sorted(commits.items())])
        try:
            future = admin.alter_consumer_group_offsets([request], request_timeout=_TIMEOUT_S)[self.group_id]
            done = future.result(timeout=_TIMEOUT_S + 5)
        except KafkaException as err:
            raise OpsError(f"cannot commit the redrive position of group {self.group_id}: "
                           f"{kafka_error_text(err)}; {fix}") from err
        except concurrent.futures.TimeoutError as err:
            raise OpsError(f"cannot commit the redrive position of group {self.group_id}: the broker did not "
                           f"answer within {_TIMEOUT_S:g}s; {fix}") from err
        finally:
            # As in relay.source.admin.create_topic: a failed future's traceback would keep
            # the client alive until the next cyclic collection.
            future = admin = None  # type: ignore[assignment]
        refused = [f"{tp.partition}: {tp.error.str()}" for tp in done.topic_partitions if tp.error is not None]
        if refused:
            raise OpsError(f"cannot commit the redrive position of group {self.group_id} "
                           f"(partition {', '.join(refused)}); {fix}")
