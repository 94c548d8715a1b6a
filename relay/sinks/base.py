"""The contract between the pipeline and a collector.

A collector takes one event's JSON body and either delivers it, possibly after retries,
or gives up with an :class:`Undeliverable` that names why (the pipeline dead-letters it).
It never drops an event silently and never raises anything else except cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Undeliverable:
    reason: str          # "collector_rejected" | "retries_exhausted"
    detail: str
    status: int | None = None


class Collector(Protocol):
    name: str

    async def start(self) -> None: ...

    async def deliver(self, body: bytes) -> Undeliverable | None:
        """None when the collector acknowledged the event."""

    async def close(self) -> None: ...
