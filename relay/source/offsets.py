"""Which offsets may be committed.

Contract: an offset is committable only when every record at or below it in its
partition has settled, i.e. reached every collector it was routed to, or the
dead-letter topic, or was deliberately not forwarded (duplicate, after-terminal).
Each record gets a :class:`Ticket`; whoever takes on an obligation for the record
calls ``acquire()`` and later ``release()``. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable

Partition = tuple[str, int]


class _PartitionLog:
    __slots__ = ("tickets", "watermark", "committed")

    def __init__(self) -> None:
        self.tickets: deque[Ticket] = deque()
        #: Next offset to commit (one past the highest settled contiguous offset), or None.
        self.watermark: int | None = None
        self.committed: int | None = None

    def advance(self) -> None:
        tickets = self.tickets
        while tickets and tickets[0].remaining == 0:
            self.watermark = tickets.popleft().offset + 1


class Ticket:
    """One consumed record's outstanding obligations. Created holding one (the
    dispatcher's own), so it cannot settle while it is still being fanned out."""

    __slots__ = ("offset", "remaining", "_log")

    def __init__(self, offset: int, log: _PartitionLog) -> None:
        self.offset = offset
        self.remaining = 1
        self._log = log

    def acquire(self) -> None:
        self.remaining += 1

    def release(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            log = self._log
            if log.tickets and log.tickets[0] is self:
                log.advance()

    @property
    def settled(self) -> bool:
        return self.remaining == 0


class OffsetTracker:
    """Tracks tickets per assigned partition and reports committable offsets."""

    def __init__(self) -> None:
        self._logs: dict[Hashable, _PartitionLog] = {}

    def track(self, partition: Partition, offset: int) -> Ticket:
        log = self._logs.get(partition)
        if log is None:
            log = self._logs[partition] = _PartitionLog()
        ticket = Ticket(offset, log)
        log.tickets.append(ticket)
        return ticket

    def committable(self) -> dict[Partition, int]:
        """Offsets (next to read) that advanced since the last ``mark_committed``."""
        out = {}
        for partition, log in self._logs.items():
            if log.watermark is not None and log.watermark != log.committed:
                out[partition] = log.watermark
        return out

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
            log = self._logs.pop(partition, None)
            if log is not None and log.watermark is not None and log.watermark != log.committed:
                final[partition] = log.watermark
        return final

    def outstanding(self) -> int:
        return sum(len(log.tickets) for log in self._logs.values())

    def partitions(self) -> list[Partition]:
        return list(self._logs)
