"""A loopback collector that takes each event and answers (201) only once the test opens
its gate: a sender waits in its request for as long as the test wants."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from relay.embedded.broker import free_port
from relay.embedded.collector import AppThread


class GatedCollector:
    """Records each body as it arrives; answers 201 once :meth:`open` was called (each
    request waits at most ``wait_s``: the collector's timeout in a test should be longer)."""

    def __init__(self, *, wait_s: float = 240.0) -> None:
        self.bodies: list[bytes] = []
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self._wait_s = wait_s
        app = web.Application()
        app.router.add_post("/api/v1/lineage", self._handle)
        self._thread = AppThread(app, "127.0.0.1", free_port(), name="gated-collector")
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._lock:
            self.bodies.append(body)
        await asyncio.get_running_loop().run_in_executor(None, self._gate.wait, self._wait_s)
        return web.Response(status=201)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.bodies)

    def open(self) -> None:
        self._gate.set()

    def __enter__(self) -> GatedCollector:
        self.url = f"http://127.0.0.1:{self._thread.start()}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._gate.set()
        self._thread.stop()
