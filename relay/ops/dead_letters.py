"""The dead-letter topic read back, one record at a time: :class:`DeadLetter` and
:class:`DeadLetterScan`.

Record layout: :mod:`relay.sinks.deadletter`. Used by ``lineage-relay dlq list`` and
``dlq redrive`` (:mod:`relay.ops.dlq`, :mod:`relay.ops.redrive`), which read with
``assign()`` and never touch the relay's consumer group.

Memory: a dead-letter topic can hold many records of tens of MB. A scan yields each
record as it is read and keeps none of them; a record's value is dropped unless the caller
asks for it. Records are taken from the consumer a few MB at a time, and what librdkafka
fetches ahead is bounded too: open the consumer with
:data:`relay.ops.kafka_range.LARGE_RECORD_OVERRIDES`. Of what was read, a scan keeps only
the offsets, as runs of consecutive ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, Message

from relay.config import RelayConfig
from relay.events import SourceRef
from relay.ops.kafka_range import LARGE_RECORD_BATCH_BYTES, PartitionRange, partitions_of, read, watermarks
from relay.ops.ledger import RedriveLedger, identity


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
    def identity(self) -> str:
        """What tells this record from another at its offset (see :func:`relay.ops.ledger.identity`)."""
        return identity(self.source, self.relay_time)

    @property
    def ref(self) -> str:
        return f"{self.partition}:{self.offset}"

    def value_at(self, topic: str) -> SourceRef | None:
        """Where the value to re-drive is (``topic`` is the dead-letter topic): this record,
        or for one written without its value the original in the source topic; None when
        ``source`` names no record."""
        if self.value_omitted is None:
            return SourceRef(topic, self.partition, self.offset)
        return SourceRef.parse(self.source)

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (msg.headers() or [])}
        omitted = headers.get("value_omitted")
        return cls(msg.partition(), msg.offset(), msg.key(), msg.value(), headers.get("reason", "(none)"),
                   headers.get("detail", ""), headers.get("source", ""), headers.get("collector") or None,
                   headers.get("relay_time", ""), value_omitted=_count(omitted))


def _count(text: str | None) -> int | None:
    """A header's non-negative decimal count, or None for anything else (``isdigit()`` alone
    takes "²", which ``int()`` refuses: one record written by another tool must not stop a scan)."""
    return int(text) if text and text.isascii() and text.isdigit() else None


class OffsetRuns:
    """Ascending offsets, kept as runs of consecutive ones: a few numbers for a topic
    that is not compacted, whatever its size."""

    def __init__(self) -> None:
        self._runs: list[list[int]] = []

    def append(self, offset: int) -> None:
        if self._runs and self._runs[-1][1] == offset:
            self._runs[-1][1] = offset + 1
        else:
            self._runs.append([offset, offset + 1])

    def __iter__(self) -> Iterator[int]:
        for first, end in self._runs:
            yield from range(first, end)


class DeadLetterScan:
    """One read of the dead-letter topic, up to the end it had when the scan was made.

    From the redrive position when ``from_position`` (records below it were re-driven),
    else from the log start. Making the scan loads ``ledger``."""

    def __init__(self, config: RelayConfig, consumer: Consumer, ledger: RedriveLedger, *,
                 from_position: bool) -> None:
        self.topic = config.kafka.dlq_topic
        self._consumer = consumer
        self._ledger = ledger
        partitions = partitions_of(consumer, self.topic)
        ledger.load(partitions)
        marks = watermarks(consumer, self.topic, partitions)
        self.ranges = [PartitionRange(p, ledger.start_offset(p, lo) if from_position else lo, hi)
                       for p, (lo, hi) in marks.items()]
        #: Each partition's (log start, end) when the scan was made.
        self.marks = marks
        self.lows = {p: lo for p, (lo, _hi) in marks.items()}
        #: The offsets of the records read so far, per partition.
        self.offsets: dict[int, OffsetRuns] = defaultdict(OffsetRuns)

    @property
    def size(self) -> int:
        """Offsets to read: an upper bound on the records."""
        return sum(r.size for r in self.ranges)

    def records(self, *, keep_value: Callable[[DeadLetter], bool],
                progress: Callable[[int], None] = lambda n: None) -> Generator[DeadLetter, None, None]:
        """Yield each record, in offset order per partition; its value only where
        ``keep_value`` says so. Close the generator when leaving it early (it unassigns
        the consumer)."""
        messages = read(self._consumer, self.topic, self.ranges, progress=progress,
                        batch_bytes=LARGE_RECORD_BATCH_BYTES)
        for msg in messages:
            record = DeadLetter.from_message(msg)
            record.redriven = self._ledger.is_done(record.partition, record.offset, record.identity)
            if not keep_value(record):
                record.value = None
            self.offsets[record.partition].append(record.offset)
            yield record
