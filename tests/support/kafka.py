"""Kafka helpers for tests: a broker handle that works with the embedded Tansu broker,
Apache Kafka in testcontainers (opt-in) or an existing cluster, and produce/read helpers
that wait for a condition with a deadline (never sleep-as-sync)."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker, create_topic
from relay.ops.kafka_range import watermarks

_counter = itertools.count()


@dataclass
class KafkaHandle:
    bootstrap_servers: str
    embedded: EmbeddedBroker | None = None

    def new_topic(self, prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        create_topic(self.bootstrap_servers, name, partitions, config)
        return name

    def new_group(self, prefix: str = "g") -> str:
        return f"{prefix}-{next(_counter)}-{uuid.uuid4().hex[:6]}"

    def consumer_properties(self) -> dict[str, str]:
        return dict(FAST_GROUP_PROPERTIES)

    def restart(self) -> None:
        if self.embedded is None:
            raise RuntimeError("restart() needs the embedded broker")
        self.embedded.restart()


def start_kafka() -> tuple[KafkaHandle, Any]:
    """Pick the broker for this run. Returns (handle, closer)."""
    existing = os.environ.get("LINEAGE_RELAY_TEST_BOOTSTRAP")
    if existing:
        return KafkaHandle(existing), lambda: None
    if os.environ.get("LINEAGE_RELAY_TEST_KAFKA", "tansu") == "testcontainers":
        from testcontainers.kafka import KafkaContainer  # opt-in: needs Docker

        container = KafkaContainer().with_kraft().start()
        return KafkaHandle(container.get_bootstrap_server()), container.stop
    broker = EmbeddedBroker().start()
    return KafkaHandle(broker.bootstrap_servers, broker), broker.stop


def produce(bootstrap_servers: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
            headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
            config: dict[str, Any] | None = None, timestamp_ms: int | None = None) -> int:
    """Produce (key, value) pairs and wait until every one is acknowledged. ``config`` adds
    producer properties (e.g. ``message.max.bytes`` for records over librdkafka's 1 MB default);
    ``timestamp_ms`` sets the records' timestamp (their create time)."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                         "linger.ms": 5, **(config or {})})
    failures: list[KafkaError] = []
    count = 0

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    for key, value in records:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
        if headers:
            kwargs["headers"] = headers
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0 and not failures, f"produce failed: {remaining} unsent, errors {failures[:3]}"
    return count


@dataclass
class ReadRecord:
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    partition: int
    offset: int


def read_topic(bootstrap_servers: str, topic: str, *, expected: int, timeout_s: float = 30.0,
               partitions: int | None = None) -> list[ReadRecord]:
    """Read a topic from the beginning (no group) until `expected` records or the deadline.

    Returns what was read; callers assert on the count so a shortfall fails with context."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        if partitions is None:
            md = consumer.list_topics(topic, timeout=10)
            partitions = len(md.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[ReadRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                if msg.error():
                    continue
                out.append(ReadRecord(msg.key(), msg.value(), dict(msg.headers() or []),
                                      msg.partition(), msg.offset()))
        return out
    finally:
        consumer.close()


def end_offsets(bootstrap_servers: str, topic: str, *, timeout_s: float = 15.0) -> dict[int, int]:
    """Each partition's high watermark now: the offset its next record gets. Confirmed by a
    fetch (relay.ops.kafka_range.watermarks): Tansu answers ListOffsets with the last
    batch's base offset + 1."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        marks = watermarks(consumer, topic, sorted(md.topics[topic].partitions), timeout_s=timeout_s)
        return {p: high for p, (_low, high) in marks.items()}
    finally:
        consumer.close()


def read_to_end(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0) -> list[ReadRecord]:
    """Every record the topic holds: read from the beginning up to each partition's high
    watermark, taken first (see :func:`end_offsets`). Unlike :func:`read_topic` with an
    ``expected`` above what exists, it does not stop at a deadline with whatever it got by
    then: it fails if it cannot reach the end within ``timeout_s``, so a caller's exact
    count proves there is nothing more (records written after the snapshot may be included)."""
    ends = end_offsets(bootstrap_servers, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        out: list[ReadRecord] = []
        waiting = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                        waiting.discard(msg.partition())
                    continue
                out.append(ReadRecord(msg.key(), msg.value(), dict(msg.headers() or []),
                                      msg.partition(), msg.offset()))
                if msg.offset() >= ends[msg.partition()] - 1:
                    waiting.discard(msg.partition())
        assert not waiting, f"{topic}: partitions {sorted(waiting)} not read to {ends} within {timeout_s}s"
        return out
    finally:
        consumer.close()


def committed_offsets(bootstrap_servers: str, topic: str, group_id: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group_id})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def unread_request_bytes(port: int) -> int:
    """Bytes clients sent to ``port`` that the (stopped) broker has not read: requests on
    the wire. Linux only: reads the receive queues in /proc/net/tcp."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":          # ESTABLISHED, server side
            total += int(fields[4].split(":")[1], 16)
    return total


def process_state(pid: int) -> str:
    """A process's scheduler state (``T``: stopped), from /proc/<pid>/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
