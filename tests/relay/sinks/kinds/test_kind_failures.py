"""How each kind's collector fails, against loopback stand-ins that answer as the real
services do (tests/support/kind_servers.py): an event a collector answers 500 every time
(Marquez, DataHub, OpenMetadata throw on it) against an outage; OpenMetadata's batch
replies (``partial_success`` listing nothing, 400 listing every event); Atlan's 401 for a
connector that is not enabled; a batch URL with no endpoint behind it; Marquez 0.35-0.42
answering 200 to events it does not store."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from relay.config import build_config
from relay.metrics import RelayMetrics
from relay.sinks.kinds import build_collector
from tests.support.kind_servers import GENERIC, MARQUEZ, MARQUEZ_0_42, OPENMETADATA, KindServer, atlan

FAST = {"initial_backoff_s": 0.005, "max_backoff_s": 0.02}


def collector(**entry):
    config = build_config({"kafka": {"bootstrap_servers": "k:9092"}, "collectors": [{"name": "c", **entry}]})
    return config.collectors[0]


def built(**entry):
    metrics = RelayMetrics()
    entry.setdefault("retry", FAST)
    return build_collector(collector(**entry), metrics.for_collector("c")), metrics


def run_event(run: str, event_type: str = "COMPLETE", **extra) -> bytes:
    return orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "https://p", "schemaURL": "https://s",
                         "eventType": event_type, "run": {"runId": run}, "job": {"namespace": "n", "name": "j"},
                         **extra})


def sample(metrics: RelayMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"collector": "c", **labels}) or 0.0


async def deliver_while_others_flow(c, body: bytes, timeout_s: float = 30.0) -> tuple[object, int]:
    """Deliver ``body`` while other events go to the same collector one after another,
    until its verdict: (the verdict, how many others were delivered)."""
    task = asyncio.create_task(c.deliver(body))
    others = 0
    async with asyncio.timeout(timeout_s):
        while not task.done():
            assert await c.deliver(run_event(f"other-{others}")) is None
            others += 1
    return task.result(), others


async def test_an_event_answered_500_every_time_while_others_get_201_is_dead_lettered():
    """Marquez answers an exception while storing an event with a bare 500 (Marquez#2158:
    an Airflow event, every time). Retried for ever, it held its run, and the partition's
    offset commits, for good; now the fifth 500 with other events taken in between gives it
    up as collector_failed_event."""
    with KindServer(MARQUEZ, fails_on=lambda doc: doc["run"]["runId"] == "poison") as server:
        c, metrics = built(type="marquez", url=server.url)
        await c.start()
        try:
            failure, others = await deliver_while_others_flow(c, run_event("poison"))
        finally:
            await c.close()
    assert failure is not None and failure.reason == "collector_failed_event" and failure.status == 500
    assert "HTTP 500 to this event 5 times while the collector accepted other events" in failure.detail
    assert "poison_after_attempts=5" in failure.detail
    answered_500 = [r for r in server.seen() if r.status == 500]
    assert len(answered_500) >= 5  # a retry that came before any other event was taken is not counted
    assert sorted(e["run"]["runId"] for e in server.received()) == sorted(f"other-{i}" for i in range(others))
    assert sample(metrics, "lineage_relay_delivery_retries_total") == len(answered_500) - 1


async def test_an_outage_answering_500_to_everything_is_retried_never_dead_lettered():
    with KindServer(MARQUEZ) as server:
        server.outage = 500
        c, _ = built(type="marquez", url=server.url)
        await c.start()
        try:
            tasks = [asyncio.create_task(c.deliver(run_event(f"r{i}"))) for i in range(4)]
            # Far more 500s each than poison_after_attempts (5), and none given up.
            async with asyncio.timeout(30):
                while len(server.seen()) < 4 * 15:
                    await asyncio.sleep(0.005)  # ok: the poll interval of a wait with a deadline
            assert not any(t.done() for t in tasks)
            server.outage = None
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            await c.close()
    assert results == [None] * 4
    assert sorted(e["run"]["runId"] for e in server.received()) == ["r0", "r1", "r2", "r3"]


async def test_poison_after_attempts_null_keeps_retrying_such_an_event():
    with KindServer(MARQUEZ, fails_on=lambda doc: doc["run"]["runId"] == "poison") as server:
        c, _ = built(type="marquez", url=server.url, retry={**FAST, "poison_after_attempts": None})
        await c.start()
        try:
            task = asyncio.create_task(c.deliver(run_event("poison")))
            others = 0
            while sum(r.status == 500 for r in server.seen()) < 12:
                assert await c.deliver(run_event(f"other-{others}")) is None
                others += 1
            assert not task.done()
            task.cancel()
        finally:
            await c.close()


def test_poison_after_attempts_is_validated_naming_the_key():
    from relay.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        collector(type="marquez", url="http://m", retry={"poison_after_attempts": 1})
    assert "collectors.c.retry.poison_after_attempts" in str(err.value)
    assert "must be at least 2" in str(err.value)
    assert collector(type="marquez", url="http://m").retry.poison_after_attempts == 5


async def test_an_event_whose_batches_are_answered_500_goes_alone_and_only_it_is_dead_lettered():
    """A batch server whose exception escapes its per-event loop answers the whole batch a
    bare 500: the batch cannot say which event it fails on. After five such batches (others
    taken in between) the event goes alone, where its own 500s give it up; its neighbours
    are delivered."""
    with KindServer(GENERIC, fails_on=lambda doc: doc["run"]["runId"] == "poison", whole_batch_500=True) as server:
        c, metrics = built(url=server.url, batch={"max_events": 4, "linger_ms": 1})
        await c.start()
        try:
            failure, others = await deliver_while_others_flow(c, run_event("poison"))
        finally:
            await c.close()
    assert failure is not None and failure.reason == "collector_failed_event"
    assert sorted(e["run"]["runId"] for e in server.received()) == sorted(f"other-{i}" for i in range(others))
    alone = [r for r in server.seen() if r.path == GENERIC.path]
    assert len(alone) >= 5 and {r.status for r in alone} == {500}  # only the poison event went alone
    assert sample(metrics, "lineage_relay_batch_requests_total", result="retry") >= 5


async def test_openmetadata_partial_success_listing_no_failed_event_delivers_every_event_once():
    """OpenMetadata reports events whose lineage was written with datasets it could not
    resolve in summary.partial and unresolvedDatasets, not in failedEvents. They were sent
    again, one by one, to the single-event endpoint (duplicates, double traffic)."""
    with KindServer(OPENMETADATA, token="jwt", partial=lambda doc: doc["run"]["runId"] in ("r1", "r3")) as server:
        c, metrics = built(type="openmetadata", url=server.url, token="jwt", batch={"max_events": 5, "linger_ms": 5})
        await c.start()
        try:
            results = await asyncio.gather(*(c.deliver(run_event(f"r{i}")) for i in range(5)))
        finally:
            await c.close()
    assert results == [None] * 5
    assert sorted(e["run"]["runId"] for e in server.received()) == [f"r{i}" for i in range(5)]
    assert {r.path for r in server.seen()} == {OPENMETADATA.batch_path} and len(server.seen()) == 1
    assert sample(metrics, "lineage_relay_batch_requests_total", result="ok") == 1


async def test_openmetadata_400_listing_every_failed_event_dead_letters_each_with_its_reason():
    """The newest OpenMetadata answers 400, with failedEvents, when every event of a batch
    failed. Read as a batch refused whole, each event went again alone to the single-event
    endpoint: double traffic for events it had already judged."""
    with KindServer(OPENMETADATA, token="jwt") as server:
        c, metrics = built(type="openmetadata", url=server.url, token="jwt", batch={"max_events": 3, "linger_ms": 5})
        await c.start()
        try:
            no_producer = [orjson.dumps({k: v for k, v in orjson.loads(run_event(f"r{i}")).items() if k != "producer"})
                           for i in range(3)]
            results = await asyncio.wait_for(asyncio.gather(*(c.deliver(b) for b in no_producer)), 30)
        finally:
            await c.close()
    assert [(r.reason, r.status) for r in results] == [("collector_rejected", 400)] * 3
    assert all("eventTime and producer are required" in r.detail for r in results)
    assert [(r.path, r.status) for r in server.seen()] == [(OPENMETADATA.batch_path, 400)]
    assert sample(metrics, "lineage_relay_batch_requests_total", result="partial") == 1


async def test_an_atlan_connector_that_is_not_enabled_is_dead_lettered_and_logged_once_even_with_a_token_file(
        tmp_path, caplog):
    """Atlan answers 401 'url path not configured to receive data' for a connector it is
    not set up for. With a token file a 401 is retried (a rotated key): delivery paused for
    good, looking like a credentials problem."""
    key = tmp_path / "atlan-key"
    key.write_text("atlan-key\n")
    with KindServer(atlan("spark"), token="atlan-key") as server:
        c, _ = built(type="atlan", url=server.url, connector="airflow", token_file=str(key), mode="passthrough")
        await c.start()
        try:
            with caplog.at_level(logging.INFO, logger="relay.sinks.http"):
                results = await asyncio.wait_for(asyncio.gather(*(c.deliver(run_event(f"r{i}")) for i in range(3))), 30)
        finally:
            await c.close()
    assert [(r.reason, r.status) for r in results] == [("connector_not_enabled", 401)] * 3
    assert "connector not enabled in Atlan" in results[0].detail and "'airflow'" in results[0].detail
    assert "url path not configured to receive data" in results[0].detail
    assert [(r.path, r.status) for r in server.seen()] == [("/events/openlineage/airflow/api/v1/lineage", 401)] * 3
    logged = [r for r in caplog.records if r.getMessage() == "connector_not_enabled"]
    assert len(logged) == 1 and logged[0].levelname == "ERROR"
    assert not [r for r in caplog.records if r.getMessage() == "delivery_retry"]


async def test_atlan_credentials_that_are_wrong_are_still_retried_with_a_token_file(tmp_path):
    key = tmp_path / "atlan-key"
    key.write_text("old-key\n")
    with KindServer(atlan("spark"), token="new-key") as server:
        c, _ = built(type="atlan", url=server.url, connector="spark", token_file=str(key), mode="passthrough")
        await c.start()
        try:
            task = asyncio.create_task(c.deliver(run_event("r0")))
            async with asyncio.timeout(30):
                while len(server.seen()) < 3:
                    await asyncio.sleep(0.005)  # ok: the poll interval of a wait with a deadline
            assert not task.done()
            key.write_text("new-key\n")
            assert await asyncio.wait_for(task, 30) is None
        finally:
            await c.close()


@pytest.mark.parametrize("status", [404, 405, 501])
async def test_a_batch_url_without_an_endpoint_sends_single_events_after_unsupported_after_batches(status, caplog):
    with KindServer(GENERIC, batch_answer=status) as server:
        c, metrics = built(url=server.url, batch={"max_events": 3, "max_requests": 1, "linger_ms": 5})
        await c.start()
        try:
            with caplog.at_level(logging.INFO, logger="relay.sinks.batch"):
                first = await asyncio.wait_for(asyncio.gather(*(c.deliver(run_event(f"a{i}")) for i in range(7))), 30)
                later = await asyncio.wait_for(asyncio.gather(*(c.deliver(run_event(f"b{i}")) for i in range(4))), 30)
        finally:
            await c.close()
    assert first == [None] * 7 and later == [None] * 4
    assert sorted(e["run"]["runId"] for e in server.received()) == sorted([f"a{i}" for i in range(7)] +
                                                                          [f"b{i}" for i in range(4)])
    batches = [r for r in server.seen() if r.path == GENERIC.batch_path]
    # 3 + 3 + 1 events: batch.unsupported_after (3) batches in a row, then no batch until the re-probe.
    assert [(r.status, r.events) for r in batches] == [(status, 0)] * 3
    assert sample(metrics, "lineage_relay_batch_requests_total", result="unsupported") == 3
    assert sample(metrics, "lineage_relay_batch_fallback") == 1
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["batch_unsupported"]


async def test_marquez_0_42_answering_200_to_a_dataset_event_it_does_not_store_is_dead_lettered():
    dataset_event = orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "https://p",
                                  "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent",
                                  "dataset": {"namespace": "s3://w", "name": "orders"}})
    with KindServer(MARQUEZ_0_42) as server:
        c, _ = built(type="marquez", url=server.url)
        await c.start()
        try:
            skipped = await c.deliver(dataset_event)
            stored = await c.deliver(run_event("r0"))
        finally:
            await c.close()
    assert stored is None
    assert skipped is not None and skipped.reason == "collector_skipped" and skipped.status == 200
    assert "0.43.0" in skipped.detail and "event_kinds: [run]" in skipped.detail
    assert [e["run"]["runId"] for e in server.received()] == ["r0"]
