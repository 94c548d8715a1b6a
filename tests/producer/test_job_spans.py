"""How a run ends when it is stopped rather than failed, and what a decorated callable's run
spans when it is not declared async/generator itself (an async def under another decorator,
a callable object)."""

from __future__ import annotations

import asyncio
import functools
import gc
import warnings

import pytest

from producer.job import current_run, lineage_job
from tests.producer.support import JobRecorder as Recorder


def plain_decorator(func):
    """An ordinary third-party decorator: a sync wrapper, whatever ``func`` is."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper


# --- stopped, not failed: ABORT ----------------------------------------------------------


def test_a_cancelled_task_or_timeout_aborts_its_run_without_an_error():
    rec = Recorder()

    async def work(name, inside=None):
        with lineage_job(name, producer=rec):
            if inside is not None:
                inside.set()
            await asyncio.sleep(10)  # ok: cancelled (or timed out) long before it ends

    async def main():
        inside = asyncio.Event()
        task = asyncio.create_task(work("cancelled", inside))
        await asyncio.wait_for(inside.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(work("timed_out"), 0.01)

    asyncio.run(main())
    assert rec.seen() == [("cancelled", "START"), ("cancelled", "ABORT"), ("timed_out", "START"),
                          ("timed_out", "ABORT")]
    assert all("errorMessage" not in e["run"]["facets"] for e in rec.events)
    rec.validate()


def test_a_generator_closed_inside_its_with_and_ctrl_c_abort():
    rec = Recorder()

    def rows():
        with lineage_job("rows", producer=rec):
            yield 1
            yield 2

    reader = rows()
    next(reader)
    reader.close()
    with pytest.raises(KeyboardInterrupt):
        with lineage_job("interrupted", producer=rec):
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError):
        with lineage_job("failed", producer=rec):
            raise RuntimeError("a failure is still FAIL")
    assert rec.seen() == [("rows", "START"), ("rows", "ABORT"), ("interrupted", "START"), ("interrupted", "ABORT"),
                          ("failed", "START"), ("failed", "FAIL")]
    assert [("errorMessage" in e["run"]["facets"]) for e in rec.events] == [False] * 5 + [True]
    rec.validate()


# --- a coroutine returned by a sync callable --------------------------------------------


def test_an_async_def_under_a_plain_decorator_reports_the_awaited_outcome():
    # START and COMPLETE were sent when the coroutine object was made, before any work; the
    # failure, when awaited, was never sent.
    rec = Recorder()
    seen_inside = []

    @lineage_job("load", producer=rec)
    @plain_decorator
    async def load(fail):
        await asyncio.sleep(0)  # ok: a suspension point (one loop turn), part of what is tested
        seen_inside.append(current_run().job_name)
        with lineage_job("inside", producer=rec):
            pass
        if fail:
            raise ValueError("load failed")
        return "loaded"

    coro = load(False)
    assert current_run() is None, "the run is not the caller's while the coroutine waits"
    assert rec.seen() == [("load", "START")]
    assert asyncio.run(coro) == "loaded"
    with pytest.raises(ValueError):
        asyncio.run(load(True))
    assert rec.seen() == [("load", "START"), ("inside", "START"), ("inside", "COMPLETE"), ("load", "COMPLETE")] * 1 + [
        ("load", "START"), ("inside", "START"), ("inside", "COMPLETE"), ("load", "FAIL")]
    assert seen_inside == ["load", "load"]
    assert rec.events[1]["run"]["facets"]["parent"]["run"]["runId"] == rec.events[0]["run"]["runId"]
    assert rec.events[-1]["run"]["facets"]["errorMessage"]["message"] == "ValueError: load failed"
    rec.validate()


def test_a_returned_coroutine_cancelled_or_never_awaited_aborts():
    rec = Recorder()

    @lineage_job("slow", producer=rec)
    @plain_decorator
    async def slow():
        await asyncio.sleep(10)  # ok: cancelled or timed out long before it ends

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow(), 0.01)

    asyncio.run(main())
    assert rec.seen() == [("slow", "START"), ("slow", "ABORT")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "coroutine ... was never awaited"
        slow()
        gc.collect()
    assert rec.seen()[2:] == [("slow", "START"), ("slow", "ABORT")]
    rec.validate()


def test_a_callable_object_with_async_call_is_an_async_job():
    rec = Recorder()

    class Loader:
        async def __call__(self, x):
            await asyncio.sleep(0)  # ok: a suspension point (one loop turn), part of what is tested
            assert current_run().job_name.endswith("Loader")
            return x + 1

    loader = lineage_job(producer=rec)(Loader())
    coro = loader(1)
    assert rec.events == [], "declared async: the run starts when awaited, as for an async def"
    assert asyncio.run(coro) == 2
    assert [t for _, t in rec.seen()] == ["START", "COMPLETE"]
    assert rec.events[0]["job"]["name"] == f"{__name__}.{Loader.__qualname__}"


def test_a_sync_facade_over_an_async_def_stays_sync():
    # A decorator running the coroutine itself (asyncio.run) returns a value, not a coroutine:
    # the decorated function must stay a plain function.
    rec = Recorder()

    def run_sync(func):
        @functools.wraps(func)
        def wrapper(*args):
            return asyncio.run(func(*args))
        return wrapper

    @lineage_job("facade", producer=rec)
    @run_sync
    async def compute(x):
        return x * 2

    assert compute(21) == 42
    assert rec.seen() == [("facade", "START"), ("facade", "COMPLETE")]


def test_a_returned_future_ends_the_run_when_done():
    rec = Recorder()

    @lineage_job("scheduled", producer=rec)
    def schedule(fail):
        async def work():
            await asyncio.sleep(0)  # ok: a suspension point (one loop turn), part of what is tested
            if fail:
                raise KeyError("k")
        return asyncio.ensure_future(work())

    async def main():
        ok = schedule(False)
        assert rec.seen() == [("scheduled", "START")] and isinstance(ok, asyncio.Task)
        await ok
        with pytest.raises(KeyError):
            await schedule(True)
        cancelled = schedule(False)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.sleep(0)  # ok: one loop turn: a done future's callbacks (which end its run) run at the next

    asyncio.run(main())
    assert [t for _, t in rec.seen()] == ["START", "COMPLETE", "START", "FAIL", "START", "ABORT"]


def test_a_generator_function_under_a_plain_decorator_spans_its_iteration():
    rec = Recorder()

    @lineage_job("rows", producer=rec)
    @plain_decorator
    def rows(n):
        for i in range(n):
            assert current_run().job_name == "rows"
            yield i

    @lineage_job("stream", producer=rec)
    @plain_decorator
    async def stream():
        yield 1
        raise RuntimeError("stream broke")

    reader = rows(3)
    assert current_run() is None and rec.seen() == [("rows", "START")]
    assert list(reader) == [0, 1, 2]
    assert rec.seen() == [("rows", "START"), ("rows", "COMPLETE")]
    for _ in rows(3):
        break
    assert rec.seen()[2:] == [("rows", "START"), ("rows", "ABORT")]

    async def consume():
        async for _ in stream():
            pass

    with pytest.raises(RuntimeError):
        asyncio.run(consume())
    assert rec.seen()[4:] == [("stream", "START"), ("stream", "FAIL")]
    rows(2)
    gc.collect()
    assert rec.seen()[6:] == [("rows", "START"), ("rows", "ABORT")], "never iterated: ABORT when collected"

    @lineage_job("listing", producer=rec)
    def listing():
        return (i for i in range(2))   # not a generator function: a result, the run ends at the return

    gen = listing()
    assert rec.seen()[8:] == [("listing", "START"), ("listing", "COMPLETE")] and list(gen) == [0, 1]
    rec.validate()
