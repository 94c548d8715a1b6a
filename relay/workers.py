"""``workers`` above 1: one supervisor process runs that many relay processes in the pod,
each one member of the consumer group (its own partitions, decoding on its own thread).

The supervisor (``lineage-relay run`` itself) validates the configuration, listens on
``http.host``/``http.port``, then starts the workers as ``python -m relay run <the same
arguments>`` with :data:`WORKER_ENV` set (so each runs on the event loop ``event_loop``
names, as the supervisor does). A worker runs exactly one relay, serves its own endpoint
on 127.0.0.1 (a free port, reported on a pipe), logs ``"worker": <index>`` on every line,
and holds the read end of a life-line pipe whose write end only the supervisor
has: when the supervisor is gone (killed with SIGKILL too) the pipe reads EOF and the
worker stops gracefully (drain, commit, exit 0).

The supervisor serves:

- ``/healthz``: 200 when every worker runs and its own ``/healthz`` answers 200, else 503;
  the body lists each worker's status;
- ``/readyz``: 200 when every worker's ``/readyz`` answers 200, else 503; the body has
  ``ready`` and, per worker, its ``ready``, ``partitions`` and ``reason``;
- ``/metrics``: every worker's metrics, each sample labelled ``worker="<index>"``, and
  ``lineage_relay_workers``, ``..._workers_alive``, ``..._workers_unscraped`` (a worker
  that did not answer within :data:`SCRAPE_TIMEOUT_S` is left out of that scrape).

Stopping: on SIGTERM or SIGINT the supervisor starts no further worker, sends SIGTERM to
every worker started, waits up to ``drain_timeout_s`` + ``relay.app.CLOSE_MARGIN_S`` +
:data:`EXIT_MARGIN_S` for them, SIGKILLs those still running, and exits 0 when every worker
exited 0 or of that SIGTERM (or of a SIGINT: a terminal's Ctrl-C reaches the whole process
group; workers ignore it from their start, but one may come before), else 2 when one exited
2, else 1. Workers handle SIGTERM only: SIGINT is the supervisor's to turn into a stop.

Policy on a worker that exits on its own (a crash, kill -9, its own start-up error):
fail fast. The supervisor logs ``worker_exited``, stops the other workers as above and
exits non-zero: 2 when that worker, or one that exited with it or while being stopped,
exited 2 (a configuration problem), else 1. An exit while a stop was asked for is part of the stop.
Whatever fails in the supervisor itself, at start-up too, the workers it started are
stopped as above before the error goes on. It does not
restart workers: the orchestrator restarts the pod, and a crash loop shows as one
(Kubernetes' CrashLoopBackOff) instead of hiding in a pod that looks alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from relay.config import RelayConfig
from relay.event_loop import loop_name
from relay.logs import log_event
from relay.server import listen
from relay.stages.decode_worker import package_env
from relay.worker_link import WORKER_ENV
from relay.worker_metrics import merge_expositions

log = logging.getLogger("relay.workers")

#: How long a probe or a scrape waits for one worker.
SCRAPE_TIMEOUT_S = 2.0
#: After a worker's own bound (drain_timeout_s + CLOSE_MARGIN_S): its threads and interpreter ending.
EXIT_MARGIN_S = 5.0
#: A worker's exit codes that are a clean end once a stop was asked for: 0, or killed by
#: the SIGTERM the supervisor sent (before its handler was in place) or by a SIGINT.
STOPPED_CLEANLY = (0, -signal.SIGTERM, -signal.SIGINT)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG40`` for a real-time signal that has no name of its own."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


class Worker:
    """The supervisor's side of one worker process."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: asyncio.subprocess.Process | None = None
        self.port: int | None = None
        self._lifeline_w: int | None = None
        self._port_read: asyncio.Future | None = None

    async def start(self, argv: list[str]) -> None:
        report_r, report_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        env = {**package_env(), WORKER_ENV: f"{self.index},{report_w},{lifeline_r}"}
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "relay", *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(report_w, lifeline_r))
        except BaseException:
            os.close(report_r)
            os.close(lifeline_w)
            raise
        finally:
            os.close(report_w)
            os.close(lifeline_r)
        self._lifeline_w = lifeline_w  # held, never written: closed when this process ends
        self._port_read = asyncio.ensure_future(self._read_port(report_r))  # held: a task nobody holds may vanish

    async def _read_port(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb"))
        try:
            line = await reader.readline()
            if line.strip().isdigit():
                self.port = int(line)
        finally:
            transport.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    async def get(self, session: aiohttp.ClientSession, path: str) -> tuple[int, bytes] | None:
        """``path`` of the worker's endpoint: (status, body), or None when it did not answer."""
        if self.port is None or not self.alive:
            return None
        try:
            async with session.get(f"http://127.0.0.1:{self.port}{path}") as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):  # RuntimeError: the session closed
            return None


class Supervisor:
    """Runs ``count`` workers (``python -m relay <argv>``) and serves their merged endpoint
    (see the module docstring). :meth:`run` returns once every worker it started has exited:
    it never leaves one running, also when it raises. :meth:`request_stop` may come at any
    time, during start-up too (the workers not started yet are then never started)."""

    def __init__(self, config: RelayConfig, argv: list[str], count: int) -> None:
        self.config = config
        self.argv = argv
        self.workers = [Worker(i) for i in range(count)]
        self._stop = asyncio.Event()
        #: The first worker that exited on its own, and its exit code (one that exited 2
        #: when several exited at once).
        self.failed: tuple[Worker, int] | None = None
        self._session: aiohttp.ClientSession | None = None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, bind: Callable[[web.Application], Awaitable[web.AppRunner | None]]) -> int:
        """Listen (``bind(app)``, which may raise), start the workers, supervise them until a
        stop or a worker's exit, stop them all; the exit code (see the module docstring)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        runner = None
        codes: list[int] = []
        try:
            runner = await bind(self.build_app())
            await self._start_workers()
            await self._supervise()
        finally:  # whatever happened, the workers started are stopped before this returns or raises
            try:
                codes = await self._stop_workers()
            finally:  # the endpoint first: a probe served meanwhile still has the session
                try:
                    if runner is not None:
                        await runner.cleanup()
                finally:
                    await self._session.close()
        log_event(log, logging.INFO, "workers_stopped", exit_codes=codes)
        if self.failed is not None:  # 2 when it, or one stopped after it, exited 2 (a configuration problem)
            return 2 if self.failed[1] == 2 or 2 in codes else 1
        if all(code in STOPPED_CLEANLY for code in codes):
            return 0
        return 2 if 2 in codes else 1

    async def _start_workers(self) -> None:
        for worker in self.workers:
            if self._stop.is_set():  # stopped during start-up: start no more
                break
            await worker.start(self.argv)
        log_event(log, logging.INFO, "workers_started", workers=len(self.workers),
                  pids=[w.proc.pid for w in self.workers if w.proc is not None], event_loop=loop_name())

    async def _supervise(self) -> None:
        """Until a stop is asked for or a worker exits; a worker that exited unasked is
        :attr:`failed`."""
        waits = {asyncio.ensure_future(w.proc.wait()): w for w in self.workers if w.proc is not None}
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stop, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            for task in waits:
                task.cancel()
        if self._stop.is_set():  # a worker exiting with it is part of the stop
            return
        exited = [(waits[task], task.result()) for task in done if task in waits]
        for worker, code in sorted(exited, key=lambda pair: pair[0].index):
            log_event(log, logging.ERROR, "worker_exited", worker=worker.index, pid=worker.proc.pid,
                      **({"signal": signal_name(-code)} if code < 0 else {"exit_code": code}),
                      action="stopping the other workers")
        self.failed = max(exited, key=lambda pair: (pair[1] == 2, -pair[0].index))

    async def _stop_workers(self) -> list[int]:
        from relay.app import CLOSE_MARGIN_S

        procs = [w.proc for w in self.workers if w.proc is not None]
        if not procs:
            return []
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs],
                                        timeout=self.config.drain_timeout_s + CLOSE_MARGIN_S + EXIT_MARGIN_S)
        if pending:
            stragglers = [w for w in self.workers if w.alive]
            log_event(log, logging.ERROR, "workers_killed", workers=[w.index for w in stragglers],
                      reason="still running past drain_timeout_s + close and exit margins")
            for worker in stragglers:
                worker.signal(signal.SIGKILL)
            await asyncio.gather(*pending, return_exceptions=True)
        return [p.returncode if p.returncode is not None else -9 for p in procs]

    # -- the endpoint ------------------------------------------------------------------
    async def _ask_all(self, path: str) -> list[tuple[int, bytes] | None]:
        assert self._session is not None
        return await asyncio.gather(*(w.get(self._session, path) for w in self.workers))

    def build_app(self) -> web.Application:
        async def healthz(_req: web.Request) -> web.Response:
            answers = await self._ask_all("/healthz")
            statuses = []
            for worker, answer in zip(self.workers, answers):
                if not worker.alive:
                    status = "exited"
                elif answer is None:
                    status = "starting" if worker.port is None else "not_answering"
                else:
                    status = _json_field(answer[1], "status", default="ok" if answer[0] == 200 else "unhealthy")
                statuses.append({"worker": worker.index, "status": status,
                                 "healthy": answer is not None and answer[0] == 200 and worker.alive})
            ok = all(s["healthy"] for s in statuses)
            return web.json_response({"status": "ok" if ok else "unhealthy", "workers": statuses},
                                     status=200 if ok else 503)

        async def readyz(_req: web.Request) -> web.Response:
            answers = await self._ask_all("/readyz")
            workers = []
            for worker, answer in zip(self.workers, answers):
                entry: dict = {"worker": worker.index, "ready": answer is not None and answer[0] == 200}
                if answer is not None:
                    entry["partitions"] = _json_field(answer[1], "partitions", default=None)
                if not entry["ready"]:
                    entry["reason"] = self._not_ready_reason(worker, answer)
                workers.append(entry)
            ready = all(w["ready"] for w in workers)
            return web.json_response({"ready": ready, "workers": workers}, status=200 if ready else 503)

        async def metrics(_req: web.Request) -> web.Response:
            answers = await self._ask_all("/metrics")
            texts = {w.index: a[1].decode() for w, a in zip(self.workers, answers) if a is not None and a[0] == 200}
            # Off the loop: parsing every worker's exposition would hold the probes meanwhile.
            body = await asyncio.to_thread(merge_expositions, texts, configured=len(self.workers),
                                           alive=sum(w.alive for w in self.workers),
                                           unscraped=len(self.workers) - len(texts))
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        return app


    def _not_ready_reason(self, worker: Worker, answer: tuple[int, bytes] | None) -> str:
        """Why ``worker`` is not ready, what to look at first."""
        if self._stop.is_set() or self.failed:
            return "stopping"
        if not worker.alive:
            return "exited"
        if answer is None:
            return "starting" if worker.port is None else "not_answering"
        return _json_field(answer[1], "reason", default="not_ready")


def _json_field(body: bytes, key: str, *, default):
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return default
    return doc.get(key, default) if isinstance(doc, dict) else default


async def supervise(config: RelayConfig, argv: list[str], count: int) -> int:
    """Run ``count`` workers of ``lineage-relay <argv>`` (see the module docstring); the
    exit code. Raises :class:`~relay.errors.ConfigError` when the endpoint cannot listen."""
    supervisor = Supervisor(config, argv, count)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, supervisor.request_stop)

    async def bind(app: web.Application) -> web.AppRunner | None:
        if config.http.port is None:
            return None
        runner, port = await listen(app, config.http.host, config.http.port)
        log_event(log, logging.INFO, "http_listening", host=config.http.host, port=port)
        return runner

    try:
        return await supervisor.run(bind)
    finally:
        # asyncio's loop puts the default handlers back when it closes; uvloop's leaves its
        # own bound to the closed loop, and SIGINT/SIGTERM would be ignored from then on.
        for sig in signals:
            loop.remove_signal_handler(sig)
