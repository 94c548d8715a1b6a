"""Lineage for plain Python code: a context manager and a decorator that emit one run.

::

    from producer.job import lineage_job
    from producer.events import dataset

    with lineage_job("nightly.load_orders", inputs=[dataset("s3://raw", "orders")]) as run:
        ...                                   # START was emitted on entry
        run.add_output(dataset("postgres://db:5432", "public.orders"))
    # COMPLETE on normal exit; FAIL (errorMessage facet with the stack trace) if it raised;
    # ABORT if it was stopped (cancelled, closed, Ctrl-C)

    @lineage_job(job_type="JOB", namespace="etl")    # job name: <module>.<qualname>
    def refresh(): ...

Contract:

* Entering emits START, leaving emits COMPLETE, or FAIL when an exception escapes (the
  exception is re-raised, never swallowed), or ABORT (no ``errorMessage``) when what escapes
  stops the run rather than fails it: ``asyncio.CancelledError`` (a cancelled task, a
  ``wait_for``/``asyncio.timeout`` expiring), ``GeneratorExit`` (a generator closed early
  inside its ``with``) and ``KeyboardInterrupt`` (Ctrl-C; see :mod:`producer.job_outcome`).
  Both events carry the same run id (a UUIDv7),
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
  only when a GeneratorExit ends it (the body may catch one and yield on). A callable object
  is classified by its ``__call__``. A function that is not itself ``async def`` but returns
  a coroutine (an ``async def`` under a plain ``functools.wraps`` decorator) has its run
  opened (START) at the call and kept open until the coroutine is awaited to its end, and
  ABORT if it never is (at garbage collection); likewise for a returned asyncio future (until
  done) and for a generator function under such a decorator (the iteration); see
  :mod:`producer.job_spans`.
* The FAIL event's ``errorMessage`` facet is bounded (:data:`MAX_ERROR_MESSAGE_CHARS`, and
  :data:`MAX_STACK_TRACE_CHARS` of the stack trace's tail), so a huge exception message does
  not make the event too large to send; an exception whose ``str()`` raises still gets one.
* The parent run is, in order: the ``parent=`` argument, or the ParentRunFacet given as
  ``run_facets["parent"]`` (its job and run id the parent, its root the root; runs nested in
  this one name that root as theirs; giving both raises ValueError); the enclosing ``lineage_job``
  in the same thread or task (nested runs form a tree, with the outermost as root); the
  producer's configured parent (explicit config, else ``spark.openlineage.parent*`` when
  it was built from Spark conf, else ``OPENLINEAGE_PARENT_ID`` as it was then); the
  ``OPENLINEAGE_PARENT_ID`` / ``OPENLINEAGE_ROOT_PARENT_ID`` environment variables
  (``<namespace>/<job name>/<run id>``, as Airflow's ``lineage_parent_id`` macro renders).
  The root always comes with its parent, from the same place (``root_parent=`` without
  ``parent=`` raises ValueError).
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
  ``parent=``/``root_parent=`` string or tuple, a ``run_id=`` that is not a UUID, a facet or
  dataset JSON cannot carry) still raise, where it is constructed (:mod:`producer.job_args`).
* openlineage-python facet and dataset objects may be given in ``run_facets=``,
  ``job_facets=``, ``inputs=``/``outputs=`` and :meth:`JobRun.add_input`/``add_output``: they
  are converted with its ``Serde.to_dict`` (one ``add_*`` cannot send is logged and left out).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from producer import events
from producer.errors import ConfigError
from producer.event_values import check_encodable, plain
from producer.events import env_parent_id
from producer.job_args import Parent, _job_type_facet, _json_arg, _nominal_time_facet, _parent_arg, _parent_from_facet
from producer.job_outcome import MAX_ERROR_MESSAGE_CHARS, MAX_STACK_TRACE_CHARS, error_facet, terminal_event_type
from producer.job_spans import _current, call_in_run, drive_async_gen, drive_gen, kind
from producer.kafka import LineageProducer

__all__ = ["MAX_ERROR_MESSAGE_CHARS", "MAX_STACK_TRACE_CHARS", "JobRun", "NoLineage", "current_run",
           "default_producer", "lineage_job"]

log = logging.getLogger("producer.job")

F = TypeVar("F", bound=Callable[..., Any])

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
        """Record an input dataset (build it with :func:`producer.events.dataset`, or an
        openlineage-python ``InputDataset``). One that cannot be sent is logged and left out."""
        self._add(self.inputs, ds, "add_input")

    def add_output(self, ds: dict) -> None:
        self._add(self.outputs, ds, "add_output")

    def _add(self, datasets: list[dict], ds: Any, what: str) -> None:
        try:
            ds = plain(ds, what)
            check_encodable(ds, what)
        except ValueError as err:   # lineage must never break the job: this dataset is lost, logged
            log.error("event=lineage_dataset_dropped job=%s detail=%s", self.job_name, err)
            return
        datasets.append(ds)

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


class lineage_job:  # noqa: N801 - used like a function: `with lineage_job(...)`, `@lineage_job(...)`
    """Context manager and decorator that emits START and COMPLETE/FAIL for one run.

    Arguments: ``name`` (job name; a decorator defaults to ``<module>.<qualname>``),
    ``namespace``, ``producer``, ``inputs``/``outputs`` (dataset dicts), ``parent`` and
    ``root_parent`` (``(namespace, name, run_id)`` or ``"ns/name/run_id"``),
    ``nominal_time`` (a datetime or epoch seconds, or a ``(start, end)`` pair),
    ``job_type`` (e.g. ``"JOB"``, or the JobTypeJobFacet fields), ``run_facets`` and
    ``job_facets`` (more facets, standard or custom, dicts or openlineage-python objects; a
    ``run_facets["parent"]`` names the parent and root instead of ``parent=``/``root_parent=``),
    ``run_id`` (default: a new UUIDv7; a string or ``uuid.UUID``). A ``parent=``/``root_parent=``
    or ``run_id=`` that is not one, ``root_parent=`` without ``parent=``, the parent given twice,
    or a facet or dataset JSON cannot carry raises ValueError here.

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
                 job_facets: dict | None = None, run_id: str | uuid.UUID | None = None) -> None:
        self._name = name
        self._namespace = namespace
        self._producer = producer
        self._inputs = list(_json_arg(list(inputs), "inputs"))
        self._outputs = list(_json_arg(list(outputs), "outputs"))
        self._parent = _parent_arg(parent, "parent")
        self._root = _parent_arg(root_parent, "root_parent")
        self._run_facets = dict(_json_arg(dict(run_facets or {}), "run_facets"))
        self._job_facets = dict(_json_arg(dict(job_facets or {}), "job_facets"))
        if self._run_facets.get("parent") is not None:
            # The parent facet given is what the events carry: the run's parent and root (what
            # runs nested in it name as theirs) come from it, before the enclosing run or the
            # configured/environment parent. Given both ways, neither may silently win.
            if self._parent is not None or self._root is not None:
                raise ValueError("give the parent run once: parent=/root_parent= or run_facets['parent'], not both")
            self._parent, self._root = _parent_from_facet(self._run_facets["parent"])
        elif self._root is not None and self._parent is None:
            raise ValueError("root_parent= needs parent= too (the root is the top of the parent run's chain)")
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
            event_type = "ABORT" if abort else terminal_event_type(exc)
            _emit(producer, run, event_type, exc if event_type == "FAIL" else None)
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
            except (ValueError, RuntimeError, TypeError):  # another context's token, or none (detached)
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

    def __call__(self, func: F) -> F:
        qualname = getattr(func, "__qualname__", None) or type(func).__qualname__   # a callable object's class
        name = f"{getattr(func, '__module__', None) or type(func).__module__}.{qualname}"
        made = kind(func)   # see producer.job_spans
        if made == "asyncgen":
            @functools.wraps(func)
            def run_async_gen(*args: Any, **kwargs: Any) -> Any:
                # The generator object made now: arguments are bound (a TypeError raised) at
                # the call, as for the undecorated function; the run starts at the first step.
                return drive_async_gen(self._for_call(name), func(*args, **kwargs))
            return run_async_gen  # type: ignore[return-value]

        if made == "gen":
            @functools.wraps(func)
            def run_gen(*args: Any, **kwargs: Any) -> Any:
                return drive_gen(self._for_call(name), func(*args, **kwargs))   # bound now, as run_async_gen
            return run_gen  # type: ignore[return-value]

        if made == "async":
            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._for_call(name):
                    return await func(*args, **kwargs)
            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            # It may return a coroutine (an async def under another decorator): the run then
            # spans its await (producer.job_spans.call_in_run).
            return call_in_run(self._for_call(name), func, args, kwargs)
        return run  # type: ignore[return-value]


def _emit(producer: Any, run: JobRun, event_type: str, exc: BaseException | None = None) -> None:
    # Building the event can fail (a bad run_id= argument): the job goes on, the event is lost, logged.
    try:
        extra = {"errorMessage": error_facet(exc)} if exc is not None else None
        producer.emit(run.event(event_type, extra))
    except Exception as err:  # noqa: BLE001 - lineage must never break the job
        log.error("event=lineage_event_failed job=%s event_type=%s detail=%s", run.job_name, event_type, err)


def current_run() -> JobRun | None:
    """The innermost active ``lineage_job`` run in this thread/task, if any."""
    return _current.get()
