"""Loopback stand-ins for real lineage collectors, each checking what the real one checks.

One :class:`KindServer` per collector kind, on its own thread and event loop, answering
like the real service: the path, the ``Authorization: Bearer`` header (when the service
needs one; :attr:`KindServer.token` may be changed while it runs, to model a rotation),
the JSON content type, the body shape (one event object; for a batch, the kind's
envelope) and the event kinds the service takes. What it accepted is in
:attr:`KindServer.events`; every request, accepted or not, in :attr:`KindServer.requests`.

* Marquez: ``POST /api/v1/lineage``, any event kind, 201; 400 for a non-object body,
  422 for an event without ``eventTime``/``producer``. :data:`MARQUEZ_0_42` answers
  DatasetEvents and JobEvents 200 without storing them, as Marquez 0.35.0-0.42.x do.
* Atlan: ``POST /events/openlineage/<connector>/api/v1/lineage``, API key required,
  RunEvents only (400 otherwise), 200; another connector's path is answered 401
  ``Unauthorized: url path not configured to receive data, urlPath: ...``, as Atlan does
  for a connector that is not set up.
* DataHub: ``POST /openapi/openlineage/api/v1/lineage``, token required, RunEvents only
  (400 otherwise), 201.
* OpenMetadata: ``POST /api/v1/openlineage/lineage`` (200 with a JSON status) and
  ``POST /api/v1/openlineage/lineage/batch`` taking ``{"events": [...]}`` (200 with
  ``summary`` and ``failedEvents`` for events it could not take; events :attr:`KindServer.partial`
  picks are taken but reported in ``summary.partial`` and ``unresolvedDatasets``, not in
  ``failedEvents``, with ``status: partial_success``; 400 with ``failedEvents`` when every
  event failed, as the newest releases answer), JWT required, RunEvents only.

Faults, settable while the server runs: :attr:`KindServer.fails_on` picks events answered
a steady bare 500 (an event the service throws on: Marquez, DataHub, OpenMetadata's
single endpoint), while the others are taken; :attr:`KindServer.outage` answers every
request with one status (the service is down); :attr:`KindServer.batch_answers` and
:attr:`KindServer.batch_answer` answer batch requests with a status of their own (404: no
batch endpoint, or a proxy saying so for a while).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
    #: Event kinds answered 200 and not stored (Marquez 0.35.0-0.42.x: dataset, job).
    skipped_kinds: tuple[str, ...] = ()
    #: ``/events/openlineage/{connector}/api/v1/lineage`` of other connectors answers 401 (Atlan).
    connector_paths: bool = False
    #: The status of a batch whose every event failed (the newest OpenMetadata: 400).
    all_failed_status: int = 200


MARQUEZ = Contract("/api/v1/lineage", 201, needs_token=False, run_events_only=False)
MARQUEZ_0_42 = replace(MARQUEZ, skipped_kinds=("dataset", "job"))
DATAHUB = Contract("/openapi/openlineage/api/v1/lineage", 201, needs_token=True, run_events_only=True)
OPENMETADATA = Contract("/api/v1/openlineage/lineage", 200, needs_token=True, run_events_only=True,
                        batch_path="/api/v1/openlineage/lineage/batch", batch_envelope="events_object",
                        json_answer=True, all_failed_status=400)
#: A generic OpenLineage HTTP endpoint with the proposed ``POST .../lineage/batch`` (a JSON array).
GENERIC = Contract("/api/v1/lineage", 201, needs_token=False, run_events_only=False,
                   batch_path="/api/v1/lineage/batch", batch_envelope="array")
ATLAN_PATHS = "/events/openlineage/{connector}/api/v1/lineage"


def atlan(connector: str) -> Contract:
    return Contract(ATLAN_PATHS.format(connector=connector), 200, needs_token=True, run_events_only=True,
                    connector_paths=True)


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
    #: Events answered a steady bare 500 (single events; in a batch: listed as failed).
    fails_on: Callable[[dict[str, Any]], bool] | None = None
    #: Every request answered with this status (the service is down); None: up.
    outage: int | None = None
    #: Batch events taken with some datasets left unresolved (OpenMetadata's ``partial``).
    partial: Callable[[dict[str, Any]], bool] | None = None
    #: A batch holding a ``fails_on`` event is answered a bare 500 as a whole, nothing of it
    #: taken (a server whose exception escapes its per-event loop), instead of listing it.
    whole_batch_500: bool = False
    #: Every batch request answered with this status (404, 405, 501: no batch endpoint).
    batch_answer: int | None = None
    #: Statuses the next batch requests are answered with, one each, before ``batch_answer``
    #: (a proxy or an old instance answering 404 for a while), the events not taken; None:
    #: that request is answered as without the script.
    batch_answers: list[int | None] = field(default_factory=list)

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

    def _down(self, request: web.Request, events: int) -> web.Response | None:
        outage = self.outage
        if outage is None:
            return None
        self._log(request, outage, events)
        return web.Response(status=outage, text="service unavailable" if outage != 500 else "")

    async def _single(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if (down := self._down(request, 1)) is not None:
            return down
        problem = self._refusal(request)
        if problem is None and self.contract.connector_paths and request.path != self.contract.path:
            problem = (401, f"Unauthorized: url path not configured to receive data, urlPath: {request.path}")
        if problem is None:
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError:
                doc = None
            problem = self._event_problem(doc)
        if problem is None and self.fails_on is not None and self.fails_on(doc):
            # Marquez and DataHub answer an exception while handling an event with a bare 500.
            problem = (500, orjson.dumps({"status": "failure", "message": "Error processing event: boom"}).decode()
                       if self.contract.json_answer else "")
        if problem is not None:
            self._log(request, problem[0], 1)
            return web.Response(status=problem[0], text=problem[1])
        if kind_of(doc) in self.contract.skipped_kinds:
            self._log(request, 200, 1)  # Marquez 0.35-0.42: "Unsupported event type ... Skipping without error"
            return web.Response(status=200, body=raw, content_type="application/json")
        with self._lock:
            self.events.append(doc)
        self._log(request, self.contract.ok_status, 1)
        if self.contract.json_answer:
            return web.json_response({"status": "success", "message": "Event processed",
                                      "lineageEdgesCreated": 1}, status=self.contract.ok_status)
        return web.Response(status=self.contract.ok_status)

    async def _batch(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if (down := self._down(request, 0)) is not None:
            return down
        with self._lock:
            scripted = self.batch_answers.pop(0) if self.batch_answers else self.batch_answer
        if scripted is not None:
            self._log(request, scripted, 0)
            return web.Response(status=scripted, text="no batch endpoint here")
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
        if self.whole_batch_500 and self.fails_on is not None and any(
                isinstance(d, dict) and self.fails_on(d) for d in docs):
            self._log(request, 500, len(docs))
            return web.Response(status=500, text="Internal Server Error")
        failed, unresolved = [], []
        for index, doc in enumerate(docs):
            bad = self._event_problem(doc)
            if bad is None and self.fails_on is not None and self.fails_on(doc):
                bad = (500, "java.lang.IllegalStateException: boom")
            if bad is not None:
                failed.append({"index": index, "reason": bad[1], "retriable": False})
                continue
            if self.partial is not None and self.partial(doc):
                unresolved.append({"eventIndex": index, "namespace": "s3://nowhere", "name": "unknown_table",
                                   "reason": "notFound", "message": "no table found; not created"})
            with self._lock:
                self.events.append(doc)
        partial = len({u["eventIndex"] for u in unresolved})
        summary = {"received": len(docs), "successful": len(docs) - len(failed) - partial, "failed": len(failed),
                   "partial": partial, "skipped": 0}
        if not failed and not partial:
            status = "success"
        else:
            status = "failure" if len(failed) == len(docs) else "partial_success"
        answer: dict[str, Any] = {"status": status, "summary": summary, "lineageEdgesCreated": len(docs) - len(failed)}
        if failed:
            answer["failedEvents"] = failed
        if unresolved:
            answer["unresolvedDatasets"] = unresolved
        code = self.contract.all_failed_status if failed and len(failed) == len(docs) else 200
        self._log(request, code, len(docs))
        return web.json_response(answer, status=code)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> KindServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(ATLAN_PATHS if self.contract.connector_paths else self.contract.path, self._single)
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
