"""Request time limits (relay.sinks.deadlines): a slow answer times out, and only the
request that is over time; a cancellation from elsewhere is never taken for a timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay import event_loop
from relay.embedded.collector import RecordingCollector
from relay.sinks.deadlines import Deadlines
from tests.relay.sinks.test_http_collector import BODY, collector_for, until
from tests.relay.test_event_loop import needs_uvloop
from tests.support.relay import ON_EACH_LOOP


@pytest.fixture
def server():
    with RecordingCollector(token="tok") as s:
        yield s


@ON_EACH_LOOP
async def test_a_slow_answer_times_out_at_the_limit_not_when_it_comes(server):
    server.fail_next(1, delay_s=5.0)
    http, _ = collector_for(server, token="tok", timeout_s=1.0, retry={"max_attempts": 1})
    await http.start()
    try:
        started = time.monotonic()
        failure = await http.deliver(BODY)
        took = time.monotonic() - started
    finally:
        await http.close()
    assert failure is not None and failure.reason == "retries_exhausted"
    assert "no answer within 1 s" in failure.detail
    assert 1.0 <= took < 3.75, took  # well before the answer (5 s)


@ON_EACH_LOOP
async def test_only_the_request_over_time_times_out(server):
    """Eight requests at once; the one the collector sits on times out, the seven others
    are answered and succeed, and later requests on the same collector are not affected."""
    server.fail_next(1, delay_s=5.0)
    # Not shorter: the seven answered at once may take a while on a loaded machine.
    http, _ = collector_for(server, token="tok", timeout_s=2.0, retry={"max_attempts": 1})
    await http.start()
    try:
        results = await asyncio.gather(*(http.deliver(BODY + b" " * i) for i in range(8)))
        later = [await http.deliver(BODY) for _ in range(3)]
    finally:
        await http.close()
    failed = [r for r in results if r is not None]
    assert len(failed) == 1 and "no answer within 2 s" in failed[0].detail
    assert later == [None, None, None]
    assert server.count == 10


@ON_EACH_LOOP
async def test_a_timed_out_request_is_retried_and_delivered(server):
    server.fail_next(1, delay_s=5.0)
    http, metrics = collector_for(server, token="tok", timeout_s=2.0)  # the retry's answer may be slow
    await http.start()
    try:
        assert await http.deliver(BODY) is None
    finally:
        await http.close()
    assert server.count == 1
    assert metrics.registry.get_sample_value("lineage_relay_delivery_retries_total", {"collector": "c"}) == 1


@ON_EACH_LOOP
async def test_cancelling_a_delivery_is_not_taken_for_a_timeout(server):
    """Shutdown cancels deliveries still running: that must stop them, not retry them."""
    server.fail_next(1, delay_s=2.0)
    http, metrics = collector_for(server, token="tok", timeout_s=10.0)
    await http.start()
    try:
        delivery = asyncio.create_task(http.deliver(BODY))
        await until(lambda: server.in_flight == 1, "the request to reach the collector")
        delivery.cancel()
        with pytest.raises(asyncio.CancelledError):
            await delivery
    finally:
        await http.close()
    assert metrics.registry.get_sample_value("lineage_relay_delivery_retries_total", {"collector": "c"}) == 0


class _CancelledTooAtExpiry(Deadlines):
    """Somebody else cancels the task in the same turn of the loop as the timeout."""

    victim: asyncio.Task | None = None

    def _expire(self) -> None:
        super()._expire()
        if self.victim is not None:
            self.victim.cancel()


async def _request(deadlines: Deadlines, outcome: list[str]) -> None:
    task = deadlines.begin()
    try:
        await asyncio.sleep(10)  # ok: a request that never gets an answer
    except asyncio.CancelledError:
        if deadlines.expired(task):
            outcome.append("timed out")
            return
        outcome.append("cancelled")
        raise
    finally:
        deadlines.end(task)


@ON_EACH_LOOP
async def test_a_cancellation_at_the_moment_of_the_timeout_still_cancels():
    deadlines = _CancelledTooAtExpiry(0.05)
    outcome: list[str] = []
    task = asyncio.create_task(_request(deadlines, outcome))
    deadlines.victim = task
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert outcome == ["cancelled"]
    assert deadlines.in_flight == 0


@ON_EACH_LOOP
async def test_each_request_has_its_own_deadline_and_the_task_is_usable_after_a_timeout():
    """A starts at 0 and never gets an answer; B starts at 1.0 (its own limit is 3.0) and is
    answered once A has timed out (at 2.0): A's timeout must not touch B. B's answer follows
    A's timeout itself, not a timer: a loop stalled for a while (a loaded machine) must not
    make B's deadline come before its answer."""
    deadlines = Deadlines(2.0)
    outcome: list[str] = []
    a_timed_out = asyncio.Event()

    async def a() -> None:
        await _request(deadlines, outcome)  # times out
        a_timed_out.set()
        assert asyncio.current_task().cancelling() == 0, "the timeout's cancellation was not taken back"
        task = deadlines.begin()   # the same task goes on with another request, answered at once
        deadlines.end(task)
        outcome.append("A again")

    async def b() -> None:
        await asyncio.sleep(1.0)  # ok: B's request starts later on the timeline under test
        task = deadlines.begin()
        try:
            await a_timed_out.wait()   # the collector answers B after A's timeout
        finally:
            deadlines.end(task)
        outcome.append("B")

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(a(), b()), 10)
    assert sorted(outcome) == ["A again", "B", "timed out"]
    assert outcome.index("timed out") < outcome.index("B")
    assert time.monotonic() - started >= 2.0
    assert deadlines.in_flight == 0
    deadlines.close()


class _CountedExpiry(Deadlines):
    wake_ups = 0

    def _expire(self) -> None:
        self.wake_ups += 1
        super()._expire()


async def _staggered_timeouts(count: int, timeout_s: float) -> tuple[int, list[float]]:
    """``count`` requests that never get an answer, started 3 ms apart: how often the timer
    woke, and how long after its start (as begin() noted it, or later) each timed out."""
    deadlines = _CountedExpiry(timeout_s)
    took: list[float] = []

    async def request() -> None:
        task = deadlines.begin()
        started = time.monotonic()
        try:
            await asyncio.sleep(10)  # ok: a request that never gets an answer
        except asyncio.CancelledError:
            assert deadlines.expired(task)
            took.append(time.monotonic() - started)
        finally:
            deadlines.end(task)

    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(request()))
        await asyncio.sleep(0.003)  # ok: the requests' start times being modelled
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    deadlines.close()
    return deadlines.wake_ups, took


@pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_the_timer_wakes_once_per_deadline_and_never_before_it(loop):
    """uvloop runs a timer up to ~1 ms before time.monotonic() reaches its deadline (whole
    milliseconds of its own clock): the timer must not then wake again and again for the
    rest, nor cancel a request early."""
    with asyncio.Runner(loop_factory=event_loop.loop_factory(loop)) as runner:
        wake_ups, took = runner.run(_staggered_timeouts(50, 0.05))
    assert len(took) == 50
    assert min(took) >= 0.05, sorted(took)[:5]
    assert wake_ups <= 50, wake_ups
