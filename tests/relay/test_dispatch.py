"""RunOrderedDispatcher: concurrency across runs, strict order within a run; the same
behaviour with worker tasks (``deliver``) and with a collector that calls back
(``deliver_soon``)."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from relay.dispatch import RunOrderedDispatcher
from relay.embedded.sample import sample_stream
from relay.stages.decode import decode_record


def events(n_runs: int):
    return [decode_record(v, max_bytes=1 << 24) for _, v in sample_stream(n_runs, seed=9)]


@pytest.fixture(params=["workers", "callbacks"])
def make(request):
    """Builds a dispatcher around an async ``deliver``, in the parametrised mode. In
    callback mode the collector's side runs ``deliver`` as a task and calls back when it
    is done, as a batch collector does when a batch's answer comes."""
    tasks: set[asyncio.Task] = set()

    def build(deliver, concurrency, **kw):
        if request.param == "workers":
            return RunOrderedDispatcher(deliver, concurrency, **kw)

        def deliver_soon(item, done, token):
            task = asyncio.ensure_future(deliver(item))
            tasks.add(task)
            task.add_done_callback(lambda t: (tasks.discard(t), t.cancelled() or done(token, t.result())))
            return task  # cancel() stops the delivery: no verdict

        async def never(item):
            raise AssertionError("callback mode must not call deliver")

        return RunOrderedDispatcher(never, concurrency, deliver_soon=deliver_soon, **kw)

    return build


async def test_runs_in_parallel_events_of_a_run_in_order(make):
    evs = events(40)
    active: dict[str, int] = defaultdict(int)
    seen: dict[str, list] = defaultdict(list)
    peak = 0
    rng = random.Random(1)

    async def deliver(event):
        nonlocal peak
        active[event.run_id] += 1
        assert active[event.run_id] == 1, "two events of one run in flight at once"
        peak = max(peak, sum(active.values()))
        await asyncio.sleep(rng.random() / 500)  # ok: simulated network latency
        seen[event.run_id].append(event)
        active[event.run_id] -= 1

    dispatcher = make(deliver, concurrency=8)
    dispatcher.start()
    for e in evs:
        dispatcher.submit(e)
    assert await dispatcher.wait_idle(30)
    await dispatcher.stop()
    assert peak == 8
    for run_id, got in seen.items():
        assert got == [e for e in evs if e.run_id == run_id]
    assert dispatcher.pending == 0


async def test_remove_where_takes_queued_events_out(make):
    evs = events(3)
    gate = asyncio.Event()
    delivered = []

    async def deliver(event):
        await gate.wait()
        delivered.append(event)

    dispatcher = make(deliver, concurrency=1)
    dispatcher.start()
    for e in evs:
        dispatcher.submit(e)
    await asyncio.sleep(0)  # ok: let the single worker take the first event (a callback dispatcher did already)
    victim_run = next(e.run_id for e in reversed(evs) if e.run_id != evs[0].run_id)
    removed = dispatcher.remove_where(lambda e: e.run_id == victim_run)
    assert removed and all(e.run_id == victim_run for e in removed)
    gate.set()
    assert await dispatcher.wait_idle(10)
    await dispatcher.stop()
    assert len(delivered) + len(removed) == len(evs)
    assert all(e.run_id != victim_run for e in delivered)


def runs_of(evs, n: int):
    """``n`` run ids with at least two events each, and those events by run."""
    by_run: dict[str, list] = defaultdict(list)
    for e in evs:
        if e.run_id is not None:
            by_run[e.run_id].append(e)
    runs = [r for r, of in by_run.items() if len(of) >= 2][:n]
    assert len(runs) == n
    return runs, by_run


async def test_abort_where_stops_deliveries_under_way_and_their_runs_go_on(make):
    """A delivery being retried (here: never answered) is stopped: it sees the cancellation,
    gets no verdict, and its run's next event goes; the other runs are untouched."""
    (stuck_run, other_run), by_run = runs_of(events(12), 2)
    stuck_first = by_run[stuck_run][0]
    started, stopped, delivered, settled = [], [], [], []

    async def deliver(event):
        if event is stuck_first:
            started.append(event)
            try:
                await asyncio.Event().wait()  # a collector that never answers
            except asyncio.CancelledError:
                stopped.append(event)
                raise
        delivered.append(event)
        return "ok"

    dispatcher = make(deliver, concurrency=1, settle=lambda e, r: settled.append(e))
    dispatcher.start()
    for e in by_run[stuck_run] + by_run[other_run]:
        dispatcher.submit(e)
    assert await wait_until(lambda: started)
    assert dispatcher.sending_where(lambda e: True) == 1
    assert dispatcher.sending_where(lambda e: e is stuck_first) == 1
    assert dispatcher.abort_where(lambda e: e.run_id == other_run) == []  # not under way
    assert dispatcher.abort_where(lambda e: e.run_id == stuck_run) == [stuck_first]
    assert dispatcher.abort_where(lambda e: e.run_id == stuck_run) == []  # once
    # The single worker (or slot) is free again: everything else is delivered, in order.
    assert await dispatcher.wait_idle(10)
    assert await wait_until(lambda: stopped), "the delivery saw the cancellation"
    await dispatcher.stop()
    assert stopped == [stuck_first]
    assert stuck_first not in settled and stuck_first not in delivered
    assert [e for e in delivered if e.run_id == stuck_run] == by_run[stuck_run][1:]
    assert [e for e in delivered if e.run_id == other_run] == by_run[other_run]
    assert settled == delivered
    assert dispatcher.pending == 0


async def test_an_abort_and_a_stop_together_stop_the_workers():
    evs = events(4)
    started = asyncio.Event()

    async def deliver(event):
        started.set()
        await asyncio.Event().wait()

    dispatcher = RunOrderedDispatcher(deliver, 2)
    dispatcher.start()
    dispatcher.submit(evs[0])
    await asyncio.wait_for(started.wait(), 5)
    assert dispatcher.abort_where(lambda e: True) == [evs[0]]
    await asyncio.wait_for(dispatcher.stop(), 5)  # the stop's cancellation is not swallowed


async def test_an_abort_the_delivery_swallows_leaves_no_trace_and_a_later_stop_still_stops():
    """A deliver() that swallows the cancellation and returns: its verdict settles the
    event, and the abort is forgotten, so that a later stop's cancellation of the worker
    is never taken for it (stop() would then wait for ever)."""
    evs = events(4)
    started, settled = asyncio.Event(), []

    async def deliver(event):
        if event is evs[0]:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return "swallowed"
        return "ok"

    dispatcher = RunOrderedDispatcher(deliver, 1, settle=lambda e, r: settled.append(r))
    dispatcher.start()
    dispatcher.submit(evs[0])
    await asyncio.wait_for(started.wait(), 5)
    assert dispatcher.abort_where(lambda e: True) == [evs[0]]
    assert await dispatcher.wait_idle(5)
    assert settled == ["swallowed"] and not dispatcher._aborted
    await asyncio.wait_for(dispatcher.stop(), 5)


async def test_callbacks_an_abort_without_a_handle_ignores_the_late_verdict():
    """A collector whose deliver_soon returns nothing cannot be stopped: its verdict, when
    it comes, is ignored (the run went on already, and pending is not counted twice)."""
    (run,), by_run = runs_of(events(6), 1)
    pending, settled = [], []

    def deliver_soon(item, done, token):
        pending.append((done, token, item))

    async def never(item):
        raise AssertionError("callback mode must not call deliver")

    dispatcher = RunOrderedDispatcher(never, 4, settle=lambda e, r: settled.append(e), deliver_soon=deliver_soon)
    dispatcher.start()
    first, second = by_run[run][:2]
    dispatcher.submit(first)
    dispatcher.submit(second)
    assert dispatcher.abort_where(lambda e: e is first) == [first]
    assert [item for _, _, item in pending] == [first, second]  # the run's next went at once
    done, token, _ = pending.pop(0)
    done(token, None)  # the aborted delivery's late verdict
    assert settled == [] and dispatcher.pending == 1
    done, token, _ = pending.pop(0)
    done(token, None)
    assert settled == [second] and dispatcher.pending == 0
    await dispatcher.stop()


async def wait_until(condition, timeout_s: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.005)  # ok: poll interval of a wait with a deadline
    return True


async def test_a_run_submitted_after_an_event_of_another_run_waits_for_it(make):
    evs = events(2)
    parent = evs[0]
    child = next(e for e in evs if e.run_id != parent.run_id)
    parent_may_finish = asyncio.Event()
    order = []

    async def deliver(event):
        if event is parent:
            await parent_may_finish.wait()
        order.append(event)

    dispatcher = make(deliver, concurrency=4)
    dispatcher.start()
    dispatcher.submit(child, after=parent)  # the parent's event is not even submitted yet
    dispatcher.submit(parent)
    await asyncio.sleep(0.01)  # ok: give free workers the chance to (wrongly) take the child
    assert order == []
    parent_may_finish.set()
    assert await dispatcher.wait_idle(5)
    assert order == [parent, child]
    # An event that will never come does not hold a run forever.
    other = next(e for e in evs if e.run_id == child.run_id and e is not child)
    never = events(1)[0]
    dispatcher.submit(other, after=never)
    dispatcher.forget_gate(never)
    assert await dispatcher.wait_idle(5)
    await dispatcher.stop()
    assert order[-1] is other


async def test_prepare_and_settle_wrap_each_delivery_and_a_prepared_none_is_not_delivered(make):
    evs = events(6)
    sent, settled = [], []

    async def send(body):
        sent.append(body)
        return len(body)

    def prepare(event):
        return None if event.event_type == "RUNNING" else event.body

    dispatcher = make(send, concurrency=3, prepare=prepare,
                                      settle=lambda event, result: settled.append((event, result)))
    dispatcher.start()
    for e in evs:
        dispatcher.submit(e)
    assert await dispatcher.wait_idle(30)
    await dispatcher.stop()
    delivered = [e for e in evs if e.event_type != "RUNNING"]
    assert 0 < len(delivered) < len(evs)
    assert sorted(sent) == sorted(e.body for e in delivered)
    assert sorted(((id(e), r) for e, r in settled)) == sorted((id(e), len(e.body)) for e in delivered)
    assert dispatcher.pending == 0


async def test_callbacks_a_failing_settle_does_not_hold_the_run_and_late_verdicts_after_stop_are_ignored():
    evs = [e for e in events(10) if e.run_id is not None]
    run = max({e.run_id for e in evs}, key=lambda r: sum(e.run_id == r for e in evs))
    of_run = [e for e in evs if e.run_id == run]
    assert len(of_run) >= 3
    calls: list = []
    pending: list = []

    def deliver_soon(item, done, token):
        pending.append((done, token, item))

    def settle(event, result):
        calls.append(event)
        if event is of_run[0]:
            raise RuntimeError("settle broke")

    async def never(item):
        raise AssertionError("callback mode must not call deliver")

    dispatcher = RunOrderedDispatcher(never, 8, settle=settle, deliver_soon=deliver_soon)
    dispatcher.start()
    for e in of_run:
        dispatcher.submit(e)
    assert [item for _, _, item in pending] == [of_run[0]]  # one event of a run at a time
    done, token, _ = pending.pop()
    done(token, None)  # settle raises: logged, and the run goes on
    assert [item for _, _, item in pending] == [of_run[1]]
    done, token, _ = pending.pop()
    await dispatcher.stop()
    done(token, None)  # after stop: ignored, nothing more is handed over
    assert calls == [of_run[0]] and pending == []


async def test_a_stopped_dispatcher_is_sending_nothing(make):
    """Once stopped, no event counts as being sent: the deliveries under way get no verdict
    (their offsets are not committed). The relay's revocation waits while events of the
    partitions it gives up are being sent; after a stop (leaving the group at shutdown)
    the callback mode still counted them, and the revocation waited for the whole
    drain_timeout_s, up to 30 s, for verdicts that never come."""
    evs = events(6)
    forever = asyncio.Event()

    async def deliver(event):
        await forever.wait()  # a collector that does not answer

    dispatcher = make(deliver, 4)
    dispatcher.start()
    for event in evs:
        dispatcher.submit(event)
    assert await wait_until(lambda: dispatcher.sending_where(lambda e: True) == 4)
    await asyncio.wait_for(dispatcher.stop(), 5)
    assert dispatcher.sending_where(lambda e: True) == 0
    assert dispatcher.abort_where(lambda e: True) == []
    forever.set()


@pytest.mark.parametrize("make,breaks", [("workers", "prepare"), ("workers", "deliver"), ("workers", "settle"),
                                         ("callbacks", "prepare"), ("callbacks", "settle")], indirect=["make"])
async def test_an_exception_while_delivering_settles_the_event_as_failed_and_delivery_goes_on(make, breaks, caplog):
    """``prepare`` and collectors are not meant to raise. If one does (a bug, a plugged-in
    collector kind), the event is settled with ``failed(error)`` (a dead letter, in the
    relay) and logged with its traceback; the run's next events, and every other run, are
    still delivered, and nothing stays pending (a dead worker used to hold its event's
    offset, and so its partition's commits, for good). A failing ``settle`` is logged and
    the run goes on, the event not settled a second time. (A collector that calls back and
    raises: the next test.)"""
    evs = [e for e in events(12) if e.run_id is not None]
    bad = evs[len(evs) // 2]
    sent, settled = [], []

    def prepare(event):
        if breaks == "prepare" and event is bad:
            raise ValueError("prepare broke")
        return event

    async def deliver(event):
        if breaks == "deliver" and event is bad:
            raise ValueError("deliver broke")
        sent.append(event)
        return "ok"

    def settle(event, result):
        settled.append((event, result))
        if breaks == "settle" and event is bad:
            raise ValueError("settle broke")

    dispatcher = make(deliver, concurrency=2, prepare=prepare, settle=settle,
                      failed=lambda err: f"failed: {err}")
    dispatcher.start()
    for e in evs:
        dispatcher.submit(e)
    assert await dispatcher.wait_idle(30), "every event settled, the broken one included"
    await dispatcher.stop()
    assert dispatcher.pending == 0
    results = {id(e): r for e, r in settled}
    assert len(settled) == len(evs) == len(results), "each event settled exactly once"
    if breaks == "settle":
        assert results[id(bad)] == "ok" and len(sent) == len(evs)
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["settle_failed"]
    else:
        assert results[id(bad)] == f"failed: {breaks} broke"
        assert sorted(map(id, sent)) == sorted(id(e) for e in evs if e is not bad)
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert [r.getMessage() for r in errors] == ["delivery_error"] and errors[0].exc_info is not None
    # Runs in order all along: each run's events settled in submission order.
    by_run: dict[str, list] = defaultdict(list)
    for e, _ in settled:
        by_run[e.run_id].append(e)
    for run, got in by_run.items():
        assert got == [e for e in evs if e.run_id == run]


async def test_callbacks_a_collector_whose_deliver_soon_raises_settles_the_event_as_failed():
    evs = [e for e in events(4) if e.run_id is not None]
    settled = []

    def deliver_soon(item, done, token):
        raise RuntimeError("deliver_soon broke")

    async def never(item):
        raise AssertionError("callback mode must not call deliver")

    dispatcher = RunOrderedDispatcher(never, 4, settle=lambda e, r: settled.append((e, r)), deliver_soon=deliver_soon,
                                      failed=lambda err: repr(err))
    dispatcher.start()
    for e in evs:
        dispatcher.submit(e)
    assert await dispatcher.wait_idle(5)
    await dispatcher.stop()
    assert [e for e, _ in settled] and sorted(map(id, (e for e, _ in settled))) == sorted(map(id, evs))
    assert {r for _, r in settled} == {"RuntimeError('deliver_soon broke')"}
