"""BatchCollector's events sent alone to the single-event endpoint, against real aiohttp
collectors on loopback: how many attempts they get in all (``retry.max_attempts``), that
the neighbours of an event a collector fails on are not dead-lettered, and how many of
them are in flight at once (``batch.max_requests``)."""

from __future__ import annotations

import asyncio
import gzip
from collections import Counter

import orjson
import pytest
from aiohttp import web

from relay.config import CollectorConfig
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from tests.support.loopback_http import serve

SINGLE, BATCH = "/api/v1/lineage", "/api/v1/lineage/batch"


async def test_innocent_batch_neighbours_of_a_failing_event_are_not_dead_lettered():
    """max_attempts: 3. The collector answers a bare 500 to any batch holding the one event
    it fails on, and accepts every other batch (and every other event alone). Events that
    only shared that event's batches are delivered, as they would be with batch: null; the
    failing one is dead-lettered."""
    async def batch(request: web.Request) -> web.Response:
        docs = orjson.loads(await request.read())
        return web.Response(status=500, text="NPE") if any(d.get("poison") for d in docs) else web.Response(status=204)

    async def single(request: web.Request) -> web.Response:
        doc = orjson.loads(await request.read())
        return web.Response(status=500 if doc.get("poison") else 201)

    runner, port = await serve([("POST", SINGLE, single), ("POST", BATCH, batch)])
    cfg = CollectorConfig(name="b", url=f"http://127.0.0.1:{port}", batch={"max_events": 50, "linger_ms": 20},
                          retry={"initial_backoff_s": 0.05, "max_backoff_s": 0.2, "max_attempts": 3})
    collector = BatchCollector(cfg, RelayMetrics().for_collector("b"))
    await collector.start()
    try:
        tasks = [asyncio.create_task(collector.deliver(orjson.dumps({"poison": True})))]
        for i in range(200):
            tasks.append(asyncio.create_task(collector.deliver(orjson.dumps({"i": i}))))
            await asyncio.sleep(0.01 if i >= 20 else 0)  # ok: spreads the good events over the bad one's retries
        results = await asyncio.gather(*tasks)
    finally:
        await collector.close()
        await runner.cleanup()
    innocent = [r for r in results[1:] if r is not None]
    assert innocent == [], [(r.reason, r.detail[:80]) for r in innocent[:3]]
    assert results[0] is not None and results[0].reason == "retries_exhausted"
    assert "after 3 attempts: HTTP 500" in results[0].detail


async def test_max_attempts_counts_the_attempts_in_batches_and_alone():
    """retry.max_attempts: 3, poison_after_attempts: 2. An event whose batches are answered
    a bare 500 twice (other batches accepted in between) goes alone: there it gets the one
    attempt left, not three more (it was POSTed up to five times)."""
    posts: Counter[str] = Counter()

    async def batch(request: web.Request) -> web.Response:
        docs = orjson.loads(await request.read())
        posts.update(d["id"] for d in docs)
        return web.Response(status=500, text="NPE") if any(d["id"] == "bad" for d in docs) \
            else web.Response(status=204)

    async def single(request: web.Request) -> web.Response:
        doc = orjson.loads(await request.read())
        posts[doc["id"]] += 1
        return web.Response(status=500 if doc["id"] == "bad" else 201)

    runner, port = await serve([("POST", SINGLE, single), ("POST", BATCH, batch)])
    cfg = CollectorConfig(name="b", url=f"http://127.0.0.1:{port}", batch={"max_events": 50, "linger_ms": 5},
                          retry={"initial_backoff_s": 0.02, "max_backoff_s": 0.05, "max_attempts": 3,
                                 "poison_after_attempts": 2})
    collector = BatchCollector(cfg, RelayMetrics().for_collector("b"))
    await collector.start()
    try:
        bad = asyncio.create_task(collector.deliver(orjson.dumps({"id": "bad"})))
        i = 0
        while not bad.done():  # other events accepted meanwhile: the bad one's 500s count
            assert await collector.deliver(orjson.dumps({"id": f"ok-{i}"})) is None
            i += 1
        verdict = await bad
    finally:
        await collector.close()
        await runner.cleanup()
    assert verdict is not None
    assert posts["bad"] == 3, posts["bad"]
    assert verdict.reason == "retries_exhausted" and "after 3 attempts: HTTP 500" in verdict.detail, verdict


async def test_the_last_attempt_after_batch_outages_goes_alone_and_is_the_last():
    """retry.max_attempts: 3, every request answered 503: each event is POSTed three times
    in all, the last time alone, and dead-lettered on its own answer."""
    posts: Counter[str] = Counter()
    alone: Counter[str] = Counter()

    async def batch(request: web.Request) -> web.Response:
        posts.update(d["id"] for d in orjson.loads(await request.read()))
        return web.Response(status=503)

    async def single(request: web.Request) -> web.Response:
        doc = orjson.loads(await request.read())
        posts[doc["id"]] += 1
        alone[doc["id"]] += 1
        return web.Response(status=503)

    runner, port = await serve([("POST", SINGLE, single), ("POST", BATCH, batch)])
    cfg = CollectorConfig(name="b", url=f"http://127.0.0.1:{port}", batch={"max_events": 10, "linger_ms": 5},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.02, "max_attempts": 3})
    collector = BatchCollector(cfg, RelayMetrics().for_collector("b"))
    await collector.start()
    try:
        results = await asyncio.gather(*(collector.deliver(orjson.dumps({"id": str(i)})) for i in range(5)))
    finally:
        await collector.close()
        await runner.cleanup()
    assert [r.reason for r in results] == ["retries_exhausted"] * 5
    assert all("after 3 attempts: HTTP 503" in r.detail for r in results)
    assert posts == {str(i): 3 for i in range(5)} and alone == {str(i): 1 for i in range(5)}


@pytest.mark.parametrize("batch_status", [404, 400])
async def test_events_sent_alone_by_a_batch_collector_respect_its_request_ceiling(batch_status):
    """batch.max_requests: 4 (the lineage_relay_collector_concurrency_limit gauge says 4).
    Once the batch endpoint answers 404 (or refuses a batch whole), events go alone: the
    collector gets at most 4 requests at once (it got hundreds: the dispatcher's
    ``concurrency``), and gets 4 at once, not fewer."""
    live = {"n": 0, "max": 0}

    def answering(status: int):
        async def handler(request: web.Request) -> web.Response:
            await request.read()
            live["n"] += 1
            live["max"] = max(live["max"], live["n"])
            await asyncio.sleep(0.01)  # ok: the collector's own answer time, so that requests overlap
            live["n"] -= 1
            return web.Response(status=status)
        return handler

    runner, port = await serve([("POST", SINGLE, answering(201)), ("POST", BATCH, answering(batch_status))])
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="b", url=f"http://127.0.0.1:{port}", batch={"max_events": 50, "max_requests": 4})
    collector = BatchCollector(cfg, metrics.for_collector("b"))
    await collector.start()
    count = cfg.concurrency  # what the dispatcher lets be in flight: 200
    try:
        results = await asyncio.gather(*(collector.deliver(b'{"e":%d}' % i) for i in range(count)))
    finally:
        await collector.close()
        await runner.cleanup()
    assert results == [None] * count
    gauge = metrics.registry.get_sample_value("lineage_relay_collector_concurrency_limit", {"collector": "b"})
    assert gauge == 4 and live["max"] == 4, f"{live['max']} requests at once, limit gauge {gauge}"


async def test_a_gzip_batch_reply_listing_a_failure_is_read():
    """A collector that compresses its reply though asked for identity: the event it lists
    as failed and retriable is sent again, not taken as delivered."""
    posts: Counter[str] = Counter()

    async def batch(request: web.Request) -> web.Response:
        docs = orjson.loads(await request.read())
        posts.update(d["id"] for d in docs)
        failed = [{"index": i, "reason": "busy", "retriable": True}
                  for i, d in enumerate(docs) if d["id"] == "b" and posts["b"] == 1]
        body = orjson.dumps({"status": "partial_success" if failed else "success", "failed_events": failed})
        return web.Response(status=200, body=gzip.compress(body),
                            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    runner, port = await serve([("POST", BATCH, batch)])
    cfg = CollectorConfig(name="b", url=f"http://127.0.0.1:{port}", batch={"max_events": 10, "linger_ms": 20},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.02})
    collector = BatchCollector(cfg, RelayMetrics().for_collector("b"))
    await collector.start()
    try:
        results = await asyncio.gather(*(collector.deliver(orjson.dumps({"id": i})) for i in "abc"))
    finally:
        await collector.close()
        await runner.cleanup()
    assert results == [None] * 3
    assert posts == {"a": 1, "b": 2, "c": 1}
