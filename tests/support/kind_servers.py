"""Loopback stand-ins for real lineage collectors, each checking what the real one checks.

One :class:`KindServer` per collector kind, on its own thread and event loop, answering
like the real service: the path, the ``Authorization: Bearer`` header (when the service
needs one; :attr:`KindServer.token` may be changed while it runs, to model a rotation),
the JSON content type, the body shape (one event object; for a batch, the kind's
envelope) and the event kinds the service takes. What it accepted is in
:attr:`KindServer.events`; every request, accepted or not, in :attr:`KindServer.requests`.

* Marquez: ``POST /api/v1/lineage``, any event kind, 201; 400 for a non-object body,
  422 for an event without ``eventTime``/``producer``.
* Atlan: ``POST /events/openlineage/<connector>/api/v1/lineage``, API key required,
  RunEvents only (400 otherwise), 200.
* DataHub: ``POST /openapi/openlineage/api/v1/lineage``, token required, RunEvents only
  (400 otherwise), 201.
* OpenMetadata: ``POST /api/v1/openlineage/lineage`` (200 with a JSON status) and
  ``POST /api/v1/openlineage/lineage/batch`` taking ``{"events": [...]}`` (200 with
  ``summary`` and ``failedEvents`` for events it could not take), JWT required, RunEvents
  only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from relay.embedded.collector import AppThread


@dataclass(frozen=True)
class Contract:
    path: str
    ok_status: int
    needs_token: bool
    run_events_only: bool
    #: ``None``: no batch endpoint; ``"events_object"``: ``{"events": [...]}``; ``"array"``.
    batch_path: str | None = None
    batch_envelope: str | None = None
    #: Answer a single event with ``{"status": "success", ...}`` (OpenMetadata).
    json_answer: bool = False


MARQUEZ = Contract("/api/v1/lineage", 201, needs_token=False, run_events_only=False)
DATAHUB = Contract("/openapi/openlineage/api/v1/lineage", 201, needs_token=True, run_events_only=True)
OPENMETADATA = Contract("/api/v1/openlineage/lineage", 200, needs_token=True, run_events_only=True,
                        batch_path="/api/v1/openlineage/lineage/batch", batch_envelope="events_object",
                        json_answer=True)


def atlan(connector: str) -> Contract:
    return Contract(f"/events/openlineage/{connector}/api/v1/lineage", 200, needs_token=True, run_events_only=True)


@dataclass(frozen=True)
class Request:
    path: str
    status: int
    authorization: str | None
    #: Events in the body (1 for a single event).
    events: int


def kind_of(doc: dict[str, Any]) -> str:
    if isinstance(doc.get("run"), dict):
        return "run"
    if isinstance(doc.get("dataset"), dict):
        return "dataset"
    return "job"


@dataclass
class KindServer:
    contract: Contract
    token: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: AppThread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- checks, as the real service makes them ----------------------------------------
    def _refusal(self, request: web.Request) -> tuple[int, str] | None:
        if self.contract.needs_token or self.token is not None:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return 401, "unauthorized"
        if not request.content_type.startswith("application/json"):
            return 415, "expected application/json"
        return None

    def _event_problem(self, doc: Any) -> tuple[int, str] | None:
        if not isinstance(doc, dict):
            return 400, "an event must be a JSON object"
        if self.contract.run_events_only and kind_of(doc) != "run":
            return 400, f"unsupported event: a {kind_of(doc)} event is not a RunEvent"
        if "eventTime" not in doc or "producer" not in doc:
            return 422, "eventTime and producer are required"
        return None

    def _log(self, request: web.Request, status: int, events: int) -> None:
        with self._lock:
            self.requests.append(Request(request.path, status, request.headers.get("Authorization"), events))

    async def _single(self, request: web.Request) -> web.Response:
        raw = await request.read()
        problem = self._refusal(request)
        if problem is None:
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError:
                doc = None
            problem = self._event_problem(doc)
        if problem is not None:
            self._log(request, problem[0], 1)
            return web.Response(status=problem[0], text=problem[1])
        with self._lock:
            self.events.append(doc)
        self._log(request, self.contract.ok_status, 1)
        if self.contract.json_answer:
            return web.json_response({"status": "success", "message": "Event processed",
                                      "lineageEdgesCreated": 1}, status=self.contract.ok_status)
        return web.Response(status=self.contract.ok_status)

    async def _batch(self, request: web.Request) -> web.Response:
        raw = await request.read()
        problem = self._refusal(request)
        docs: Any = None
        if problem is None:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = None
            if self.contract.batch_envelope == "events_object":
                docs = body.get("events") if isinstance(body, dict) else None
            else:
                docs = body
            if not isinstance(docs, list):
                problem = (400, f"batch body must be {self.contract.batch_envelope}")
        if problem is not None:
            self._log(request, problem[0], 0)
            return web.Response(status=problem[0], text=problem[1])
        failed = []
        for index, doc in enumerate(docs):
            bad = self._event_problem(doc)
            if bad is not None:
                failed.append({"index": index, "reason": bad[1], "retriable": False})
                continue
            with self._lock:
                self.events.append(doc)
        self._log(request, 200, len(docs))
        summary = {"received": len(docs), "successful": len(docs) - len(failed), "failed": len(failed), "skipped": 0}
        status = "success" if not failed else ("partial_success" if len(failed) < len(docs) else "failure")
        answer: dict[str, Any] = {"status": status, "summary": summary, "lineageEdgesCreated": len(docs)}
        if failed:
            answer["failedEvents"] = failed
        return web.json_response(answer)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> KindServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(self.contract.path, self._single)
        if self.contract.batch_path is not None:
            app.router.add_post(self.contract.batch_path, self._batch)

        self._server = AppThread(app, "127.0.0.1", self.port, name="kind-server")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def seen(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def wait_for(self, predicate, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)  # ok: poll interval of a wait with a deadline
        return bool(predicate(self))

    def __enter__(self) -> KindServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
