"""The operations endpoint: ``/healthz`` (the event loop is turning, or the relay is
stopping within its time; 503 once a stopping relay is past it), ``/readyz``
(consuming its share: see :attr:`relay.app.Relay.ready`) and ``/metrics`` (Prometheus text
format). The probes read what the relay knows already: they send nothing to the broker."""

from __future__ import annotations

import errno
import socket
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relay.errors import ConfigError

if TYPE_CHECKING:  # the supervisor (relay.workers) serves too, without a relay of its own
    from relay.app import Relay

#: The main loop polls every 100 ms; this long without a turn means it is stuck.
STUCK_AFTER_S = 60.0


def build_app(relay: Relay) -> web.Application:
    async def healthz(_req: web.Request) -> web.Response:
        now = time.monotonic()
        if relay.stopping:
            # The shutdown's drain does not poll, for up to drain_timeout_s: a relay on its way
            # out is not restarted (its deliveries abandoned) before it must have returned; past
            # that, its shutdown hangs, however recently it polled.
            if now <= relay.exit_by:
                return web.json_response({"status": "stopping"})
            return web.json_response({"status": "stuck", "phase": "stopping"}, status=503)
        stalled = now - relay.heartbeat
        if relay.started and stalled > STUCK_AFTER_S:
            # A rebalance handler (restoring run state, the look-back, a revocation's wait)
            # may keep the loop from polling for up to max.poll.interval.ms: not stuck then,
            # or the liveness probe restarts a relay that would only do the same again.
            since = relay.source.rebalancing_since
            if since is not None and now - since <= relay.source.handover_timeout_s + STUCK_AFTER_S:
                return web.json_response({"status": "rebalancing", "seconds": round(now - since, 1)})
            return web.json_response({"status": "stuck", "seconds_since_poll": round(stalled, 1)}, status=503)
        return web.json_response({"status": "ok"})

    async def readyz(_req: web.Request) -> web.Response:
        # Not before the group gave this replica its share: a rolling update (maxUnavailable
        # 0) would otherwise stop an old pod before the new one consumes anything.
        ready = relay.ready
        body = {"ready": ready, "paused": relay.source.paused, "partitions": len(relay.source.assignment)}
        if not ready:
            body["reason"] = _not_ready_reason(relay)
            if relay.source.missing_topics:
                body["missing_topics"] = sorted(relay.source.missing_topics)
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_req: web.Request) -> web.Response:
        for lane in relay.lanes:
            relay.metrics.pending.labels(collector=lane.name).set(lane.pending)
            relay.metrics.held.labels(collector=lane.name).set(lane.held)
        return web.Response(body=generate_latest(relay.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def _not_ready_reason(relay: Relay) -> str:
    """Why /readyz answers 503, what to look at first: the broker has not answered at all
    (a wrong address: no topic is blamed, none is known missing), a subscribed topic the
    cluster said it does not hold, the group not joined yet, a topic not checked yet."""
    if relay.stopping:
        return "stopping"
    if relay.broker.unreachable:
        return "broker_unreachable"
    if not relay.started:
        return "starting"
    if relay.source.missing_topics:
        return "missing_topics"
    return "joining_group" if not relay.source.joined else "checking_topics"


async def start_server(relay: Relay, host: str, port: int) -> tuple[web.AppRunner, int]:
    return await serve_app(build_app(relay), host, port)


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Listen on ``host``:``port`` (0: a free one); the runner and the port bound."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    return runner, bound


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host``:``port``; the runner and the port bound. Raises
    :class:`ConfigError` naming ``http.host`` or ``http.port`` when it cannot listen."""
    try:
        return await serve_app(app, host, port)
    except OSError as err:
        raise ConfigError(_listen_problem(err)) from None


def _listen_problem(err: OSError) -> str:
    """What to fix when the HTTP server cannot listen: ``http.host`` or ``http.port``."""
    why = err.strerror or type(err).__name__
    if isinstance(err, socket.gaierror) or err.errno == errno.EADDRNOTAVAIL:
        return (f"http.host: cannot listen there ({why}); give an address of this machine, such as 0.0.0.0 "
                "(all) or 127.0.0.1")
    if err.errno == errno.EADDRINUSE:
        return (f"http.port: cannot listen there ({why}: another process, or another relay, has it); stop it, "
                "give another port, or 0 for any free one")
    if err.errno == errno.EACCES:
        return f"http.port: cannot listen there ({why}; ports below 1024 need privileges); give a port from 1024"
    return f"http.host/http.port: cannot listen there ({why}); fix http.host or http.port"
