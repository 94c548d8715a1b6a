"""The relay's run-state store: every collector's :class:`RunStateTable` written to, and
restored from, one :class:`RunStateChangelog` (a passthrough collector's holds only runs saved
while it had another mode, until their output is delivered). See :mod:`relay.state`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from functools import partial

from relay.logs import log_event
from relay.metrics import RelayMetrics
from relay.state.changelog import OK, TOO_LARGE, RunStateChangelog
from relay.state.records import WHOLE
from relay.state.slots import StateWrite
from relay.state.table import RunStateTable

log = logging.getLogger("relay.state")

#: At most this many rounds of writes of a revocation's runs (see settle_revoked): a record
#: refused as too large is made again twice (facets, then outbox left out), each refusal
#: maybe seen twice (a batch too large, then the record alone).
_REVOKED_ROUNDS = 7


class RunStateStore:
    def __init__(self, changelog: RunStateChangelog, tables: list[RunStateTable], metrics: RelayMetrics) -> None:
        self.changelog = changelog
        self._tables = {table.collector: table for table in tables}
        self._metrics = metrics

    async def start(self) -> None:
        await self.changelog.start()

    def flush(self, include_deliveries: bool = False) -> None:
        """Write every dirty run (non-blocking); acknowledgements settle tickets and send
        outboxes. ``include_deliveries``: also runs changed only by deliveries."""
        for table in self._tables.values():
            self._write(table, table.take_writes(include_deliveries))

    def _write(self, table: RunStateTable, writes: list[StateWrite]) -> None:
        for write in writes:
            self.changelog.write(write.partition, write.key, write.value, partial(self._written, table, write))

    def _written(self, table: RunStateTable, write: StateWrite, status: str) -> None:
        self._metrics.state_writes.labels(result=status).inc()
        if status == TOO_LARGE:
            if write.reducible:  # made again smaller (see RunStateTable.written)
                log_event(log, logging.WARNING, "run_state_reduced", collector=table.collector,
                          run_id=write.run_id, bytes=len(write.value or b""),
                          left_out="merged_facets" if write.reduced == WHOLE else "merged_facets,outbox")
            else:  # kept in memory only; stalling the partition forever would be worse
                log_event(log, logging.WARNING, "run_state_not_persisted", collector=table.collector,
                          run_id=write.run_id, bytes=len(write.value or b""))
        table.written(write, ok=status == OK, too_large=status == TOO_LARGE)

    async def settle(self, timeout_s: float, stop: asyncio.Event | None = None) -> bool:
        """Write every changed run and wait for the broker's answers; False on timeout, and
        once ``stop`` is set (at once when it is already): the relay is then shutting down,
        which settles again within its own deadline."""
        self.flush(include_deliveries=True)
        return await self._wait_acked(timeout_s, stop)

    async def settle_revoked(self, partitions: list[int], timeout_s: float, stop: asyncio.Event | None = None) -> bool:
        """Once a revocation has waited for the deliveries of ``partitions``: write again their
        runs whose output was delivered meanwhile (or that changed since their last write),
        wait for the broker's answers as :meth:`settle` does, then forget those runs. Their
        new owner restores those records, and does not send again what was delivered."""
        parts, deadline = set(partitions), time.monotonic() + timeout_s
        try:
            # A record refused (a batch too large, a record too large: made again smaller)
            # is made again while time is left; each round has fewer (or smaller) records.
            for _ in range(_REVOKED_ROUNDS):
                writes = 0
                for table in self._tables.values():
                    taken = table.take_departing_writes(parts)
                    self._write(table, taken)
                    writes += len(taken)
                if not writes:
                    return True
                if not await self._wait_acked(max(0.0, deadline - time.monotonic()), stop):
                    return False
            return True
        finally:
            self.forget_revoked(partitions)

    def forget_revoked(self, partitions: list[int]) -> None:
        """Forget the runs of revoked ``partitions`` without writing them (lost partitions:
        another member may own them already)."""
        parts = set(partitions)
        for table in self._tables.values():
            table.departed(parts)

    async def _wait_acked(self, timeout_s: float, stop: asyncio.Event | None) -> bool:
        if stop is None:
            return await self.changelog.wait_acked(timeout_s)
        acked = asyncio.ensure_future(self.changelog.wait_acked(timeout_s))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((acked, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            acked.cancel()
            stopped.cancel()
        return acked.done() and not acked.cancelled() and acked.result()

    async def restore(self, partitions: list[int], now: float) -> None:
        """Read the state of newly assigned ``partitions`` back into the tables."""
        for partition in partitions:
            records = await self.changelog.read_partition(partition)
            restored: Counter[str] = Counter()
            taken_over: Counter[str] = Counter()
            unknown = unreadable = 0
            for key, value in records.items():
                collector, _, run_id = key.decode("utf-8", "replace").partition("/")
                table = self._tables.get(collector)
                if table is None or not run_id:
                    unknown += 1  # a collector no longer configured
                    continue
                try:
                    if table.restore(run_id, partition, value, now):
                        taken_over[collector] += 1
                except Exception as err:  # noqa: BLE001 - one record must not stop the relay at every start
                    unreadable += 1
                    log_event(log, logging.WARNING, "run_state_unreadable", key=key.decode("utf-8", "replace"),
                              error=str(err)[:300])
                    continue
                restored[collector] += 1
            for collector, count in restored.items():
                self._metrics.runs_restored.labels(collector=collector).inc(count)
            for collector, count in taken_over.items():
                # Open runs saved in the collector's former mode: flushed, then on in its mode now.
                log_event(log, logging.WARNING, "run_state_mode_changed", collector=collector, partition=partition,
                          runs=count, mode=self._tables[collector].mode)
            log_event(log, logging.INFO, "run_state_restored", partition=partition, runs=sum(restored.values()),
                      unknown_collector=unknown, unreadable=unreadable)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is still being written, for up to ``timeout_s``, and stop."""
        await self.changelog.close(timeout_s)
