"""What a ``@lineage_job``-decorated callable's run spans, and the context's current run.

* A generator (async generator) function's run spans the iteration (:func:`drive_gen`,
  :func:`drive_async_gen`); a coroutine function's, the await.
* What is decorated is classified by :func:`kind`: the callable itself, or the ``__call__`` of
  a callable object (``async def __call__``). A function under another decorator (a plain
  ``functools.wraps`` wrapper around an ``async def``) is not known to be async before it
  returns: :func:`call_in_run` opens the run (START) at the call, and when the call returns
  a coroutine keeps it open until that coroutine is awaited to its end (COMPLETE, FAIL, or
  ABORT when cancelled or closed), when it returns an asyncio future until the future is done,
  and, when the wrapped function is a generator (async generator) function, for the
  iteration. Such a coroutine or generator that is never started ends its run with ABORT when
  it is garbage collected. Anything else returned ends the run at the return.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.job import JobRun, lineage_job

_current: contextvars.ContextVar[JobRun | None] = contextvars.ContextVar("lineage_job_run", default=None)


def kind(func: Any) -> str:
    """``"asyncgen"``, ``"gen"``, ``"async"`` or ``"sync"``: what calling ``func`` makes, as
    declared by the function itself or by a callable object's ``__call__``."""
    targets = [func]
    if not (inspect.isroutine(func) or isinstance(func, (type, functools.partial))):
        targets.append(getattr(type(func), "__call__", None))
    for target in targets:
        if inspect.isasyncgenfunction(target):
            return "asyncgen"
        if inspect.isgeneratorfunction(target):
            return "gen"
        if inspect.iscoroutinefunction(target):
            return "async"
    return "sync"


class _BodyView:
    """The current run as a decorated generator's body sees it, swapped in while the body
    runs and out while it is paused: the consuming code never sees the generator's run (or
    one the body left open across a ``yield``) as its own current run."""

    def __init__(self, body: JobRun | None = None) -> None:
        self._body = body
        self._saved: list[JobRun | None] = []
        self._started = body is not None   # given a run: the body runs in it from the first step

    def __enter__(self) -> None:
        self._saved.append(_current.get())
        if self._started:
            _current.set(self._body)
        self._started = True   # first step: the body starts from the consumer's current run

    def __exit__(self, *exc: object) -> None:
        self._body = _current.get()
        _current.set(self._saved.pop())


class _Started:
    """Whether the coroutine or generator spanning an already opened run has been started."""

    __slots__ = ("job", "run", "started")

    def __init__(self, job: lineage_job, run: JobRun) -> None:
        self.job, self.run, self.started = job, run, False


def _abort_if_never_started(state: _Started) -> None:
    # Garbage collected unstarted: nothing else will end the run. (Started, it was closed
    # first, which ends it: a GeneratorExit.)
    if not state.started and not state.job._is_ended(state.run):
        state.job._finish(None, abort=True)


def _watch(obj: Any, state: _Started) -> Any:
    weakref.finalize(obj, _abort_if_never_started, state)
    return obj


def drive_gen(job: lineage_job, gen: Any, state: _Started | None = None) -> Any:
    """A decorated generator: the run spans ``gen``'s iteration (START at the first step,
    COMPLETE at exhaustion, FAIL on an exception, ABORT when it ends on a GeneratorExit).
    Everything the consumer sends or throws is forwarded, GeneratorExit included: a body
    that catches a thrown GeneratorExit and yields goes on, as it would undecorated (and
    ``close()`` then raises RuntimeError, as it would undecorated); ABORT only when the
    GeneratorExit propagates out of the body or the body returns straight from it (as
    at a ``break``); a body that yields on ends as it ends later. With ``state``, the run
    was opened at the call (:func:`call_in_run`)."""
    if state is None:
        view = _BodyView()
        with view:
            job.__enter__()
    else:
        state.started, view = True, _BodyView(state.run)
    value: Any = None
    thrown: BaseException | None = None
    while True:
        with view:
            try:
                item = gen.throw(thrown) if thrown is not None else gen.send(value)
            except StopIteration as stop:
                end_of_body(job, thrown, None)
                return stop.value
            except BaseException as exc:
                end_of_body(job, thrown, exc)
                raise
        try:
            value, thrown = (yield item), None
        except BaseException as exc:
            value, thrown = None, exc


async def drive_async_gen(job: lineage_job, agen: Any, state: _Started | None = None) -> Any:
    """:func:`drive_gen` for a decorated async generator (``asend``/``athrow``; ``aclose()``
    is a GeneratorExit thrown in)."""
    if state is None:
        view = _BodyView()
        with view:
            job.__enter__()
    else:
        state.started, view = True, _BodyView(state.run)
    value: Any = None
    thrown: BaseException | None = None
    while True:
        with view:
            try:
                item = await (agen.athrow(thrown) if thrown is not None else agen.asend(value))
            except StopAsyncIteration:
                end_of_body(job, thrown, None)
                return
            except BaseException as exc:
                end_of_body(job, thrown, exc)
                raise
        try:
            value, thrown = (yield item), None
        except BaseException as exc:
            value, thrown = None, exc


def end_of_body(job: lineage_job, thrown: BaseException | None, exc: BaseException | None) -> None:
    """The run's end when a step of a decorated generator's body ended it: it returned
    (``exc`` None): COMPLETE, or ABORT when it returned straight from a GeneratorExit thrown
    in; that GeneratorExit came back out: ABORT; any other exception: as it says."""
    if exc is None:
        job._finish(None, abort=isinstance(thrown, GeneratorExit))
    elif isinstance(exc, GeneratorExit) and isinstance(thrown, GeneratorExit):
        job._finish(None, abort=True)
    else:
        job._finish(exc)


async def _await_in_run(job: lineage_job, coro: Any, state: _Started) -> Any:
    state.started = True
    state.run._token = _current.set(state.run)   # current while awaited: nested runs are its children
    try:
        result = await coro
    except BaseException as exc:
        job._finish(exc)
        raise
    job._finish(None)
    return result


def _future_done(job: lineage_job, future: Any) -> None:
    if future.cancelled():
        job._finish(None, abort=True)
    else:
        job._finish(future.exception())


def _detach(run: JobRun) -> None:
    """Make ``run`` (still open) no longer the caller's current run."""
    if _current.get() is run:
        try:
            _current.reset(run._token)
        except (ValueError, RuntimeError):
            _current.set(run._outer)
    run._token = None


def call_in_run(job: lineage_job, func: Any, args: tuple, kwargs: dict) -> Any:
    """A sync callable's call in its run (see the module's docstring)."""
    run = job.__enter__()
    try:
        result = func(*args, **kwargs)
    except BaseException as exc:
        job._finish(exc)
        raise
    try:
        if inspect.iscoroutine(result):
            _detach(run)
            state = _Started(job, run)
            return _watch(_await_in_run(job, result, state), state)
        aio = sys.modules.get("asyncio")   # not imported: nothing returned an asyncio future
        if aio is not None and aio.isfuture(result) and not result.done():
            _detach(run)
            result.add_done_callback(functools.partial(_future_done, job))
            return result
        declared = kind(inspect.unwrap(func)) if inspect.isgenerator(result) or inspect.isasyncgen(result) else None
        if declared == "gen" and inspect.isgenerator(result):
            _detach(run)
            state = _Started(job, run)
            return _watch(drive_gen(job, result, state), state)
        if declared == "asyncgen" and inspect.isasyncgen(result):
            _detach(run)
            state = _Started(job, run)
            return _watch(drive_async_gen(job, result, state), state)
    except Exception:  # noqa: BLE001 - lineage must never break the job: end the run now
        if not job._is_ended(run):
            job._finish(None)
        return result
    job._finish(None)
    return result
