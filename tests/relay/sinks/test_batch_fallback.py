"""A batch endpoint answered 404 (a proxy, an old instance during a rolling deploy) is given
up only after ``batch.unsupported_after`` batches in a row, and tried again every
``batch.reprobe_after_s``: BatchFallback on plain data, then BatchCollector against a real
collector on loopback whose batch URL answers 404 a scripted number of times, its clock
moved by the test (no sleeping)."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import orjson
import pytest

from relay.config import CollectorConfig
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from relay.sinks.batch_fallback import BatchFallback
from tests.support.clock import Clock
from tests.support.kind_servers import GENERIC, KindServer

# -- BatchFallback, pure ---------------------------------------------------------------


def test_two_unsupported_answers_then_an_accepted_one_keep_batching():
    fb = BatchFallback(3, 600)
    for result in ("unsupported", "unsupported", "ok", "unsupported", "unsupported", "partial", "unsupported"):
        assert fb.answered(fb.ticket(0), result, 0) is None
    assert not fb.single and not fb.sends_alone(0)


def test_three_in_a_row_give_up_and_answers_that_say_nothing_of_the_endpoint_do_not_clear_them():
    fb = BatchFallback(3, 600)
    assert [fb.answered(fb.ticket(0), r, 0) for r in ("unsupported", "retry", "refused", "unsupported")] == [None] * 4
    assert fb.answered(fb.ticket(5), "unsupported", 5) == "gave_up"
    assert fb.single and fb.sends_alone(5) and fb.ticket(5) is None
    assert fb.sends_alone(604.9) and not fb.sends_alone(605)


def test_a_probe_is_one_batch_at_a_time_and_its_answer_decides():
    fb = BatchFallback(1, 10)
    assert fb.answered(fb.ticket(0), "unsupported", 0) == "gave_up"
    probe = fb.ticket(10)
    assert probe is not None and fb.ticket(10) is None and fb.sends_alone(10)  # one probe in flight
    assert fb.answered(probe, "retry", 11) is None  # a 503 says nothing: the next batch probes
    probe = fb.ticket(11)
    assert fb.answered(probe, "unsupported", 12) == "still_unsupported"
    assert fb.sends_alone(21.9) and fb.ticket(21.9) is None
    probe = fb.ticket(22)
    assert fb.answered(probe, "ok", 22) == "resumed" and not fb.single and fb.gave_up == 1


def test_answers_to_batches_sent_before_a_switch_do_not_switch_back():
    fb = BatchFallback(2, 10)
    old = [fb.ticket(0) for _ in range(4)]  # max_requests batches in flight
    assert fb.answered(old[0], "unsupported", 0) is None
    assert fb.answered(old[1], "unsupported", 0) == "gave_up"
    assert fb.answered(old[2], "ok", 1) is None and fb.single  # sent before the give-up
    probe = fb.ticket(10)
    assert fb.answered(probe, "ok", 10) == "resumed"
    assert fb.answered(old[3], "unsupported", 11) is None  # a 404 to a batch sent long before
    new = [fb.ticket(11) for _ in range(2)]
    assert fb.answered(new[0], "unsupported", 11) is None and not fb.single


def test_in_a_row_is_in_the_order_batches_were_sent():
    fb = BatchFallback(2, 10)
    a, b, c = fb.ticket(0), fb.ticket(0), fb.ticket(0)
    assert fb.answered(c, "ok", 0) is None
    assert fb.answered(a, "unsupported", 0) is None and fb.answered(b, "unsupported", 0) is None
    assert not fb.single  # both were sent before a batch that was accepted
    d, e = fb.ticket(0), fb.ticket(0)
    assert fb.answered(d, "unsupported", 0) is None and fb.answered(e, "unsupported", 0) == "gave_up"


def test_reprobe_after_none_never_probes():
    fb = BatchFallback(1, None)
    assert fb.answered(fb.ticket(0), "unsupported", 0) == "gave_up"
    assert fb.sends_alone(1e12) and fb.ticket(1e12) is None


# -- BatchCollector against a loopback collector -----------------------------------------

ROUND = 3  # events per round: one full batch


def run_event(run: str, n: int) -> bytes:
    return orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "https://p", "schemaURL": "https://s",
                         "eventType": "RUNNING", "run": {"runId": run}, "job": {"namespace": "n", "name": "j"},
                         "n": n})


class Relay:
    """A BatchCollector whose rounds are one batch each: ``ROUND`` events, one per run, their
    run's ``n``-th (the dispatcher's contract: a run's next event after the previous one)."""

    def __init__(self, server: KindServer, clock: Clock, **batch) -> None:
        self.metrics = RelayMetrics()
        cfg = CollectorConfig(name="c", url=server.url, retry={"initial_backoff_s": 0.005, "max_backoff_s": 0.02},
                              batch={"max_events": ROUND, "max_requests": 1, "linger_ms": 5, **batch})
        self.collector = BatchCollector(cfg, self.metrics.for_collector("c"), clock=clock)
        self.rounds = 0

    async def round(self) -> None:
        n, self.rounds = self.rounds, self.rounds + 1
        verdicts = await asyncio.wait_for(asyncio.gather(
            *(self.collector.deliver(run_event(f"r{i}", n)) for i in range(ROUND))), 30)
        assert verdicts == [None] * ROUND

    def fallback_gauge(self) -> float | None:
        return self.metrics.registry.get_sample_value("lineage_relay_batch_fallback", {"collector": "c"})


def batch_statuses(server: KindServer) -> list[int]:
    return [r.status for r in server.seen() if r.path == GENERIC.batch_path]


def delivered_once_in_run_order(server: KindServer, rounds: int) -> bool:
    by_run: dict[str, list[int]] = defaultdict(list)
    for doc in server.received():
        by_run[doc["run"]["runId"]].append(doc["n"])
    return by_run == {f"r{i}": list(range(rounds)) for i in range(ROUND)}


def logged(caplog, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == level and r.name == "relay.sinks.batch"]


@pytest.fixture
def relay_log(caplog):
    with caplog.at_level(logging.INFO, logger="relay.sinks.batch"):
        yield caplog


@pytest.mark.parametrize("script", [[404, 404], [404, 404, None, 405, 501]], ids=["two", "accepted-between"])
async def test_fewer_404s_in_a_row_than_unsupported_after_keep_batching(script, relay_log):
    with KindServer(GENERIC, batch_answers=list(script)) as server:
        relay = Relay(server, Clock())
        await relay.collector.start()
        try:
            for _ in range(len(script) + 2):
                await relay.round()
        finally:
            await relay.collector.close()
    assert batch_statuses(server) == [s or 200 for s in script] + [200, 200]  # later batches: the batch URL
    assert delivered_once_in_run_order(server, len(script) + 2)
    assert relay.fallback_gauge() == 0 and logged(relay_log, "ERROR") == []


async def test_three_404s_in_a_row_send_single_events_until_the_reprobe_interval(relay_log):
    clock = Clock()
    with KindServer(GENERIC, batch_answers=[404, 404, 404]) as server:
        relay = Relay(server, clock, reprobe_after_s=600)
        await relay.collector.start()
        try:
            for _ in range(3):
                await relay.round()
            assert relay.fallback_gauge() == 1
            await relay.round()
            clock.now += 599.9
            await relay.round()
            assert batch_statuses(server) == [404, 404, 404]  # rounds 4 and 5 went alone
            clock.now += 0.1
            await relay.round()  # the probe, accepted
            await relay.round()
        finally:
            await relay.collector.close()
    assert batch_statuses(server) == [404, 404, 404, 200, 200]
    assert delivered_once_in_run_order(server, 7)
    assert relay.fallback_gauge() == 0
    assert logged(relay_log, "ERROR") == ["batch_unsupported"]
    assert logged(relay_log, "INFO") == ["batch_resumed"]


async def test_a_probe_answered_404_keeps_single_events_for_another_interval(relay_log):
    clock = Clock()
    with KindServer(GENERIC, batch_answers=[404, 404, 404, 404]) as server:
        relay = Relay(server, clock, reprobe_after_s=600)
        await relay.collector.start()
        try:
            for _ in range(3):
                await relay.round()
            clock.now += 600
            await relay.round()  # the probe, answered 404: its events go alone
            clock.now += 599
            await relay.round()
            assert batch_statuses(server) == [404] * 4 and relay.fallback_gauge() == 1
            clock.now += 1
            await relay.round()  # the next probe, accepted
        finally:
            await relay.collector.close()
    assert batch_statuses(server) == [404] * 4 + [200]
    assert delivered_once_in_run_order(server, 6)
    assert logged(relay_log, "ERROR") == ["batch_unsupported"]  # once, not per probe
    assert logged(relay_log, "WARNING") == ["batch_still_unsupported"]


async def test_404s_to_batches_in_flight_at_once_give_up_once_and_lose_nothing(relay_log):
    with KindServer(GENERIC, batch_answer=404) as server:
        metrics = RelayMetrics()
        cfg = CollectorConfig(name="c", url=server.url, batch={"max_events": 3, "max_requests": 4, "linger_ms": 1})
        collector = BatchCollector(cfg, metrics.for_collector("c"), clock=Clock())
        await collector.start()
        try:
            verdicts = await asyncio.wait_for(asyncio.gather(*(collector.deliver(run_event(f"r{i}", 0))
                                                              for i in range(60))), 30)
        finally:
            await collector.close()
    assert verdicts == [None] * 60
    assert sorted(d["run"]["runId"] for d in server.received()) == sorted(f"r{i}" for i in range(60))
    assert 3 <= len(batch_statuses(server)) <= 3 + 4  # at most max_requests more were already on their way
    assert collector.fallback.gave_up == 1 and logged(relay_log, "ERROR") == ["batch_unsupported"]


async def test_the_fallback_log_lines_name_the_batch_url_without_its_query(relay_log):
    """Config refuses a query in endpoint and batch.endpoint; were one there still (an Azure
    Function's code=KEY), batch_unsupported, batch_still_unsupported and batch_resumed would
    print the key: they name the URL without query or fragment."""
    clock = Clock()
    with KindServer(GENERIC, batch_answers=[404] * 4) as server:
        relay = Relay(server, clock, reprobe_after_s=600)
        cfg = relay.collector.config
        # Past validation, as a config built another way could be.
        keyed = cfg.model_copy(update={"batch": cfg.batch.model_copy(
            update={"endpoint": f"{GENERIC.batch_path}?code=hunter2#hunter2"})})
        relay.collector = BatchCollector(keyed, relay.metrics.for_collector("c"), clock=clock)
        await relay.collector.start()
        try:
            for _ in range(3):
                await relay.round()
            clock.now += 600
            await relay.round()  # the probe, answered 404
            clock.now += 600
            await relay.round()  # the next probe, accepted
        finally:
            await relay.collector.close()
    lines = [r for r in relay_log.records if r.name == "relay.sinks.batch"]
    assert {r.getMessage() for r in lines} >= {"batch_unsupported", "batch_still_unsupported", "batch_resumed"}
    urls = {r.fields["url"] for r in lines if "url" in r.fields}
    assert urls == {f"{server.url}{GENERIC.batch_path}"}
    assert not any("hunter2" in str(r.fields) for r in lines)
