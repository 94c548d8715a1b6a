"""The run-state topic as a dict, for tests of the run-state store without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from relay.state.changelog import OK, TOO_LARGE


class CompactedTopic:
    """What :class:`~relay.state.changelog.RunStateChangelog` offers the store: the latest
    record of each key, each write answered on a later turn of the loop. A record longer
    than ``max_record_bytes`` is refused as too large (as a broker's ``max.message.bytes``)."""

    def __init__(self, max_record_bytes: int | None = None) -> None:
        self.records: dict[bytes, bytes | None] = {}
        self.partition_of: dict[bytes, int] = {}
        self.writes = 0
        self.unacked = 0
        self._max = max_record_bytes
        self._idle = asyncio.Event()
        self._idle.set()

    def write(self, partition: int, key: bytes, value: bytes | None, on_done: Callable[[str], None]) -> None:
        self.writes += 1
        self.unacked += 1
        self._idle.clear()
        status = TOO_LARGE if self._max is not None and len(value or b"") > self._max else OK

        def answer() -> None:
            if status == OK:
                self.records[key] = value
                self.partition_of[key] = partition
            self.unacked -= 1
            if not self.unacked:
                self._idle.set()
            on_done(status)
        asyncio.get_running_loop().call_soon(answer)

    async def wait_acked(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def read_partition(self, partition: int) -> dict[bytes, bytes]:
        """The partition's records, tombstones left out (as compaction leaves them, read back)."""
        return {key: value for key, value in self.records.items()
                if value is not None and self.partition_of.get(key, 0) == partition}
