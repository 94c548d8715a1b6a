"""The dead-letter topic read back: its records (:class:`DeadLetter`) and :func:`scan`.

Record layout: :mod:`relay.sinks.deadletter`. Used by ``lineage-relay dlq list`` and
``dlq redrive`` (:mod:`relay.ops.dlq`, :mod:`relay.ops.redrive`), which read with
``assign()`` and never touch the relay's consumer group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from confluent_kafka import Consumer, Message

from relay.config import RelayConfig
from relay.ops.kafka_range import PartitionRange, partitions_of, read, watermarks
from relay.ops.ledger import RedriveLedger
from relay.ops.progress import ProgressBar


@dataclass
class DeadLetter:
    """One record of the dead-letter topic (layout: :mod:`relay.sinks.deadletter`)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str
    source: str
    collector: str | None
    relay_time: str
    redriven: bool = False
    #: The original's size when it was written without its value (else None).
    value_omitted: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.partition}:{self.offset}"

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (msg.headers() or [])}
        omitted = headers.get("value_omitted")
        return cls(msg.partition(), msg.offset(), msg.key(), msg.value(), headers.get("reason", "(none)"),
                   headers.get("detail", ""), headers.get("source", ""), headers.get("collector") or None,
                   headers.get("relay_time", ""), value_omitted=int(omitted) if omitted and omitted.isdigit() else None)


def scan(config: RelayConfig, consumer: Consumer, ledger: RedriveLedger, *, from_position: bool,
         keep_value: Callable[[DeadLetter], bool], stream: TextIO,
         ) -> tuple[list[DeadLetter], dict[int, list[int]], dict[int, int]]:
    """Read the dead-letter topic up to its current end: records, offsets read, low marks.

    From the redrive position when ``from_position`` (records below it were re-driven),
    else from the log start. Key and value are kept only where ``keep_value`` says so:
    values can be megabytes, and most records are only counted."""
    topic = config.kafka.dlq_topic
    partitions = partitions_of(consumer, topic)
    ledger.load(partitions)
    marks = watermarks(consumer, topic, partitions)
    ranges = [PartitionRange(p, ledger.start_offset(p, lo) if from_position else lo, hi)
              for p, (lo, hi) in marks.items()]
    records: list[DeadLetter] = []
    offsets: dict[int, list[int]] = defaultdict(list)
    with ProgressBar("dlq: reading", sum(r.size for r in ranges), stream=stream) as bar:
        for msg in read(consumer, topic, ranges, progress=bar.advance):
            record = DeadLetter.from_message(msg)
            record.redriven = ledger.is_done(record.partition, record.offset)
            if not keep_value(record):
                record.key = record.value = None
            records.append(record)
            offsets[record.partition].append(record.offset)
    return records, offsets, {p: lo for p, (lo, _hi) in marks.items()}
