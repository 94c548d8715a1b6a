"""Which offsets may be committed.

Contract: an offset is committable only when every record at or below it in its
partition has settled, i.e. reached every collector it was routed to, or the
dead-letter topic, or was deliberately not forwarded (duplicate, after-terminal).
Each record gets a :class:`Ticket`; whoever takes on an obligation for the record
calls ``acquire()`` and later ``release()``. Pure bookkeeping: no I/O, no clock.

The tracker also sums the sizes of the records not settled yet (:attr:`OffsetTracker.pending_bytes`),
what the relay holds in memory for them, so that consumption can pause on bytes, not only
on a count of events (a few 20 MB events weigh more than thousands of small ones).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Hashable

Partition = tuple[str, int]


def format_partitions(parts: list[Partition]) -> str:
    """``topic/partition`` of each, comma-separated (for logs)."""
    return ",".join(f"{t}/{p}" for t, p in parts)


class _Pending:
    """Bytes of unsettled records, shared by a tracker's partition logs."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class _PartitionLog:
    __slots__ = ("tickets", "watermark", "committed", "pending", "last_ms")

    def __init__(self, pending: _Pending) -> None:
        self.pending = pending
        self.tickets: deque[Ticket] = deque()
        #: Next offset to commit (one past the highest settled contiguous offset), or None.
        self.watermark: int | None = None
        self.committed: int | None = None
        #: The timestamp of the last record tracked (ms; 0 or less when unknown).
        self.last_ms = 0

    def advance(self) -> None:
        tickets = self.tickets
        while tickets and tickets[0].remaining == 0:
            self.watermark = tickets.popleft().offset + 1


class Ticket:
    """One consumed record's outstanding obligations. Created holding one (the
    dispatcher's own), so it cannot settle while it is still being fanned out."""

    __slots__ = ("offset", "remaining", "size", "ms", "_log")

    def __init__(self, offset: int, log: _PartitionLog, size: int = 0, ms: int = 0) -> None:
        self.offset = offset
        self.remaining = 1
        self.size = size
        #: The record's timestamp (ms since the epoch; 0 when unknown).
        self.ms = ms
        self._log = log

    def acquire(self) -> None:
        self.remaining += 1

    def release(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            log = self._log
            log.pending.bytes -= self.size
            if log.tickets and log.tickets[0] is self:
                log.advance()

    @property
    def settled(self) -> bool:
        return self.remaining == 0


class OffsetTracker:
    """Tracks tickets per assigned partition and reports committable offsets."""

    def __init__(self) -> None:
        self._logs: dict[Hashable, _PartitionLog] = {}
        self._pending = _Pending()
        #: When each partition was last seen caught up (ms; see :meth:`caught_up`).
        self._caught_up_ms: dict[Partition, float] = {}

    @property
    def pending_bytes(self) -> int:
        """Sum of ``size`` over the tracked records not settled yet (revoked ones excluded)."""
        return self._pending.bytes

    def track(self, partition: Partition, offset: int, size: int = 0, ms: int = 0) -> Ticket:
        """A ticket for the record at ``offset``; ``size`` (its bytes) counts in
        :attr:`pending_bytes` until the ticket settles or its partition is revoked; ``ms``
        is its timestamp (see :meth:`record_ms`)."""
        log = self._logs.get(partition)
        if log is None:
            log = self._logs[partition] = _PartitionLog(self._pending)
        log.last_ms = ms
        ticket = Ticket(offset, log, size, ms)
        self._pending.bytes += size
        log.tickets.append(ticket)
        return ticket

    def committable(self) -> dict[Partition, int]:
        """Offsets (next to read) that advanced since the last ``mark_committed``."""
        out = {}
        for partition, log in self._logs.items():
            if log.watermark is not None and log.watermark != log.committed:
                out[partition] = log.watermark
        return out

    def still_owned(self, partitions: Iterable[Partition]) -> Callable[[Partition], bool]:
        """A predicate on ``partitions``: true while the tracker still follows the partition
        it followed when this was called, false for good once :meth:`revoke` gave it up,
        even when it was assigned back since (that is a new log). Offsets computed now
        must not be committed once it is false: the revocation committed newer ones.
        Cheap and safe to call from the consumer's thread (one dict read)."""
        logs = self._logs
        then = {partition: logs.get(partition) for partition in partitions}

        def still_own(partition: Partition) -> bool:
            log = then.get(partition)
            return log is not None and logs.get(partition) is log
        return still_own

    def mark_committed(self, offsets: dict[Partition, int]) -> None:
        for partition, offset in offsets.items():
            log = self._logs.get(partition)
            if log is not None:
                log.committed = offset

    def revoke(self, partitions: list[Partition]) -> dict[Partition, int]:
        """Forget revoked partitions; returns their last committable offsets so the caller
        can commit them before the new owner starts. Tickets still out become orphans:
        releasing them later is harmless."""
        final = {}
        for partition in partitions:
            self._caught_up_ms.pop(partition, None)
            log = self._logs.pop(partition, None)
            if log is None:
                continue
            for ticket in log.tickets:
                if ticket.remaining > 0:  # an orphan from now on: its release must not count
                    self._pending.bytes -= ticket.size
                    ticket.size = 0
            if log.watermark is not None and log.watermark != log.committed:
                final[partition] = log.watermark
        return final

    def record_ms(self, partition: Partition) -> tuple[int | None, int | None]:
        """Timestamps (ms) of the partition's oldest record not settled yet (where its next
        commit stops; None when all are settled) and of the last record tracked (None when
        none was); None too where a record carried no timestamp."""
        log = self._logs.get(partition)
        if log is None:
            return None, None
        oldest = log.tickets[0].ms if log.tickets else 0
        return (oldest if oldest > 0 else None), (log.last_ms if log.last_ms > 0 else None)

    def caught_up(self, partition: Partition, at_ms: float) -> None:
        """``partition`` was seen caught up at ``at_ms`` (ms since the epoch): every record
        up to its end consumed. Forgotten when it is revoked."""
        self._caught_up_ms[partition] = at_ms

    def caught_up_ms(self, partition: Partition) -> float | None:
        """When ``partition`` was last seen caught up since it was assigned (ms), or None."""
        return self._caught_up_ms.get(partition)

    def outstanding(self) -> int:
        """Tickets held: records not settled, and settled ones behind an unsettled one."""
        return sum(len(log.tickets) for log in self._logs.values())

    def oldest_unsettled(self) -> tuple[Partition, int, int] | None:
        """Of the partition holding the most tickets: it, the offset its commits stop at,
        and how many tickets it holds (None when none are held)."""
        if not self._logs:
            return None
        partition, log = max(self._logs.items(), key=lambda item: len(item[1].tickets))
        return (partition, log.tickets[0].offset, len(log.tickets)) if log.tickets else None

    def partitions(self) -> list[Partition]:
        return list(self._logs)
