"""Record values read back from Kafka by position when they are needed: :class:`StoredValues`.

``dlq redrive`` must order each run's events across every record it re-drives before it
sends one (START first, terminal last), and dead letters can be tens of MB each. So it
keeps what ordering needs (run, type, time, digest) and reads each value again when its
event is sent. Reading one record at a time would fetch its whole batch every time; a
:class:`StoredValues` reads ahead from a missing record and keeps the values it will be
asked for next, up to a byte budget.

Contract:

* :meth:`StoredValues.want` every position first, once per time it will be asked for;
  :meth:`StoredValues.get` returns the value (``None`` for a record without one) and
  forgets it after its last ask; it raises :class:`ValueGone` for a record no longer
  there (retention, compaction).
* Memory: the values read ahead and not yet asked for take at most ``budget`` bytes
  (beyond that, a value is read again when asked for); one value over the budget is
  still returned. Plus what the consumer fetches ahead (its ``queued.max.messages.kbytes``).
* Reading: a miss reads from the missing record on, keeping the wanted values that fit,
  and stops after ``budget`` bytes, or at the last value wanted in the partition. Values
  asked for in about the order they were stored are read about once; values asked for
  far apart cost up to ``budget`` bytes read each.
* Not thread-safe: call it from one thread at a time (the consumer is not shared).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from contextlib import closing

from confluent_kafka import Consumer

from relay.events import SourceRef
from relay.ops import OpsError
from relay.ops.kafka_range import LARGE_RECORD_BATCH_BYTES, PartitionRange, partitions_of, read, watermarks

#: Bytes of values read ahead and kept until asked for.
READ_AHEAD_BYTES = 64 << 20
_GONE = object()


class ValueGone(OpsError):
    """The record is no longer at its position."""


class StoredValues:
    """The values of chosen records, each read back when asked for (see the module doc)."""

    def __init__(self, consumer: Consumer, *, budget: int | None = None,
                 marks: dict[tuple[str, int], tuple[int, int]] | None = None) -> None:
        """``marks``: (log start, end) of partitions already known, by (topic, partition)."""
        self._consumer = consumer
        self._budget = READ_AHEAD_BYTES if budget is None else budget
        #: position -> asks left.
        self._uses: dict[SourceRef, int] = {}
        #: (topic, partition) -> offsets wanted, ascending once sorted.
        self._wanted: dict[tuple[str, int], list[int]] = defaultdict(list)
        self._sorted: set[tuple[str, int]] = set()
        self._ahead: OrderedDict[SourceRef, bytes | None] = OrderedDict()
        self._ahead_bytes = 0
        self._marks: dict[tuple[str, int], tuple[int, int] | None] = dict(marks or {})

    def want(self, at: SourceRef, uses: int = 1) -> None:
        """``at``'s value will be asked for ``uses`` more times."""
        if at not in self._uses:
            self._wanted[(at.topic, at.partition)].append(at.offset)
            self._sorted.discard((at.topic, at.partition))
        self._uses[at] = self._uses.get(at, 0) + uses

    def remaining(self, topic: str, partition: int) -> tuple[int, int] | None:
        """The partition's (log start, end) offsets, as first read; None when the topic or
        the partition no longer exists (a record there is gone, not a reason to stop)."""
        key = (topic, partition)
        if key not in self._marks:
            if partition not in partitions_of(self._consumer, topic, missing_ok=True):
                self._marks[key] = None
            else:
                self._marks.update({(topic, p): m for p, m in watermarks(self._consumer, topic, [partition]).items()})
        return self._marks[key]

    def get(self, at: SourceRef) -> bytes | None:
        """``at``'s value; raises :class:`ValueGone` when the record is no longer there."""
        if at in self._ahead:
            value = self._ahead.pop(at)
            self._ahead_bytes -= len(value or b"")
        else:
            found = self._read(at)
            if found is _GONE:
                self._uses.pop(at, None)
                marks = self.remaining(at.topic, at.partition)
                if marks is None:
                    raise ValueGone(f"the record is no longer at {at} (topic {at.topic} has no partition "
                                    f"{at.partition} any more)")
                raise ValueGone(f"the record is no longer at {at} (offsets {marks[0]}..{marks[1] - 1} remain)")
            value = found  # type: ignore[assignment]
        left = self._uses.get(at, 1) - 1
        if left > 0:
            self._uses[at] = left
            self._keep(at, value, evict=True)
        else:
            self._uses.pop(at, None)
        return value

    def _keep(self, at: SourceRef, value: bytes | None, *, evict: bool) -> bool:
        size = len(value or b"")
        if evict:
            while self._ahead and self._ahead_bytes + size > self._budget:
                _, old = self._ahead.popitem(last=False)
                self._ahead_bytes -= len(old or b"")
        if self._ahead_bytes + size > self._budget:
            return False
        self._ahead[at] = value
        self._ahead_bytes += size
        return True

    def _read(self, at: SourceRef) -> bytes | None | object:
        """``at``'s value (``_GONE``: no such record), and the wanted values after it in
        its partition that fit."""
        marks = self.remaining(at.topic, at.partition)
        if marks is None or not marks[0] <= at.offset < marks[1]:
            return _GONE
        high = marks[1]
        end = min(high, self._last_wanted(at) + 1)
        found: bytes | None | object = _GONE
        scanned = 0
        ranges = [PartitionRange(at.partition, at.offset, end)]
        batch_bytes = min(self._budget, LARGE_RECORD_BATCH_BYTES)
        with closing(read(self._consumer, at.topic, ranges, batch_bytes=batch_bytes)) as records:
            for msg in records:
                offset, value = msg.offset(), msg.value()
                if offset == at.offset:
                    found = value
                    continue
                scanned += len(value or b"")
                here = SourceRef(at.topic, at.partition, offset)
                if here in self._uses and here not in self._ahead and not self._keep(here, value, evict=False):
                    break  # the budget is full: the rest is read when asked for
                if scanned >= self._budget:
                    break
        return found

    def _last_wanted(self, at: SourceRef) -> int:
        """The last offset of ``at``'s partition still to be asked for (at least ``at``'s)."""
        key = (at.topic, at.partition)
        wanted = self._wanted[key]
        if key not in self._sorted:
            wanted.sort()
            self._sorted.add(key)
        while wanted and SourceRef(at.topic, at.partition, wanted[-1]) not in self._uses:
            wanted.pop()
        return max(wanted[-1], at.offset) if wanted else at.offset
