"""A local lineage collector that records what it receives, with scripted faults.

It follows the OpenLineage HTTP contract as Marquez implements it: ``POST <path>`` with
a JSON body; 201 on success, 415 without a JSON content type, 400 for a body that is not
a JSON object, 401 when a token is configured and the Bearer header does not match.
With ``batch_path`` it also serves the spec's ``POST /lineage/batch``: a JSON array of
events; 204 when every event was taken, else 200 with ``{"status": "partial_success",
"summary": {...}, "failed_events": [{"index", "reason", "retriable"}]}`` (an event
:meth:`reject_when` refuses fails alone; retriable when its status is 408, 429 or 5xx).
Faults are scripted per request (:meth:`RecordingCollector.fail_next`), for a period
(:meth:`set_outage`), or by content (:meth:`reject_when`), including slow answers and
connection resets.

Runs on its own thread and event loop (``start()``/``stop()``), or as a process:
``python -m relay.embedded.collector --port 5000`` (``GET /stats`` returns the count).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from relay.stages.json_bytes import dumps

if TYPE_CHECKING:
    from relay.embedded.store import LineageStore


@dataclass(frozen=True)
class Fault:
    status: int = 503
    retry_after: str | None = None
    delay_s: float = 0.0
    #: Close the connection without answering.
    reset: bool = False
    body: str = "scripted fault"


@dataclass(frozen=True)
class Received:
    event: dict[str, Any]
    raw: bytes
    headers: dict[str, str]
    at: float


@dataclass(frozen=True)
class Attempt:
    at: float
    status: int | None
    run_id: str | None
    event_type: str | None


@dataclass
class _Script:
    next_faults: deque[Fault] = field(default_factory=deque)
    outage: Fault | None = None
    rejector: Callable[[dict[str, Any]], int | None] | None = None


class RecordingCollector:
    def __init__(self, *, path: str = "/api/v1/lineage", ok_status: int = 201, token: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, record: bool = True, latency_s: float = 0.0,
                 store: LineageStore | None = None, batch_path: str | None = None) -> None:
        self.path = path
        self.batch_path = batch_path
        #: Batch requests answered (any status).
        self.batches = 0
        #: Added to every successful answer, to model a collector's processing time.
        self.latency_s = latency_s
        self.ok_status = ok_status
        self.token = token
        self.host, self.port = host, port
        self.record = record
        self.received: list[Received] = []
        self.attempts: list[Attempt] = []
        self.count = 0
        #: Requests received whose answer is not sent yet (a test can wait for quiescence).
        self.in_flight = 0
        #: Every accepted event is also added here; a store that fails makes the answer a 500.
        self.store = store
        self._script = _Script()
        self._lock = threading.Lock()
        self._server: AppThread | None = None

    # -- fault scripting (thread-safe) ----------------------------------------------
    def fail_next(self, n: int, status: int = 503, *, retry_after: str | None = None, delay_s: float = 0.0,
                  reset: bool = False) -> None:
        with self._lock:
            self._script.next_faults.extend([Fault(status, retry_after, delay_s, reset)] * n)

    def set_outage(self, status: int = 503, *, retry_after: str | None = None, reset: bool = False) -> None:
        with self._lock:
            self._script.outage = Fault(status, retry_after, reset=reset)

    def clear_outage(self) -> None:
        with self._lock:
            self._script.outage = None

    def reject_when(self, predicate: Callable[[dict[str, Any]], int | None]) -> None:
        """``predicate(event)`` returns a status to answer with instead of success, or None."""
        with self._lock:
            self._script.rejector = predicate

    # -- reading what arrived ---------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.event for r in self.received]

    def wait_for(self, predicate: Callable[[RecordingCollector], bool], timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)  # polling a condition with a deadline
        return predicate(self)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- server -------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.in_flight += 1
        try:
            return await self._handle_one(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _handle_one(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        now = time.monotonic()
        with self._lock:
            fault = self._script.next_faults.popleft() if self._script.next_faults else self._script.outage
            rejector = self._script.rejector
        doc: Any = None
        if fault is None:
            if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
                return self._answer(now, 401, None, "unauthorized")
            if not request.content_type.startswith("application/json"):
                return self._answer(now, 415, None, "expected application/json")
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return self._answer(now, 400, None, "body is not JSON")
            if not isinstance(doc, dict):
                return self._answer(now, 400, None, "body is not a JSON object")
            if rejector is not None:
                status = rejector(doc)
                if status is not None:
                    return self._answer(now, status, doc, "rejected by script")
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if self.store is not None:
                self.store.add(doc)
            with self._lock:
                self.count += 1
                if self.record:
                    self.received.append(Received(doc, raw, dict(request.headers), now))
            return self._answer(now, self.ok_status, doc, "")
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.reset:
            self._note(now, None, raw)
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=fault.status)
        headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
        self._note(now, fault.status, raw)
        return web.Response(status=fault.status, text=fault.body, headers=headers)

    async def _handle_batch(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.in_flight += 1
            self.batches += 1
        try:
            return await self._handle_batch_one(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _handle_batch_one(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        now = time.monotonic()
        with self._lock:
            fault = self._script.next_faults.popleft() if self._script.next_faults else self._script.outage
            rejector = self._script.rejector
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.reset and request.transport is not None:
                request.transport.close()
                return web.Response(status=fault.status)
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return web.Response(status=fault.status, text=fault.body, headers=headers)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=401, text="unauthorized")
        if not request.content_type.startswith("application/json"):
            return web.Response(status=415, text="expected application/json")
        try:
            docs = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return web.Response(status=400, text="body is not JSON")
        if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
            return web.Response(status=400, text="batch body is not a JSON array of event objects")
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        failed = []
        for index, doc in enumerate(docs):
            status = rejector(doc) if rejector is not None else None
            if status is not None:
                failed.append({"index": index, "reason": f"rejected by script with {status}",
                               "retriable": status in (408, 429) or status >= 500})
                self._note(now, status, doc)
                continue
            if self.store is not None:
                self.store.add(doc)
            with self._lock:
                self.count += 1
                if self.record:
                    self.received.append(Received(doc, dumps(doc), dict(request.headers), now))
            self._note(now, self.ok_status, doc)
        if not failed:
            return web.Response(status=204)
        retriable = sum(1 for f in failed if f["retriable"])
        summary = {"received": len(docs), "successful": len(docs) - len(failed), "failed": len(failed),
                   "retriable": retriable, "non_retriable": len(failed) - retriable}
        return web.json_response({"status": "partial_success", "summary": summary, "failed_events": failed})

    def _note(self, now: float, status: int | None, raw_or_doc: Any) -> None:
        doc = raw_or_doc
        if isinstance(raw_or_doc, bytes):
            try:
                doc = orjson.loads(raw_or_doc)
            except orjson.JSONDecodeError:
                doc = None
        run_id = event_type = None
        if isinstance(doc, dict):
            run_id = (doc.get("run") or {}).get("runId") if isinstance(doc.get("run"), dict) else None
            event_type = doc.get("eventType")
        if self.record:
            with self._lock:
                self.attempts.append(Attempt(now, status, run_id, event_type))

    def _answer(self, now: float, status: int, doc: Any, text: str) -> web.Response:
        self._note(now, status, doc)
        return web.Response(status=status, text=text)

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response({"count": self.count, "batches": self.batches})

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(self.path, self._handle)
        if self.batch_path is not None:
            app.router.add_post(self.batch_path, self._handle_batch)
        app.router.add_get("/stats", self._stats)
        return app

    def start(self) -> RecordingCollector:
        self._server = AppThread(self.build_app(), self.host, self.port, name="recording-collector")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> RecordingCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AppThread:
    """An aiohttp application served on its own thread and event loop, so that synchronous
    code (tests, the demo) can run a real HTTP server next to it."""

    def __init__(self, app: web.Application, host: str, port: int, *, name: str) -> None:
        self._app, self._host, self._port, self._name = app, host, port, name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> int:
        """Serve; returns the bound port (the one asked for, or the free one given for 0)."""
        ready = threading.Event()
        runner = web.AppRunner(self._app, access_log=None)
        bound: list[int] = []

        async def serve() -> None:
            await runner.setup()
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            bound.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

        def target() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(serve())
            finally:
                ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=target, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or not bound:
            raise RuntimeError(f"{self._name} did not start on {self._host}:{self._port}")
        return bound[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._thread = None


def main() -> None:
    parser = argparse.ArgumentParser(description="a local collector that counts what it receives")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--path", default="/api/v1/lineage")
    parser.add_argument("--batch-path", help="also serve the spec's batch endpoint here, e.g. /api/v1/lineage/batch")
    parser.add_argument("--record", action="store_true", help="keep every event in memory")
    args = parser.parse_args()
    collector = RecordingCollector(path=args.path, host=args.host, port=args.port, record=args.record,
                                   batch_path=args.batch_path)
    try:
        import uvloop  # type: ignore[import-not-found]
        uvloop.install()
    except ImportError:
        pass
    web.run_app(collector.build_app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
