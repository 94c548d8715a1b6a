"""A collector's ``check_before_requests`` (relay.sinks.base): the check runs right before
each request is written, after any wait for a connection; what it raises
(``DeliveryStopped``) stops the request, quietly: no verdict, no error logged. Real HTTP on
loopback."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from relay.config import CollectorConfig
from relay.embedded.collector import RecordingCollector
from relay.metrics import RelayMetrics
from relay.sinks.base import DeliveryStopped
from relay.sinks.batch import BatchCollector
from relay.sinks.http import HttpCollector
from tests.support.gated_collector import GatedCollector
from tests.support.waiting import until


def event(i: int) -> bytes:
    return orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "p", "schemaURL": "s",
                         "eventType": "START", "run": {"runId": f"run-{i}"}, "job": {"namespace": "n", "name": "j"}})


class Switch:
    """The check: counts its calls, raises once :attr:`stopped` (or from call ``stop_at`` on)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls = 0
        self.stopped = False
        self.stop_at = stop_at

    def __call__(self) -> None:
        self.calls += 1
        if self.stopped or (self.stop_at is not None and self.calls >= self.stop_at):
            raise DeliveryStopped("stopped by the test")


async def test_a_request_waiting_for_a_connection_is_checked_again_once_it_has_one():
    """``concurrency: 1``: the second request starts (checked) while the first holds the one
    connection; the check stops it once that connection is free, before it is written."""
    with GatedCollector() as gated:
        config = CollectorConfig(name="a", url=gated.url, concurrency=1, timeout_s=120)
        collector = HttpCollector(config, RelayMetrics().for_collector("a"))
        check = Switch()
        collector.check_before_requests(check)
        await collector.start()
        try:
            first = asyncio.create_task(collector.deliver(event(0)))
            await until(lambda: gated.count == 1, "the first request at the collector", 60.0)
            second = asyncio.create_task(collector.deliver(event(1)))
            # The first's start and connection, the second's start: it now waits for the connection.
            await until(lambda: check.calls == 3, "the second request's check at its start", 60.0)
            check.stopped = True
            gated.open()
            assert await asyncio.wait_for(first, 120) is None
            with pytest.raises(DeliveryStopped):
                await asyncio.wait_for(second, 120)
        finally:
            await collector.close()
        assert gated.count == 1, "the second request was written after the check stopped it"


async def test_a_stop_once_a_new_connection_is_made_keeps_the_request_from_being_written():
    """No connection to reuse: the check passes at the request's start, raises once the
    new connection is made; the collector gets no request."""
    with RecordingCollector() as server:
        collector = HttpCollector(CollectorConfig(name="a", url=server.url, timeout_s=120),
                                  RelayMetrics().for_collector("a"))
        check = Switch(stop_at=2)
        collector.check_before_requests(check)
        await collector.start()
        try:
            with pytest.raises(DeliveryStopped):
                await asyncio.wait_for(collector.deliver(event(0)), 120)
        finally:
            await collector.close()
        assert check.calls == 2, "checked at the request's start and once its connection was made"
        assert server.count == 0 and not server.attempts, "the request was written after the check stopped it"


@pytest.mark.parametrize("alone", [False, True], ids=["batch", "alone"])
async def test_a_batch_collector_stopped_by_the_check_gives_no_verdict_and_logs_no_error(caplog, alone):
    """Stopped batches, and events that go alone (larger than ``max_bytes``): ``deliver``
    raises the check's ``DeliveryStopped``, nothing is sent or retried, no ERROR line."""
    caplog.set_level(logging.INFO)
    with RecordingCollector(batch_path="/api/v1/lineage/batch") as server:
        config = CollectorConfig(name="b", url=server.url, batch={"linger_ms": 20, "max_bytes": 1024},
                                 retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05})
        collector = BatchCollector(config, RelayMetrics().for_collector("b"))
        check = Switch()
        collector.check_before_requests(check)
        await collector.start()
        bodies = [orjson.dumps({**orjson.loads(event(i)), "pad": "x" * (2000 if alone else 0)}) for i in range(3)]
        try:
            assert await asyncio.wait_for(collector.deliver(bodies[0]), 60) is None
            check.stopped = True
            results = await asyncio.wait_for(
                asyncio.gather(*(collector.deliver(b) for b in bodies[1:]), return_exceptions=True), 60)
        finally:
            await collector.close()
        assert [type(r) for r in results] == [DeliveryStopped, DeliveryStopped], results
        assert server.count == 1 and len(server.attempts) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "batch_send_error" not in caplog.text and "delivery_error" not in caplog.text


async def test_without_a_check_the_session_traces_nothing():
    """The running relay sets no check: aiohttp then runs no trace hook per request."""
    with RecordingCollector() as server:
        collector = HttpCollector(CollectorConfig(name="a", url=server.url), RelayMetrics().for_collector("a"))
        await collector.start()
        try:
            assert await collector.deliver(event(0)) is None
            assert collector._session is not None and not collector._session.trace_configs
        finally:
            await collector.close()
