"""The operations endpoint's probes against a relay whose state the test sets (no broker)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from aiohttp.test_utils import TestClient, TestServer

from relay.server import STUCK_AFTER_S, build_app


def relay(*, polled_s_ago: float, rebalancing_s: float | None = None,
          exit_in_s: float | None = None) -> SimpleNamespace:
    """A relay last polling ``polled_s_ago``; ``exit_in_s``: stopping, to have returned by then."""
    now = time.monotonic()
    source = SimpleNamespace(paused=False, assignment=set(), handover_timeout_s=300.0,
                             rebalancing_since=None if rebalancing_s is None else now - rebalancing_s)
    return SimpleNamespace(started=True, stopping=exit_in_s is not None, heartbeat=now - polled_s_ago,
                           source=source, broker=SimpleNamespace(unreachable=False),
                           exit_by=float("inf") if exit_in_s is None else now + exit_in_s)


async def healthz(state: SimpleNamespace) -> tuple[int, dict]:
    async with TestClient(TestServer(build_app(state))) as client:  # type: ignore[arg-type]
        resp = await client.get("/healthz")
        return resp.status, await resp.json()


async def test_a_relay_inside_a_long_rebalance_handler_is_not_reported_stuck():
    """Restoring a large run state or the look-back runs inside the rebalance callback,
    for up to max.poll.interval.ms, and the loop does not poll meanwhile: /healthz said
    "stuck" after 60 s, and the liveness probe restarted a relay that would only do the
    same again. Past max.poll.interval.ms (the group drops the member anyway) it is stuck."""
    assert (await healthz(relay(polled_s_ago=1)))[0] == 200
    assert (await healthz(relay(polled_s_ago=STUCK_AFTER_S + 5)))[0] == 503
    status, body = await healthz(relay(polled_s_ago=200, rebalancing_s=190))
    assert status == 200 and body["status"] == "rebalancing"
    assert (await healthz(relay(polled_s_ago=400, rebalancing_s=300 + STUCK_AFTER_S + 5)))[0] == 503


async def test_a_relay_draining_on_its_way_out_is_not_reported_stuck():
    """The shutdown drains deliveries for up to drain_timeout_s, and the loop no longer
    polls: /healthz said "stuck" after 60 s, and the liveness probe killed a relay about to
    exit on its own (its deliveries abandoned). Past the time it must have returned by, it
    is stuck."""
    status, body = await healthz(relay(polled_s_ago=STUCK_AFTER_S + 30, exit_in_s=10))
    assert (status, body) == (200, {"status": "stopping"})
    assert (await healthz(relay(polled_s_ago=STUCK_AFTER_S + 30, exit_in_s=-1)))[0] == 503


async def test_a_relay_still_stopping_past_its_exit_time_is_stuck_whenever_it_last_polled():
    """Past the time it must have returned by, a stopping relay is stuck even with a recent
    poll (its shutdown hangs after the last one): 200 "ok" there kept it from being restarted
    for up to 60 s more."""
    status, body = await healthz(relay(polled_s_ago=1, exit_in_s=-1))
    assert (status, body) == (503, {"status": "stuck", "phase": "stopping"})
    status, body = await healthz(relay(polled_s_ago=40, exit_in_s=-15))
    assert (status, body) == (503, {"status": "stuck", "phase": "stopping"})


async def readyz(state: SimpleNamespace) -> tuple[int, dict]:
    async with TestClient(TestServer(build_app(state))) as client:  # type: ignore[arg-type]
        resp = await client.get("/readyz")
        return resp.status, await resp.json()


async def test_readyz_says_why_the_relay_is_not_ready():
    """An operator looking at a pod that stays unready sees the reason: the broker does not
    answer, still joining its group, a subscribed topic the cluster does not hold (named),
    one not checked yet, or stopping."""
    state = relay(polled_s_ago=0)
    state.source.joined, state.source.missing_topics = False, frozenset()
    state.ready = False
    assert await readyz(state) == (503, {"ready": False, "paused": False, "partitions": 0,
                                         "reason": "joining_group"})
    state.broker.unreachable = True
    assert (await readyz(state))[1]["reason"] == "broker_unreachable"
    state.started = False
    assert (await readyz(state))[1]["reason"] == "broker_unreachable"
    state.started, state.broker.unreachable = True, False
    state.source.joined = True
    assert (await readyz(state))[1]["reason"] == "checking_topics"
    state.source.joined = False
    state.source.missing_topics = frozenset({"opnelineage"})
    status, body = await readyz(state)
    assert (status, body["reason"], body["missing_topics"]) == (503, "missing_topics", ["opnelineage"])
    state.stopping = True
    assert (await readyz(state))[1]["reason"] == "stopping"
    state.ready, state.stopping, state.source.missing_topics = True, False, frozenset()
    assert await readyz(state) == (200, {"ready": True, "paused": False, "partitions": 0})
