"""BatchCollector against a real aiohttp collector on loopback that follows the spec's
``POST /lineage/batch`` contract (204, or 200 with ``failed_events``)."""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson
import pytest

from relay.config import CollectorConfig
from relay.embedded.collector import RecordingCollector
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from relay.sinks.batch_reply import MAX_REPLY_BYTES
from tests.support.loopback_http import serve


def event(i: int) -> bytes:
    return orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "p", "schemaURL": "s",
                         "eventType": "START", "run": {"runId": f"run-{i}"}, "job": {"namespace": "n", "name": "j"}})


def batch_collector(server: RecordingCollector, **batch) -> tuple[BatchCollector, RelayMetrics]:
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="b", url=server.url, batch={"linger_ms": 20, **batch},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05})
    return BatchCollector(cfg, metrics.for_collector("b")), metrics


@pytest.fixture
def server():
    with RecordingCollector(batch_path="/api/v1/lineage/batch") as s:
        yield s


async def deliver_all(collector: BatchCollector, bodies: list[bytes]):
    await collector.start()
    try:
        return await asyncio.gather(*(collector.deliver(b) for b in bodies))
    finally:
        await collector.close()


async def test_concurrent_events_go_out_as_json_array_batches_within_max_events(server):
    collector, metrics = batch_collector(server, max_events=5)
    results = await deliver_all(collector, [event(i) for i in range(12)])
    assert results == [None] * 12
    assert server.count == 12 and server.batches == 3  # 5 + 5 + 2
    assert sorted(e["run"]["runId"] for e in server.events()) == sorted(f"run-{i}" for i in range(12))
    assert metrics.registry.get_sample_value("lineage_relay_batch_requests_total",
                                             {"collector": "b", "result": "ok"}) == 3


async def test_max_bytes_splits_batches(server):
    bodies = [orjson.dumps({**orjson.loads(event(i)), "pad": "x" * 300}) for i in range(6)]
    assert 2 * (len(bodies[0]) + 1) + 16 <= 1024 < 3 * (len(bodies[0]) + 1) + 16
    collector, _ = batch_collector(server, max_events=100, max_bytes=1024)
    assert await deliver_all(collector, bodies) == [None] * 6
    assert server.count == 6 and server.batches == 3  # two events fit in 1024 bytes, three do not


async def test_partial_success_retries_only_the_retriable_and_rejects_the_permanent(server):
    tries: Counter[str] = Counter()

    def script(doc):
        run = doc["run"]["runId"]
        tries[run] += 1
        if run == "run-2" and tries[run] <= 2:
            return 503  # retriable twice, then taken
        if run == "run-4":
            return 422  # never taken
        return None

    server.reject_when(script)
    collector, metrics = batch_collector(server, max_events=10)
    results = await deliver_all(collector, [event(i) for i in range(6)])
    assert [r is None for r in results] == [True, True, True, True, False, True]
    assert results[4].reason == "collector_rejected" and "rejected by script with 422" in results[4].detail
    assert tries == {"run-0": 1, "run-1": 1, "run-2": 3, "run-3": 1, "run-4": 1, "run-5": 1}
    assert Counter(e["run"]["runId"] for e in server.events()) == {f"run-{i}": 1 for i in (0, 1, 2, 3, 5)}
    assert metrics.registry.get_sample_value("lineage_relay_delivery_retries_total", {"collector": "b"}) == 2


async def test_a_batch_refused_whole_is_sent_event_by_event(server):
    server.fail_next(1, 400)
    collector, _ = batch_collector(server, max_events=10)
    assert await deliver_all(collector, [event(i) for i in range(4)]) == [None] * 4
    assert server.count == 4
    assert server.batches == 1  # the refused one; then each event went to /api/v1/lineage


async def test_whole_batch_outage_is_retried_after_retry_after(server):
    server.fail_next(1, 503, retry_after="1")
    collector, _ = batch_collector(server, max_events=10)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await deliver_all(collector, [event(i) for i in range(3)]) == [None] * 3
    assert loop.time() - t0 >= 1.0
    assert server.count == 3


async def test_max_attempts_gives_up_with_retries_exhausted(server):
    server.reject_when(lambda doc: 500 if doc["run"]["runId"] == "run-1" else None)
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="b", url=server.url, batch={"linger_ms": 5},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.02, "max_attempts": 3})
    results = await deliver_all(BatchCollector(cfg, metrics.for_collector("b")), [event(0), event(1)])
    assert results[0] is None
    assert results[1].reason == "retries_exhausted" and "after 3 attempts" in results[1].detail


async def test_an_event_bigger_than_max_bytes_goes_alone(server):
    big = orjson.dumps({**orjson.loads(event(0)), "pad": "x" * 4000})
    collector, _ = batch_collector(server, max_bytes=2048)
    assert await deliver_all(collector, [big, event(1)]) == [None, None]
    assert server.count == 2 and server.batches == 1


async def test_deliver_soon_calls_back_once_per_event_never_from_inside_the_call(server):
    server.reject_when(lambda doc: 422 if doc["run"]["runId"] == "run-1" else None)
    collector, _ = batch_collector(server, max_events=3)
    await collector.start()
    verdicts: dict[int, list] = {i: [] for i in range(3)}
    all_in = asyncio.Event()

    def done(token, verdict):
        verdicts[token].append(verdict)
        if all(verdicts.values()):
            all_in.set()

    try:
        for i in range(3):
            collector.deliver_soon(event(i), done, i)
        assert all(v == [] for v in verdicts.values())  # nothing called back synchronously
        await asyncio.wait_for(all_in.wait(), 10)
    finally:
        await collector.close()
    assert verdicts[0] == [None] and verdicts[2] == [None]
    assert len(verdicts[1]) == 1 and verdicts[1][0].reason == "collector_rejected"


async def test_close_cancels_a_delivery_still_queued(server):
    collector, _ = batch_collector(server, max_events=100, linger_ms=60_000)
    await collector.start()
    waiting = asyncio.create_task(collector.deliver(event(0)))
    async with asyncio.timeout(5):
        while not collector._queue:
            await asyncio.sleep(0.005)  # ok: poll interval of a wait with a deadline (the task queues it)
    await collector.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 5)
    assert server.count == 0


@pytest.mark.parametrize("alone", [False, True], ids=["in-batches", "alone"])
async def test_cancelling_deliver_soon_stops_the_retries_and_the_verdict(server, alone):
    """What deliver_soon returns stops that delivery: an event being retried (in batches,
    or alone for its size) is not sent again and gets no verdict; the others go on."""
    server.reject_when(lambda doc: 503 if doc["run"]["runId"] == "run-0" else None)  # for ever
    collector, _ = batch_collector(server, max_events=10, max_bytes=2048)
    first = orjson.dumps({**orjson.loads(event(0)), "pad": "x" * 4000}) if alone else event(0)
    await collector.start()
    verdicts: list = []

    def attempts() -> int:
        return sum(a.run_id == "run-0" for a in server.attempts)

    try:
        handle = collector.deliver_soon(first, lambda token, verdict: verdicts.append(token), 0)
        async with asyncio.timeout(10):
            while attempts() < 2:
                await asyncio.sleep(0.005)  # ok: poll interval of a wait with a deadline (retries under way)
        handle.cancel()
        tried = attempts()
        async with asyncio.timeout(10):
            # Its backoff over (or its task cancelled): it was not queued again.
            while collector._backing_off or (alone and not handle.done()):
                await asyncio.sleep(0.005)  # ok: poll interval of a wait with a deadline
        for i in range(1, 4):  # later batches go, without it
            assert await collector.deliver(event(i)) is None
    finally:
        await collector.close()
    assert attempts() <= tried + 1  # at most the request already on its way
    assert verdicts == []
    assert not collector._queue and server.count == 3


async def test_adaptive_concurrency_limits_batch_requests_on_overload_signals_only(server):
    server.fail_next(2, 503)
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="b", url=server.url, batch={"linger_ms": 20, "max_events": 5, "max_requests": 4},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05}, adaptive_concurrency={})
    collector = BatchCollector(cfg, metrics.for_collector("b"))
    gate = collector.single.gate
    assert gate is not None and gate.maximum == 4 and not gate.uses_latency  # a batch's size sets its latency
    assert await deliver_all(collector, [event(i) for i in range(40)]) == [None] * 40
    assert server.count == 40
    assert metrics.registry.get_sample_value("lineage_relay_batch_requests_total",
                                             {"collector": "b", "result": "retry"}) == 2  # the two 503s
    assert gate.decreases >= 1 and 1 <= gate.limit <= 4  # the 503s shrank it
    assert metrics.registry.get_sample_value("lineage_relay_collector_concurrency_limit",
                                             {"collector": "b"}) == int(gate.limit)


async def test_an_event_sent_alone_gets_its_verdict_even_when_sending_it_raises(server, caplog):
    """An event bigger than a batch goes to the single-event endpoint on a task of its own.
    If that raises instead of returning a verdict (a bug), the verdict still comes (a dead
    letter, relay_error): without it the event's run and its partition's commits waited
    for ever."""
    collector, _ = batch_collector(server, max_bytes=2048)
    big = orjson.dumps({**orjson.loads(event(0)), "pad": "x" * 4000})

    async def broken(body: bytes):  # noqa: ANN202
        raise ValueError("single broke")

    collector.single.deliver = broken
    verdicts: list = []
    await collector.start()
    try:
        collector.deliver_soon(big, lambda token, verdict: verdicts.append((token, verdict)), "t")
        deadline = asyncio.get_running_loop().time() + 5
        while not verdicts and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)  # ok: the poll interval of a wait with a deadline
    finally:
        await collector.close()
    assert len(verdicts) == 1 and verdicts[0][0] == "t"
    assert verdicts[0][1].reason == "relay_error" and "ValueError: single broke" in verdicts[0][1].detail
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["delivery_error"]


async def test_a_batch_whose_sending_raises_sends_its_events_alone(server, caplog):
    """Sending a batch raised (a bug, as a relative redirect's Location did): the batch was
    retried, raised again, for ever with unlimited attempts, and its events never got a
    verdict (commits held). Each event goes alone instead."""
    collector, metrics = batch_collector(server, max_events=10)
    exchange = collector.single.exchange

    async def broken_for_batches(url, body, keep=None):  # noqa: ANN001, ANN202
        if str(url).endswith("/batch"):
            raise ValueError("batch broke")
        return await exchange(url, body, keep)

    collector.single.exchange = broken_for_batches
    results = await asyncio.wait_for(deliver_all(collector, [event(i) for i in range(5)]), 10)
    assert results == [None] * 5
    assert server.batches == 0 and sorted(e["run"]["runId"] for e in server.events()) == [f"run-{i}" for i in range(5)]
    assert "batch_send_error" in [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


async def _serve(routes) -> tuple[object, str]:  # noqa: ANN001 - (method, path, handler) triples
    runner, port = await serve(routes, client_max_size=64 * 1024 * 1024)
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
async def test_a_2xx_batch_reply_over_the_limit_is_not_read_and_its_events_count_as_delivered(framing, caplog):
    """A 200 whose body is far over MAX_REPLY_BYTES (a proxy gone wrong, an endless
    stream) was read whole into memory. Now no more than the limit is read; like a body
    that is not JSON it names no failed event, so the batch's events are delivered (not
    sent again alone), it is logged, and the next batch goes on a new connection."""
    from aiohttp import web

    piece, size = b" " * 65536, 64 * 1024 * 1024
    written, ended, finished = [0], asyncio.Event(), []
    peers: list[object] = []
    singles: list[bytes] = []

    async def batch(request: web.Request) -> web.StreamResponse:
        await request.read()
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if len(peers) > 1:
            return web.Response(status=204)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        if framing == "chunked":
            response.enable_chunked_encoding()
        else:
            response.content_length = size
        try:
            await response.prepare(request)
            for _ in range(size // len(piece)):
                await response.write(piece)
                written[0] += len(piece)
            await response.write_eof()
            finished.append(True)
        except OSError:  # the relay went away: what was written so far is the measure
            pass
        finally:
            ended.set()
        return response

    async def single(request: web.Request) -> web.Response:
        singles.append(await request.read())
        return web.Response(status=201)

    runner, url = await _serve([("POST", "/api/v1/lineage/batch", batch), ("POST", "/api/v1/lineage", single)])
    metrics = RelayMetrics()
    cfg = CollectorConfig(name="b", url=url, batch={"linger_ms": 20, "max_events": 10},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05, "max_attempts": 1})
    collector = BatchCollector(cfg, metrics.for_collector("b"))
    await collector.start()
    try:
        assert await asyncio.gather(*(collector.deliver(event(i)) for i in range(3))) == [None] * 3
        await asyncio.wait_for(ended.wait(), 10)  # the relay went away mid-body
        assert await asyncio.gather(*(collector.deliver(event(i)) for i in range(3, 5))) == [None] * 2
    finally:
        await collector.close()
        await runner.cleanup()
    assert not finished
    # The limit, and what the loopback's socket buffers take in besides: a few MiB more.
    assert written[0] <= MAX_REPLY_BYTES + 16 * 1024 * 1024 < size, f"{written[0] / 2**20:.0f} MiB written"
    assert singles == [], "no event was sent again alone"
    assert len(peers) == 2 and peers[0] != peers[1], "the connection left mid-body was reused"
    assert metrics.registry.get_sample_value("lineage_relay_batch_requests_total",
                                             {"collector": "b", "result": "ok"}) == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == ["batch_reply_not_read"]


async def test_a_partial_success_listing_every_event_of_the_largest_batch_is_read():
    """The limit is generous enough for the spec's reply to the largest batch (10,000
    events) listing each as failed with a reason: each event gets its own verdict."""
    from aiohttp import web

    count = 10_000
    reason = "r" * 340  # an entry of ~400 bytes: {"index":9999,"reason":"...","retriable":false}
    failed = [{"index": i, "reason": f"{i}:{reason}", "retriable": False} for i in range(count)]
    reply = orjson.dumps({"status": "failure", "summary": {"received": count, "successful": 0, "failed": count},
                          "failed_events": failed})
    assert 0.9 * MAX_REPLY_BYTES < len(reply) <= MAX_REPLY_BYTES

    async def batch(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(reply), 65536):  # in pieces, as a collector streaming it would
            await response.write(reply[start:start + 65536])
        await response.write_eof()
        return response

    runner, url = await _serve([("POST", "/api/v1/lineage/batch", batch)])
    cfg = CollectorConfig(name="b", url=url, batch={"linger_ms": 1000, "max_events": count, "max_bytes": 8 * 2**20},
                          timeout_s=30)
    collector = BatchCollector(cfg, RelayMetrics().for_collector("b"))
    await collector.start()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(collector.deliver(event(i)) for i in range(count))), 60)
    finally:
        await collector.close()
        await runner.cleanup()
    assert all(r is not None and r.reason == "collector_rejected" for r in results)
    assert all(r.detail.startswith(f"batch item {i} failed: {i}:rrr") for i, r in enumerate(results))
