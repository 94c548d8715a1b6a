"""Lineage for plain Python code: a context manager and a decorator that emit one run.

::

    from producer.job import lineage_job
    from producer.events import dataset

    with lineage_job("nightly.load_orders", inputs=[dataset("s3://raw", "orders")]) as run:
        ...                                   # START was emitted on entry
        run.add_output(dataset("postgres://db:5432", "public.orders"))
    # COMPLETE on normal exit; FAIL (errorMessage facet with the stack trace) if it raised

    @lineage_job(job_type="JOB", namespace="etl")    # job name: <module>.<qualname>
    def refresh(): ...

Contract:

* Entering emits START, leaving emits COMPLETE, or FAIL when an exception escapes (the
  exception is re-raised, never swallowed). Both events carry the same run id (a UUIDv7),
  the job facets, and the inputs/outputs known at that moment; COMPLETE/FAIL also carry
  those added with :meth:`JobRun.add_input` / :meth:`JobRun.add_output`. A ``SystemExit``
  whose status is 0 or None (``sys.exit()``, ``sys.exit(0)``) is a success: COMPLETE.
* Each call of a decorated function (sync or async) is its own run. One ``lineage_job``
  instance may be entered by several threads or tasks at once: each gets its own run.
  ``@lineage_job`` without parentheses is ``@lineage_job()``. A decorated generator or
  async generator function's run spans the iteration: START at the first item asked for,
  COMPLETE when exhausted, FAIL when an exception escapes it, ABORT when the consumer closes
  it early (``break``, ``close()``, garbage collection); the run is current only inside it.
  Its arguments are bound at the call, as undecorated (a missing one raises TypeError there);
  what the consumer throws in, GeneratorExit included, reaches the body as undecorated: ABORT
  only when a GeneratorExit ends it (the body may catch one and yield on).
* The FAIL event's ``errorMessage`` facet is bounded (:data:`MAX_ERROR_MESSAGE_CHARS`, and
  :data:`MAX_STACK_TRACE_CHARS` of the stack trace's tail), so a huge exception message does
  not make the event too large to send; an exception whose ``str()`` raises still gets one.
* The parent run is, in order: the ``parent=`` argument; the enclosing ``lineage_job``
  in the same thread or task (nested runs form a tree, with the outermost as root); the
  producer's configured parent (explicit config, else ``spark.openlineage.parent*`` when
  it was built from Spark conf, else ``OPENLINEAGE_PARENT_ID`` as it was then); the
  ``OPENLINEAGE_PARENT_ID`` / ``OPENLINEAGE_ROOT_PARENT_ID`` environment variables
  (``<namespace>/<job name>/<run id>``, as Airflow's ``lineage_parent_id`` macro renders).
  The root always comes with its parent, from the same place.
* The namespace is ``namespace=``, else the producer's ``namespace`` config
  (``spark.openlineage.namespace`` / ``$OPENLINEAGE_NAMESPACE``), else ``"default"``.
* Lineage never raises into the job. Without a ``producer=``, one process-wide producer
  is built on first use from every configuration source (:func:`producer.config.load_config`)
  and closed at interpreter exit; when it cannot be built (no bootstrap servers, an
  unwritable journal directory, ...) that is logged once, as a warning with the fix, and
  the job runs without lineage (the failure is cached: config is not read again); with
  ``OPENLINEAGE_DISABLED=true`` it is a :class:`producer.disabled.DisabledProducer`, which
  sends nothing. A malformed ``OPENLINEAGE_PARENT_ID`` is logged and ignored; an event
  that cannot be built or emitted is logged and skipped. Mistakes in ``lineage_job``'s own arguments (a bad
  ``parent=``/``root_parent=`` string or tuple, a ``run_id=`` that is not a UUID) still raise, where
  it is constructed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import struct
import threading
import traceback
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from producer import events
from producer.errors import ConfigError
from producer.events import env_parent_id, parse_parent_id
from producer.kafka import LineageProducer

log = logging.getLogger("producer.job")

F = TypeVar("F", bound=Callable[..., Any])
Parent = tuple[str, str, str]

_current: contextvars.ContextVar[JobRun | None] = contextvars.ContextVar("lineage_job_run", default=None)
_default_lock = threading.Lock()
_default: LineageProducer | NoLineage | None = None


def _new_default_lock() -> None:
    # A fork while another thread builds the default producer (reading the configuration
    # sources, probing the resolver for up to 1 s) would leave the child's lock held by a
    # thread it does not have: the child's first lineage_job would wait for ever. The child
    # builds its own, if need be.
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_default_lock)


class NoLineage:
    """What :func:`default_producer` returns when no producer could be built: it drops
    every event, so the job runs unobserved instead of failing."""

    config = None

    def emit(self, event: dict) -> None:
        pass

    def flush(self, timeout_s: float | None = None) -> int:
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        pass


def default_producer() -> LineageProducer | NoLineage:
    """The process-wide producer used when ``producer=`` is not given, built once. If it
    cannot be built, the reason is logged once and a :class:`NoLineage` is kept instead."""
    global _default
    with _default_lock:
        if _default is None:
            try:
                _default = LineageProducer()
            except Exception as err:  # noqa: BLE001 - lineage must never break the job
                # A ConfigError's text names keys, never values; any other error's text could
                # quote a configuration value (a password), so only its type is logged.
                reason = (" ".join(str(err).split()) if isinstance(err, ConfigError)
                          else f"{type(err).__name__} while building the producer")
                log.warning("event=lineage_disabled reason=%s fix=configure the producer (bootstrap servers "
                            "in openlineage.yml, OPENLINEAGE__TRANSPORT__* or Spark conf; a writable journal "
                            "dir) or pass producer= to lineage_job; the job runs without lineage", reason)
                _default = NoLineage()
        return _default


class JobRun:
    """One run of a job: what ``with lineage_job(...) as run`` gives you."""

    def __init__(self, *, job_namespace: str, job_name: str, run_id: str,
                 parent: Parent | None, root: Parent | None, inputs: list[dict], outputs: list[dict],
                 run_facets: dict, job_facets: dict) -> None:
        self.job_namespace = job_namespace
        self.job_name = job_name
        self.run_id = run_id
        self.parent = parent
        self.root = root
        self.inputs = inputs
        self.outputs = outputs
        self.run_facets = run_facets
        self.job_facets = job_facets
        # Set by lineage_job on entry. The exit ends the innermost open run its instance owns
        # along this chain (see lineage_job.__exit__), whatever other threads do with it.
        self._owner: lineage_job | None = None
        self._outer: JobRun | None = None       # the context's current run at entry
        self._token: contextvars.Token | None = None

    def add_input(self, ds: dict) -> None:
        """Record an input dataset (build it with :func:`producer.events.dataset`)."""
        self.inputs.append(ds)

    def add_output(self, ds: dict) -> None:
        self.outputs.append(ds)

    @property
    def as_parent(self) -> Parent:
        return (self.job_namespace, self.job_name, self.run_id)

    def event(self, event_type: str, extra_run_facets: dict | None = None) -> dict:
        """This run's event of ``event_type`` (START, RUNNING, COMPLETE, FAIL, ...)."""
        return events.run_event(
            event_type, run_id=self.run_id, job_namespace=self.job_namespace, job_name=self.job_name,
            inputs=list(self.inputs), outputs=list(self.outputs),
            run_facets={**self.run_facets, **(extra_run_facets or {})}, job_facets=dict(self.job_facets),
        )


def _job_type_facet(job_type: str | dict) -> dict:
    fields = ({"processingType": "BATCH", "integration": "PYTHON", "jobType": job_type}
              if isinstance(job_type, str) else dict(job_type))
    return events.facet("JobTypeJobFacet", fields)


def _nominal_time_facet(nominal: datetime | float | tuple) -> dict:
    start, end = nominal if isinstance(nominal, tuple) else (nominal, None)
    fields = {"nominalStartTime": events.iso(start)}
    if end is not None:
        fields["nominalEndTime"] = events.iso(end)
    return events.facet("NominalTimeRunFacet", fields)


#: Bounds of the FAIL event's ErrorMessageRunFacet, in characters (a character may take up to
#: 6 bytes in JSON): a huge exception message (a whole payload in a ValueError) must not make
#: the FAIL event too large for Kafka (``message.max.bytes``, 1 MB by default) and lose it.
MAX_ERROR_MESSAGE_CHARS = 4_096
MAX_STACK_TRACE_CHARS = 32_768


def _safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what ``traceback`` prints when that raises (a broken ``__str__``)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - lineage must never break the job
        return "<exception str() failed>"


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _stack_trace(exc: BaseException) -> str:
    """The formatted traceback, each part (a frame, an exception's message) at most
    :data:`MAX_ERROR_MESSAGE_CHARS`, and at most :data:`MAX_STACK_TRACE_CHARS` in all: its
    tail, where the innermost frames and the exception are."""
    try:
        parts = traceback.format_exception(exc)
    except Exception:  # noqa: BLE001 - a traceback that cannot be formatted costs the stack only
        return ""
    text = "".join(_head(part, MAX_ERROR_MESSAGE_CHARS) for part in parts)
    if len(text) <= MAX_STACK_TRACE_CHARS:
        return text
    marker = f"[... {len(text) - MAX_STACK_TRACE_CHARS} characters of the stack trace left out]\n"
    return marker + text[len(text) - MAX_STACK_TRACE_CHARS:]


def _error_facet(exc: BaseException) -> dict:
    return events.facet("ErrorMessageRunFacet", {
        "message": _head(f"{type(exc).__name__}: {_safe_str(exc)}", MAX_ERROR_MESSAGE_CHARS),
        "programmingLanguage": "python",
        "stackTrace": _stack_trace(exc),
    })


def _parent_arg(value: Parent | str | None, what: str) -> Parent | None:
    """A ``parent=`` / ``root_parent=`` argument as ``(namespace, name, run_id)``, the run id in
    canonical form; raises ValueError (construction-time misuse) when it is not one."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_parent_id(value)
    if isinstance(value, (tuple, list)) and len(value) == 3:
        namespace, name, run_id = value
        if isinstance(namespace, str) and namespace and isinstance(name, str) and name:
            return namespace, name, events.check_run_id(run_id, f"{what} run id")
    raise ValueError(f"{what} must be (namespace, job name, run id) or \"<namespace>/<job name>/<run id>\", "
                     f"got {value!r}")


class lineage_job:  # noqa: N801 - used like a function: `with lineage_job(...)`, `@lineage_job(...)`
    """Context manager and decorator that emits START and COMPLETE/FAIL for one run.

    Arguments: ``name`` (job name; a decorator defaults to ``<module>.<qualname>``),
    ``namespace``, ``producer``, ``inputs``/``outputs`` (dataset dicts), ``parent`` and
    ``root_parent`` (``(namespace, name, run_id)`` or ``"ns/name/run_id"``),
    ``nominal_time`` (a datetime or epoch seconds, or a ``(start, end)`` pair),
    ``job_type`` (e.g. ``"JOB"``, or the JobTypeJobFacet fields), ``run_facets`` and
    ``job_facets`` (more facets, standard or custom), ``run_id`` (default: a new UUIDv7).
    A ``parent=``/``root_parent=`` or ``run_id=`` that is not one raises ValueError here.

    ``@lineage_job`` without parentheses is ``@lineage_job()``. A decorated generator (or
    async generator) function's run spans its iteration: START when the first item is asked
    for, COMPLETE when it is exhausted, FAIL when an exception escapes it, and ABORT when the
    consumer closes it before the end (``break`` out of a ``for``, ``close()``, garbage
    collection): the run stopped before its work was done, without an error (a GeneratorExit
    thrown in and caught by the body, which yields on, ends nothing, as undecorated). The
    arguments are bound when it is called (a TypeError raised then), as undecorated; a
    generator never iterated makes no run. Between items the run is current only inside the generator,
    never in the code consuming it.
    """

    def __new__(cls, name: str | Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if callable(name) and not isinstance(name, str) and not args and not kwargs:
            return cls()(name)   # @lineage_job without parentheses
        return super().__new__(cls)

    def __init__(self, name: str | None = None, *, namespace: str | None = None,
                 producer: LineageProducer | None = None, inputs: Iterable[dict] = (),
                 outputs: Iterable[dict] = (), parent: Parent | str | None = None,
                 root_parent: Parent | str | None = None,
                 nominal_time: datetime | float | tuple | None = None,
                 job_type: str | dict | None = None, run_facets: dict | None = None,
                 job_facets: dict | None = None, run_id: str | None = None) -> None:
        self._name = name
        self._namespace = namespace
        self._producer = producer
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._parent = _parent_arg(parent, "parent")
        self._root = _parent_arg(root_parent, "root_parent")
        self._run_facets = dict(run_facets or {})
        self._job_facets = dict(job_facets or {})
        if nominal_time is not None:
            self._run_facets.setdefault("nominalTime", _nominal_time_facet(nominal_time))
        if job_type is not None:
            self._job_facets.setdefault("jobType", _job_type_facet(job_type))
        self._run_id = None if run_id is None else events.check_run_id(run_id)
        self._open_lock = threading.Lock()
        self._open: list[JobRun] = []   # this instance's runs entered and not yet exited

    # --- context manager -----------------------------------------------------------

    def __enter__(self) -> JobRun:
        if self._name is None:
            raise ValueError("lineage_job needs a job name when used as a context manager")
        producer = self._producer or default_producer()
        config = getattr(producer, "config", None)
        try:
            parent, root = self._lineage(config)
            run_facets = dict(self._run_facets)
            if parent is not None and "parent" not in run_facets:
                run_facets["parent"] = events.parent_facet(*parent, root=root)
        except Exception as err:  # noqa: BLE001 - lineage must never break the job
            log.error("event=lineage_parent_failed job=%s detail=%s; the run has no parent facet", self._name, err)
            parent = root = None
            run_facets = dict(self._run_facets)
        run = JobRun(job_namespace=self._namespace or getattr(config, "namespace", None) or "default",
                     job_name=self._name, run_id=self._run_id or events.new_run_id(),
                     parent=parent, root=root, inputs=list(self._inputs), outputs=list(self._outputs),
                     run_facets=run_facets, job_facets=dict(self._job_facets))
        _emit(producer, run, "START")
        run._owner, run._outer = self, _current.get()
        with self._open_lock:
            self._open.append(run)
        run._token = _current.set(run)
        return run

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None, *, abort: bool = False) -> None:
        """End this instance's run (see :meth:`_end_one_run`): ABORT if ``abort``, else
        COMPLETE or FAIL as ``exc`` says. Never raises."""
        try:
            run = self._end_one_run()
            if run is None:
                log.error("event=lineage_job_exit_without_entry job=%s detail=no open run of this lineage_job; "
                          "nothing emitted", self._name)
                return
            producer = self._producer or default_producer()
            if abort:
                _emit(producer, run, "ABORT")
            elif exc is None or (isinstance(exc, SystemExit) and _exit_succeeds(exc.code)):
                # sys.exit(0) / sys.exit() (click and other CLIs end a successful command so) is
                # a success for the process and its scheduler, as the Spark capture reads it too.
                _emit(producer, run, "COMPLETE")
            else:
                _emit(producer, run, "FAIL", exc)
        except Exception as err:  # noqa: BLE001 - lineage must never break the job
            log.error("event=lineage_job_exit_failed job=%s detail=%r", self._name, err)

    def _end_one_run(self) -> JobRun | None:
        """Claim the run this exit ends and restore the context's current run.

        The innermost run *this instance* owns along the context's chain of runs: not simply
        the context's innermost run, which may belong to another lineage_job (a generator
        paused inside its own ``with inner:`` when ``with outer:`` exits), and not state on
        the instance alone, which threads or tasks sharing one instance would mix up."""
        current = _current.get()
        run = current
        while run is not None and not (run._owner is self and self._claim(run)):
            run = run._outer
        if run is None:
            # Entered in another context (a task's enter and exit in different tasks, as
            # pytest-asyncio runs a fixture's setup and teardown): end this instance's most
            # recent open run rather than emit nothing.
            with self._open_lock:
                run = self._open.pop() if self._open else None
            if run is None:
                return None
        if run is current:
            try:
                _current.reset(run._token)
            except (ValueError, RuntimeError):  # the token belongs to another context
                _current.set(run._outer)
        # Never leave an ended run current (an outer one ended while this one was open).
        restored = _current.get()
        while restored is not None and restored._owner is not None and restored._owner._is_ended(restored):
            restored = restored._outer
        if restored is not _current.get():
            _current.set(restored)
        run._token = None
        return run

    def _claim(self, run: JobRun) -> bool:
        with self._open_lock:
            try:
                self._open.remove(run)
            except ValueError:   # already ended (by another thread or an earlier exit)
                return False
            return True

    def _is_ended(self, run: JobRun) -> bool:
        with self._open_lock:
            return run not in self._open

    def _lineage(self, config: Any) -> tuple[Parent | None, Parent | None]:
        if self._parent is not None:
            return self._parent, self._root
        outer = _current.get()
        if outer is not None:
            # Root = top of the chain: the outer run's root, its parent, or the outer run itself.
            return outer.as_parent, outer.root or outer.parent or outer.as_parent
        if getattr(config, "parent", None) is not None:
            return config.parent, config.root_parent
        env_parent = env_parent_id("OPENLINEAGE_PARENT_ID")
        if env_parent is not None:
            return env_parent, env_parent_id("OPENLINEAGE_ROOT_PARENT_ID")
        return None, None

    # --- decorator -----------------------------------------------------------------

    def _for_call(self, name: str) -> lineage_job:
        clone = lineage_job.__new__(lineage_job)
        clone.__dict__.update(self.__dict__)
        clone._name = self._name or name
        clone._open_lock, clone._open = threading.Lock(), []
        clone._inputs, clone._outputs = list(self._inputs), list(self._outputs)
        return clone

    def _drive_gen(self, gen: Any, name: str) -> Any:
        """A decorated generator: the run spans ``gen``'s iteration (START at the first step,
        COMPLETE at exhaustion, FAIL on an exception, ABORT when it ends on a GeneratorExit).
        Everything the consumer sends or throws is forwarded, GeneratorExit included: a body
        that catches a thrown GeneratorExit and yields goes on, as it would undecorated (and
        ``close()`` then raises RuntimeError, as it would undecorated); ABORT only when the
        GeneratorExit propagates out of the body or the body returns straight from it (as
        at a ``break``); a body that yields on ends as it ends later."""
        job, view = self._for_call(name), _BodyView()
        with view:
            job.__enter__()
        value: Any = None
        thrown: BaseException | None = None
        while True:
            with view:
                try:
                    item = gen.throw(thrown) if thrown is not None else gen.send(value)
                except StopIteration as stop:
                    _end_of_body(job, thrown, None)
                    return stop.value
                except BaseException as exc:
                    _end_of_body(job, thrown, exc)
                    raise
            try:
                value, thrown = (yield item), None
            except BaseException as exc:
                value, thrown = None, exc

    async def _drive_async_gen(self, agen: Any, name: str) -> Any:
        """:meth:`_drive_gen` for a decorated async generator (``asend``/``athrow``; ``aclose()``
        is a GeneratorExit thrown in)."""
        job, view = self._for_call(name), _BodyView()
        with view:
            job.__enter__()
        value: Any = None
        thrown: BaseException | None = None
        while True:
            with view:
                try:
                    item = await (agen.athrow(thrown) if thrown is not None else agen.asend(value))
                except StopAsyncIteration:
                    _end_of_body(job, thrown, None)
                    return
                except BaseException as exc:
                    _end_of_body(job, thrown, exc)
                    raise
            try:
                value, thrown = (yield item), None
            except BaseException as exc:
                value, thrown = None, exc

    def __call__(self, func: F) -> F:
        name = f"{func.__module__}.{func.__qualname__}"
        if inspect.isasyncgenfunction(func):
            @functools.wraps(func)
            def run_async_gen(*args: Any, **kwargs: Any) -> Any:
                # The generator object made now: arguments are bound (a TypeError raised) at
                # the call, as for the undecorated function; the run starts at the first step.
                return self._drive_async_gen(func(*args, **kwargs), name)
            return run_async_gen  # type: ignore[return-value]

        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def run_gen(*args: Any, **kwargs: Any) -> Any:
                return self._drive_gen(func(*args, **kwargs), name)   # bound now, as run_async_gen
            return run_gen  # type: ignore[return-value]

        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._for_call(name):
                    return await func(*args, **kwargs)
            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self._for_call(name):
                return func(*args, **kwargs)
        return run  # type: ignore[return-value]


class _BodyView:
    """The current run as a decorated generator's body sees it, swapped in while the body
    runs and out while it is paused: the consuming code never sees the generator's run (or
    one the body left open across a ``yield``) as its own current run."""

    def __init__(self) -> None:
        self._body: JobRun | None = None
        self._saved: list[JobRun | None] = []
        self._started = False

    def __enter__(self) -> None:
        self._saved.append(_current.get())
        if self._started:
            _current.set(self._body)
        self._started = True   # first step: the body starts from the consumer's current run

    def __exit__(self, *exc: object) -> None:
        self._body = _current.get()
        _current.set(self._saved.pop())


def _emit(producer: Any, run: JobRun, event_type: str, exc: BaseException | None = None) -> None:
    # Building the event can fail (a bad run_id= argument): the job goes on, the event is lost, logged.
    try:
        extra = {"errorMessage": _error_facet(exc)} if exc is not None else None
        producer.emit(run.event(event_type, extra))
    except Exception as err:  # noqa: BLE001 - lineage must never break the job
        log.error("event=lineage_event_failed job=%s event_type=%s detail=%s", run.job_name, event_type, err)


#: CPython exits with ``(int)PyLong_AsLong(code)``: a C long, then the OS keeps the low byte
#: (POSIX) or 32 bits (Windows) of the status; an int out of a long's range exits with -1.
_LONG_BITS = 8 * struct.calcsize("l")
_STATUS_MASK = 0xFFFFFFFF if os.name == "nt" else 0xFF


def _exit_succeeds(status: object) -> bool:
    """Whether ``SystemExit(status)`` ends the process with exit status 0, as CPython decides:
    None, or an int (bool included) whose status bits are 0 (0, False, 256 on POSIX).
    Anything else (a message, 0.0, "0") is printed and exits with 1."""
    if status is None:
        return True
    if not isinstance(status, int):
        return False
    value = int.__index__(status)   # the int's own value, as C reads it (a subclass's __eq__ aside)
    return -(1 << (_LONG_BITS - 1)) <= value < (1 << (_LONG_BITS - 1)) and value & _STATUS_MASK == 0


def current_run() -> JobRun | None:
    """The innermost active ``lineage_job`` run in this thread/task, if any."""
    return _current.get()


def _end_of_body(job: Any, thrown: BaseException | None, exc: BaseException | None) -> None:
    """The run's end when a step of a decorated generator's body ended it: it returned
    (``exc`` None): COMPLETE, or ABORT when it returned straight from a GeneratorExit thrown
    in; that GeneratorExit came back out: ABORT; any other exception: FAIL."""
    if exc is None:
        job._finish(None, abort=isinstance(thrown, GeneratorExit))
    elif isinstance(exc, GeneratorExit) and isinstance(thrown, GeneratorExit):
        job._finish(None, abort=True)
    else:
        job._finish(exc)
