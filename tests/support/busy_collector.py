"""A loopback collector with a fixed capacity, for adaptive concurrency (tests and bench):
it serves ``workers`` requests at once, ``service_s`` each; beyond that requests queue
(``shed=False``, their latency grows with the queue) or are answered 429 at once
(``shed=True``)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from relay.embedded.broker import free_port
from relay.embedded.collector import AppThread


class BusyCollector:
    """A collector that serves ``workers`` requests at once, ``service_s`` each. Beyond that,
    with ``shed=False`` requests queue (their latency grows with the queue); with
    ``shed=True`` they are answered 429 at once. Records how many requests were in its hands
    when each one arrived."""

    def __init__(self, *, workers: int, service_s: float, shed: bool) -> None:
        self.workers, self.service_s, self.shed = workers, service_s, shed
        self.in_hand = 0
        self.seen_in_hand: list[int] = []
        self.ok = 0
        self.shed_count = 0
        self.received: list[bytes] = []  # the bodies it accepted, in order
        self._slots: asyncio.Semaphore | None = None
        app = web.Application()
        app.router.add_post("/api/v1/lineage", self._handle)
        self._thread = AppThread(app, "127.0.0.1", free_port(), name="busy-collector")
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        self.in_hand += 1
        self.seen_in_hand.append(self.in_hand)
        try:
            if self.shed and self.in_hand > self.workers:
                self.shed_count += 1
                return web.Response(status=429)
            async with self._slots:
                await asyncio.sleep(self.service_s)  # ok: the collector's service time
            self.ok += 1
            self.received.append(body)
            return web.Response(status=201)
        finally:
            self.in_hand -= 1

    def __enter__(self) -> BusyCollector:
        self.url = f"http://127.0.0.1:{self._thread.start()}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop()
