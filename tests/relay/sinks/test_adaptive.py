"""Adaptive concurrency: the limit alone (a scripted clock), then HttpCollector against real
loopback collectors that queue or shed load beyond what they can take at once."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

import pytest

from relay.config import CollectorConfig, ConfigError, build_config
from relay.embedded.collector import RecordingCollector
from relay.metrics import RelayMetrics
from relay.sinks import http as http_module
from relay.sinks.adaptive import (
    LATENCY_DECREASE,
    OVERLOAD_DECREASE,
    WINDOW,
    AdaptiveLimit,
    Outcome,
)
from relay.sinks.http import HttpCollector
from tests.support.busy_collector import BusyCollector
from tests.support.clock import Clock

BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'


def limit_with(clock: Clock, **kw) -> tuple[AdaptiveLimit, list[int]]:
    changes: list[int] = []
    kw.setdefault("minimum", 1)
    kw.setdefault("maximum", 32)
    return AdaptiveLimit(clock=clock, on_change=changes.append, **kw), changes


class Flow:
    """A steady stream of requests, as the dispatcher's workers make: whenever there is room
    under the limit a request goes out. One round answers the requests in flight at its
    start, all after ``latency_s``; each answer makes room for the next request at once."""

    def __init__(self, limit: AdaptiveLimit, clock: Clock) -> None:
        self.limit, self.clock = limit, clock
        self.out: list = []

    async def top_up(self) -> None:
        while self.limit.in_flight < int(self.limit.limit):
            self.out.append(await self.limit.acquire())

    async def round(self, latency_s: float, outcome: Outcome = Outcome.OK) -> None:
        await self.top_up()
        answered, self.out = self.out, []
        self.clock.now += latency_s
        for sent in answered:
            self.limit.release(sent, outcome)
            await self.top_up()


async def test_the_limit_grows_by_about_one_per_round_trip_while_latency_holds_up_to_the_ceiling():
    clock = Clock()
    limit, changes = limit_with(clock, initial=4, maximum=12)
    flow = Flow(limit, clock)
    assert limit.limit == 4 and changes == [4]
    for _ in range(5):
        await flow.round(0.010)
    assert 8 <= limit.limit <= 9  # about +1 per round trip of `limit` answers
    for _ in range(40):
        await flow.round(0.010)
    assert limit.limit == 12  # never above the ceiling
    assert changes == list(range(4, 13))  # the metric saw every whole step
    assert limit.in_flight == len(flow.out) == 12


async def test_an_overload_answer_shrinks_the_limit_once_per_round_trip_down_to_min():
    clock = Clock()
    limit, _ = limit_with(clock, initial=16, minimum=2)
    flow = Flow(limit, clock)
    # Sixteen 429s for requests sent before the first decrease: one decrease.
    await flow.round(0.010, Outcome.OVERLOAD)
    assert limit.limit == 16 * OVERLOAD_DECREASE
    await flow.round(0.010, Outcome.OVERLOAD)  # each later round trip of 429s shrinks it again
    assert limit.limit == 16 * OVERLOAD_DECREASE ** 2
    for _ in range(20):
        await flow.round(0.010, Outcome.OVERLOAD)
    assert limit.limit == 2


async def test_answers_slower_than_the_tolerance_shrink_the_limit_and_neutral_ones_leave_it():
    clock = Clock()
    limit, _ = limit_with(clock, initial=10, latency_tolerance=2.0)
    flow = Flow(limit, clock)
    await flow.round(0.010)  # the baseline: 10 ms
    before = limit.limit
    await flow.round(0.019)  # within 2x: still grows
    assert limit.limit > before
    grown = limit.limit
    await flow.round(0.050)  # 5x the baseline: the collector queues
    assert limit.limit == pytest.approx(grown * LATENCY_DECREASE)
    shrunk = limit.limit
    await flow.round(0.010, Outcome.NEUTRAL)  # a 400 says nothing about load
    assert limit.limit == shrunk


async def test_jitter_of_a_few_milliseconds_over_a_tiny_baseline_is_not_a_slow_answer():
    clock = Clock()
    limit, _ = limit_with(clock, initial=10)
    flow = Flow(limit, clock)
    await flow.round(0.0003)  # a loopback collector: 0.3 ms
    grown = limit.limit
    await flow.round(0.003)  # 10x that, but 3 ms: the relay's own loop, not the collector
    assert limit.limit > grown
    await flow.round(0.030)  # 30 ms: queueing
    assert limit.limit < grown


async def test_the_baseline_forgets_old_windows_so_a_new_normal_latency_is_adopted():
    clock = Clock()
    limit, _ = limit_with(clock, initial=1, maximum=1)
    flow = Flow(limit, clock)
    await flow.round(0.001)
    for _ in range(WINDOW * 9):  # the collector's normal latency is now 20 ms
        await flow.round(0.020)
    assert limit.baseline_s == pytest.approx(0.001)  # still remembered
    for _ in range(WINDOW * 2):
        await flow.round(0.020)
    assert limit.baseline_s == pytest.approx(0.020)


async def test_a_quiet_collector_does_not_earn_a_limit_it_never_used():
    clock = Clock()
    limit, _ = limit_with(clock, initial=8)
    for _ in range(50):  # one request at a time, fast
        at = await limit.acquire()
        clock.now += 0.01
        limit.release(at, Outcome.OK)
    assert limit.limit == 8


async def test_waiters_go_in_arrival_order_when_room_frees_and_a_cancelled_one_gives_its_turn_away():
    clock = Clock()
    limit, _ = limit_with(clock, initial=2, minimum=2, maximum=2)
    first = [await limit.acquire() for _ in range(2)]
    order: list[str] = []

    async def wait(name: str) -> None:
        await limit.acquire()
        order.append(name)

    tasks = {name: asyncio.create_task(wait(name)) for name in "abc"}
    await asyncio.sleep(0)  # ok: lets the three tasks reach acquire (no time passes)
    assert order == [] and limit.in_flight == 2
    tasks["a"].cancel()
    limit.release(first[0], Outcome.NEUTRAL)
    await asyncio.wait_for(tasks["b"], 1)
    assert order == ["b"] and limit.in_flight == 2
    limit.release(first[1], Outcome.NEUTRAL)
    await asyncio.wait_for(tasks["c"], 1)
    assert order == ["b", "c"] and limit.in_flight == 2
    assert tasks["a"].cancelled()


def test_config_bounds_name_the_key_and_the_fix():
    base = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "group_id": "g"}}
    ok = build_config({**base, "collectors": [{"name": "m", "url": "http://127.0.0.1:1",
                                               "adaptive_concurrency": {"min": 2}}]})
    assert ok.collectors[0].adaptive_concurrency.min == 2
    with pytest.raises(ConfigError, match=r"adaptive_concurrency.min: 40 is above concurrency \(32\)"):
        build_config({**base, "collectors": [{"name": "m", "url": "http://127.0.0.1:1",
                                              "adaptive_concurrency": {"min": 40}}]})
    with pytest.raises(ConfigError, match=r"above batch.max_requests \(4\)"):
        build_config({**base, "collectors": [{"name": "m", "url": "http://127.0.0.1:1", "batch": {},
                                              "adaptive_concurrency": {"min": 5}}]})
    with pytest.raises(ConfigError, match="latency_tolerance"):
        build_config({**base, "collectors": [{"name": "m", "url": "http://127.0.0.1:1",
                                              "adaptive_concurrency": {"latency_tolerance": 1}}]})


# -- against real collectors on loopback ----------------------------------------------

async def deliver_all(url: str, events: int, adaptive: bool) -> tuple[HttpCollector, RelayMetrics]:
    """``events`` deliveries through one HttpCollector, 32 tasks at once (the dispatcher's workers)."""
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="c", url=url, concurrency=32, timeout_s=10,
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05},
                          adaptive_concurrency={} if adaptive else None)
    http = HttpCollector(cfg, metrics.for_collector("c"))
    await http.start()
    todo = iter(range(events))

    async def worker() -> None:
        for _ in todo:
            assert await http.deliver(BODY) is None

    try:
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(32))), 120)
    finally:
        await http.close()
    return http, metrics


async def test_a_queueing_collector_gets_about_what_it_can_serve_at_once_not_the_whole_ceiling():
    with BusyCollector(workers=4, service_s=0.010, shed=False) as fixed_server:
        await deliver_all(fixed_server.url, 400, adaptive=False)
    with BusyCollector(workers=4, service_s=0.010, shed=False) as server:
        http, metrics = await deliver_all(server.url, 400, adaptive=True)
    assert server.ok == fixed_server.ok == 400
    # With the fixed ceiling the collector holds all 32 requests (28 queued); adapted, it
    # holds about what it serves at once, and the relay's limit settled near it.
    later = server.seen_in_hand[200:]
    assert statistics.median(fixed_server.seen_in_hand[200:]) >= 28
    assert statistics.median(later) <= 10, sorted(later)
    assert http.gate is not None and http.gate.limit <= 12
    gauge = metrics.registry.get_sample_value("lineage_relay_collector_concurrency_limit", {"collector": "c"})
    assert gauge == int(http.gate.limit)
    fixed = HttpCollector(CollectorConfig(name="f", url=server.url, concurrency=32), metrics.for_collector("f"))
    assert fixed.gate is None
    assert metrics.registry.get_sample_value("lineage_relay_collector_concurrency_limit", {"collector": "f"}) == 32


async def test_a_collector_that_sheds_load_with_429_gets_far_fewer_requests_it_must_refuse(caplog, monkeypatch):
    # A period longer than any run here: a slow (loaded) run must not let more lines through.
    monkeypatch.setattr(http_module, "_LIMIT_LOG_EVERY_S", 60.0)
    with BusyCollector(workers=4, service_s=0.010, shed=True) as fixed_server:
        await deliver_all(fixed_server.url, 300, adaptive=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="relay.sinks.http"):
        with BusyCollector(workers=4, service_s=0.010, shed=True) as server:
            started = time.monotonic()
            http, _ = await deliver_all(server.url, 300, adaptive=True)
            elapsed = time.monotonic() - started
    # Logged with why, once per _LIMIT_LOG_EVERY_S however often it shrank: operators see
    # why a collector gets fewer requests, without a line per 429.
    reduced = [r for r in caplog.records if r.getMessage() == "collector_concurrency_reduced"]
    allowed = 1 + int(elapsed // http_module._LIMIT_LOG_EVERY_S)  # one line per started period
    assert allowed < http.gate.decreases, "the run was too long to show the rate limit"
    assert reduced, "a shrinking limit is logged"
    assert len(reduced) <= allowed, (len(reduced), elapsed, http.gate.decreases)
    assert reduced[0].fields["cause"] == "overload" and reduced[0].fields["collector"] == "c"
    assert server.ok == fixed_server.ok == 300  # everything delivered either way (429 is retried)
    assert fixed_server.shed_count >= 300  # the fixed ceiling: more refusals than events
    assert server.shed_count * 4 <= fixed_server.shed_count, (server.shed_count, fixed_server.shed_count)


async def test_a_request_waiting_for_room_still_honours_a_retry_after_that_came_meanwhile():
    with RecordingCollector() as server:
        server.fail_next(1, 429, retry_after="1")
        metrics = RelayMetrics()
        cfg = CollectorConfig(name="c", url=server.url, retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05},
                              adaptive_concurrency={"min": 1, "initial": 1})
        http = HttpCollector(cfg, metrics.for_collector("c"))
        await http.start()
        try:
            first = asyncio.create_task(http.deliver(BODY))
            second = asyncio.create_task(http.deliver(BODY + b" "))  # waits for room: the limit is 1
            assert await asyncio.wait_for(asyncio.gather(first, second), 30) == [None, None]
        finally:
            await http.close()
    refused = [a for a in server.attempts if a.status == 429]
    accepted = [a.at for a in server.attempts if a.status == 201]
    assert len(refused) == 1 and len(accepted) == 2
    assert min(accepted) - refused[0].at >= 1.0, "a request overran the collector's Retry-After"
