"""``workers`` above 1: one supervisor process runs that many relay processes in the pod,
each one member of the consumer group (its own partitions, decoding on its own thread).

The supervisor (``lineage-relay run`` itself) validates the configuration, listens on
``http.host``/``http.port``, then starts the workers as ``python -m relay run <the same
arguments>`` with :data:`WORKER_ENV` set. A worker runs exactly one relay, serves its own
endpoint on 127.0.0.1 (a free port, reported on a pipe), logs ``"worker": <index>`` on
every line, and holds the read end of a life-line pipe whose write end only the supervisor
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

Stopping: on SIGTERM or SIGINT the supervisor sends SIGTERM to every worker, waits up to
``drain_timeout_s`` + ``relay.app.CLOSE_MARGIN_S`` + :data:`EXIT_MARGIN_S` for them,
SIGKILLs those still running, and exits 0 when every worker exited 0, else 1.

Policy on a worker that exits on its own (a crash, kill -9, its own start-up error):
fail fast. The supervisor logs ``worker_exited``, stops the other workers as above and
exits non-zero: 2 when that worker exited 2 (a configuration problem), else 1. It does not
restart workers: the orchestrator restarts the pod, and a crash loop shows as one
(Kubernetes' CrashLoopBackOff) instead of hiding in a pod that looks alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from relay.config import RelayConfig
from relay.logs import log_event
from relay.worker_metrics import merge_expositions

log = logging.getLogger("relay.workers")

#: Set in a worker's environment: its index, then the report and life-line pipes' fds.
WORKER_ENV = "LINEAGE_RELAY_WORKER"
#: How long a probe or a scrape waits for one worker.
SCRAPE_TIMEOUT_S = 2.0
#: After a worker's own bound (drain_timeout_s + CLOSE_MARGIN_S): its threads and interpreter ending.
EXIT_MARGIN_S = 5.0


@dataclass(frozen=True)
class WorkerLink:
    """A worker's side: its index, the pipe it reports its port on, its life-line."""

    index: int
    report_fd: int
    lifeline_fd: int

    @classmethod
    def from_env(cls) -> WorkerLink | None:
        """This process's link when it runs as a worker, else None."""
        value = os.environ.get(WORKER_ENV)
        if not value:
            return None
        index, report_fd, lifeline_fd = (int(part) for part in value.split(","))
        return cls(index, report_fd, lifeline_fd)

    def report_port(self, port: int) -> None:
        os.write(self.report_fd, f"{port}\n".encode())
        os.close(self.report_fd)

    def watch_lifeline(self, loop: asyncio.AbstractEventLoop, on_parent_gone) -> None:
        """Call ``on_parent_gone()`` once the supervisor is gone (the life-line reads EOF)."""
        def readable() -> None:
            try:
                data = os.read(self.lifeline_fd, 64)
            except BlockingIOError:
                return
            if not data:
                loop.remove_reader(self.lifeline_fd)
                log_event(log, logging.WARNING, "supervisor_gone", action="stopping")
                on_parent_gone()

        os.set_blocking(self.lifeline_fd, False)
        loop.add_reader(self.lifeline_fd, readable)


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
        env = {**os.environ, WORKER_ENV: f"{self.index},{report_w},{lifeline_r}"}
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "relay", *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(report_w, lifeline_r))
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
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None


class Supervisor:
    def __init__(self, config: RelayConfig, argv: list[str], count: int) -> None:
        self.config = config
        self.argv = argv
        self.workers = [Worker(i) for i in range(count)]
        self._stop = asyncio.Event()
        #: The first worker that exited on its own, and its exit code.
        self.failed: tuple[Worker, int] | None = None
        self._session: aiohttp.ClientSession | None = None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, bind) -> int:
        """Listen (``bind(app)``, which may raise), start the workers, supervise them until a
        stop or a worker's exit, stop them all; the exit code (see the module docstring)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        runner = None
        try:
            runner = await bind(self.build_app())
            for worker in self.workers:
                await worker.start(self.argv)
            log_event(log, logging.INFO, "workers_started", workers=len(self.workers),
                      pids=[w.proc.pid for w in self.workers if w.proc is not None])
            waits = {asyncio.ensure_future(w.proc.wait()): w for w in self.workers if w.proc is not None}
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait([stop, *waits], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            for task in done:
                worker = waits.get(task)
                if worker is not None and self.failed is None:
                    code = task.result()
                    self.failed = (worker, code)
                    log_event(log, logging.ERROR, "worker_exited", worker=worker.index, pid=worker.proc.pid,
                              **({"signal": signal.Signals(-code).name} if code < 0 else {"exit_code": code}),
                              action="stopping the other workers")
            codes = await self._stop_workers()
        finally:
            await self._session.close()
            if runner is not None:
                await runner.cleanup()
        log_event(log, logging.INFO, "workers_stopped", exit_codes=codes)
        if self.failed is not None:
            return 2 if self.failed[1] == 2 else 1
        return 0 if all(code == 0 for code in codes) else 1

    async def _stop_workers(self) -> list[int]:
        from relay.app import CLOSE_MARGIN_S

        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.drain_timeout_s + CLOSE_MARGIN_S + EXIT_MARGIN_S
        procs = [w.proc for w in self.workers if w.proc is not None]
        _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs],
                                        timeout=max(0.0, deadline - time.monotonic()))
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
                    entry["reason"] = ("stopping" if self._stop.is_set() or self.failed else
                                       "exited" if not worker.alive else
                                       "starting" if answer is None and worker.port is None else
                                       "not_answering" if answer is None else
                                       _json_field(answer[1], "reason", default="not_ready"))
                workers.append(entry)
            ready = all(w["ready"] for w in workers)
            return web.json_response({"ready": ready, "workers": workers}, status=200 if ready else 503)

        async def metrics(_req: web.Request) -> web.Response:
            answers = await self._ask_all("/metrics")
            texts = {w.index: a[1].decode() for w, a in zip(self.workers, answers) if a is not None and a[0] == 200}
            body = merge_expositions(texts, configured=len(self.workers),
                                     alive=sum(w.alive for w in self.workers),
                                     unscraped=len(self.workers) - len(texts))
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        return app


def _json_field(body: bytes, key: str, *, default):
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return default
    return doc.get(key, default) if isinstance(doc, dict) else default


async def supervise(config: RelayConfig, argv: list[str], count: int) -> int:
    """Run ``count`` workers of ``lineage-relay <argv>`` (see the module docstring); the
    exit code. Raises :class:`~relay.errors.ConfigError` when the endpoint cannot listen."""
    from relay.cli import listen

    supervisor = Supervisor(config, argv, count)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.request_stop)

    async def bind(app: web.Application):
        if config.http.port is None:
            return None
        runner, port = await listen(app, config.http.host, config.http.port)
        log_event(log, logging.INFO, "http_listening", host=config.http.host, port=port)
        return runner

    return await supervisor.run(bind)
