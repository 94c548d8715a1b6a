"""The runtime: the application run's lifecycle, and each action's run as the py4j
``QueryExecutionListener`` (:mod:`producer.spark.execution_listener`) hands it over.

Guarantees:

* Nothing here raises into the job. Every callback is wrapped; a failure to capture becomes
  a log line (and, when the run itself can still be reported, an ``extractionError`` facet).
* Spark calls the listener on its listener-bus thread, after the action: the job's own
  thread never waits for lineage work. Emission is :meth:`LineageProducer.emit` (queue only).
* Event order per run: START before COMPLETE/FAIL, and every action's events before the
  application's COMPLETE (``SparkContext.stop`` drains the listener bus before we emit it, and
  so does :meth:`SparkLineage.end`, up to 10 s). An action whose callback finishes after that
  (or after capture stopped) is dropped: one debug line, counted in ``late_actions``.
* One application run per session, START once and COMPLETE/FAIL once (at
  ``SparkContext.stop`` or exit), whether capture is on at that moment or not: switching
  capture off (:meth:`SparkLineage.stop_capture`) and on again (:meth:`SparkLineage.resume`)
  keeps the run open and its runId, so the actions captured after it are its children too.
* A streaming micro-batch's own execution (an ``IncrementalExecution``, or an analysed root
  ``WriteToDataSourceV2`` / ``WriteToMicroBatchDataSource*``: a V2 sink's ``nextBatch.collect()``)
  is never a batch run: its streaming run reports it. Telling it costs no py4j call without
  read-only actions, one with them. What a ``foreachBatch`` function runs is a batch action.
* Streaming queries are listened to beside it (:mod:`producer.spark.streaming`); a session
  where that cannot be done keeps its batch capture.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import traceback
from typing import Any
from urllib.parse import unquote, urlsplit

from producer import events
from producer.spark import capture, details, jvm, plain_reads, session_listeners
from producer.spark.capture import CaptureSettings
from producer.spark.driver_exit import DriverExit
from producer.spark.streaming import StreamingLineage

log = logging.getLogger("producer.spark")

Parent = tuple[str, str, str]
# QueryExecutionListener function names of actions that write data.
_WRITE_FUNCS = frozenset({"save", "insertInto", "saveAsTable", "command", "saveAsTextFile"})
# A DataSourceV2 CTAS/RTAS runs its write as a nested action of this name, then itself.
_CTAS_INNER_WRITE = "inner data writing for CTAS/RTAS"


class SparkLineage:
    """Lineage capture for one SparkSession; build it with :func:`producer.spark.enable_lineage`."""

    def __init__(self, spark: Any, sender: Any, settings: CaptureSettings, *, parent: Parent | None = None,
                 root: Parent | None = None, read_only_actions: bool = False,
                 max_plan_bytes: int = 32 * 1024 * 1024) -> None:
        self.spark = spark
        self.sender = sender
        self.settings = settings
        self.parent, self.root = parent, root
        self.read_only_actions = read_only_actions
        self.max_plan_bytes = max_plan_bytes
        self.app_run_id = events.new_run_id()
        self.actions_captured = 0
        self.capture_errors = 0
        self.late_actions = 0   # finished once the application's end was emitted, or capture stopped
        self._lock = threading.Lock()  # _ended, _closed, _listeners, and the emission of an action's events
        self._ended = False    # end() began: it drains the bus, then closes
        self._closed = False   # the application's terminal is being emitted: no action's event after it
        self._nested_writes: dict[str, dict[str, int]] = {}
        self._listeners: session_listeners.SessionListeners | None = None   # None: capture is off
        self._streaming: StreamingLineage | None = None
        self._driver_exit = DriverExit()
        self._orig_stop = None
        self._app_details: dict | None = None  # spark_applicationDetails, read once per application run
        self._jobs: details.JobReader | None = None

    @property
    def ended(self) -> bool:
        return self._ended

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def capturing(self) -> bool:
        """Whether the listeners are registered (False after :meth:`stop_capture`)."""
        return self._listeners is not None

    @property
    def identity(self) -> tuple:
        """What names the application run: a capture enabled again with the same identity
        continues it (see :meth:`resume`)."""
        return self.settings.namespace, self.settings.app_job_name, self.parent, self.root

    def start(self) -> SparkLineage:
        """Register the listeners and start the application run (START); its end (COMPLETE
        or FAIL) comes at ``SparkContext.stop`` or exit, captured or not at that moment."""
        self._attach()
        self._app_details = self._read_app_details()
        self._emit_app("START")
        # The application ends at SparkContext.stop (SparkSession.stop calls it) or at exit.
        sc = self.spark.sparkContext
        orig_stop = self._orig_stop = sc.stop

        def stop(*args: Any, **kwargs: Any) -> Any:
            try:
                return orig_stop(*args, **kwargs)
            finally:
                self.end()
        sc.stop = stop
        self._driver_exit.watch()
        atexit.register(self._at_exit)
        return self

    def resume(self, sender: Any, settings: CaptureSettings, *, read_only_actions: bool,
               max_plan_bytes: int) -> SparkLineage:
        """Capture again after :meth:`stop_capture`, in the same application run: same runId,
        no second START. Raises when the listeners cannot be registered (then nothing is).

        Spark's listener bus hands an event to the listeners registered when it delivers it,
        not when it was posted: the bus is drained first (up to 10 s), so that actions run
        while capture was off, still queued on a busy bus, are not reported."""
        self.sender, self.settings = sender, settings
        self.read_only_actions, self.max_plan_bytes = read_only_actions, max_plan_bytes
        self.drain()
        try:
            self._attach()
        except BaseException:
            self.stop_capture()
            raise
        return self

    def _attach(self) -> None:
        from pyspark.java_gateway import ensure_callback_server_started

        gateway = self.spark.sparkContext._gateway
        ensure_callback_server_started(gateway)
        listeners = session_listeners.of_session(self.spark)
        with self._lock:
            self._listeners = listeners
        listeners.attach_actions(self, self.spark._jsparkSession)
        self._streaming = StreamingLineage.attach(self, listeners)

    def stop_capture(self) -> None:
        """Unregister the listeners (their py4j objects stay, idle, for the session's life: see
        :mod:`producer.spark.session_listeners`); open streaming runs end in ABORT. The
        application run stays open: :meth:`resume` continues it, and it still ends at stop or exit."""
        with self._lock:
            listeners, self._listeners = self._listeners, None
        if listeners is not None:
            try:
                jsession = self.spark._jsparkSession
            except Exception:  # noqa: BLE001 - detached all the same
                jsession = None
            listeners.detach_actions(self, jsession)
        streaming, self._streaming = self._streaming, None
        if streaming is not None:
            streaming.detach()

    def release(self) -> None:
        """Stop capturing and undo the stop and exit hooks, with no application event (a
        start that failed; the application's end)."""
        self.stop_capture()
        if self._orig_stop is not None:
            self._orig_stop = None
            try:
                del self.spark.sparkContext.stop
            except AttributeError:
                pass
        self._driver_exit.unwatch()
        atexit.unregister(self._at_exit)

    def end(self, error: BaseException | None = None) -> None:
        """Emit the application's COMPLETE (or FAIL with ``error``), once."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        try:
            self.drain()
            if self._streaming is not None:
                self._streaming.abort_open()
            with self._lock:   # an action's events are emitted under it: none after the terminal
                self._closed = True
            if error is None:
                self._emit_app("COMPLETE")
            else:
                stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
                self._emit_app("FAIL", capture.error_facet(f"{type(error).__name__}: {error}", stack, "PYTHON"))
        finally:
            self.release()

    def drain(self, timeout_ms: int = 10_000) -> None:
        """Let Spark's listener bus deliver the last actions' callbacks, so their runs are
        emitted before the application's end (a no-op once the context is stopped, since
        ``SparkContext.stop`` drains it itself)."""
        try:
            sc = self.spark.sparkContext
            if sc._jsc is not None and not sc._jsc.sc().isStopped():
                sc._jsc.sc().listenerBus().waitUntilEmpty(timeout_ms)
        except Exception as err:  # noqa: BLE001 - best effort at shutdown
            log.debug("lineage: could not drain the listener bus: %s", err)

    def _at_exit(self) -> None:
        try:
            self.end(self._driver_exit.failure)
        except Exception:  # noqa: BLE001 - never raise at interpreter exit
            log.exception("lineage: could not emit the application's end")

    # -- events -------------------------------------------------------------------------
    def _read_app_details(self) -> dict | None:
        try:
            return details.application_facet(details.read_application(self.spark.sparkContext))
        except Exception as err:  # noqa: BLE001 - a nicety: the run is reported without it
            log.warning("lineage: could not read the Spark application's details: %s", err)
            return None

    def _start_facets(self) -> dict:
        """What a START carries besides its run's own facets (as the official integration:
        the application's details, on the application's START and each action's)."""
        return {"spark_applicationDetails": self._app_details} if self._app_details else {}

    def _action_job(self, gateway: Any, qe: Any, query_id: str | None = None) -> dict:
        """The ``spark_jobDetails`` facet of the action ``qe`` (nothing when not known);
        ``query_id``: its ``queryId``, when already read."""
        if self._jobs is None:
            self._jobs = details.JobReader(gateway, self.spark._jsparkSession)
        read = self._jobs.read(qe, query_id)
        job = details.job_of(*read) if read is not None else None
        return {"spark_jobDetails": details.job_facet(job)} if job is not None else {}

    def _app_parent_facets(self) -> dict:
        if self.parent is None:
            return {}
        root = self.root if self.root is not None else None
        return {"parent": events.parent_facet(*self.parent, root=root)}

    def _emit_app(self, event_type: str, extra: dict | None = None) -> None:
        run_facets = {**self._app_parent_facets(), **capture.engine_facets(self.settings), **(extra or {})}
        if event_type == "START":
            run_facets.update(self._start_facets())
        self.sender.emit(events.run_event(
            event_type, run_id=self.app_run_id, job_namespace=self.settings.namespace,
            job_name=self.settings.app_job_name, run_facets=run_facets,
            job_facets=capture.job_facets(self.settings, "APPLICATION", "NONE")))

    def _child_parent(self) -> dict:
        root = self.root or self.parent or (self.settings.namespace, self.settings.app_job_name, self.app_run_id)
        return {"parent": events.parent_facet(self.settings.namespace, self.settings.app_job_name,
                                              self.app_run_id, root=root)}

    def on_action(self, gateway: Any, func: str, qe: Any, duration_ns: int | None, error: Any) -> None:
        """One action finished (``error`` is the Java exception when it failed)."""
        ended = time.time()
        command = None
        try:
            if func == "file source write":
                self._remember_nested_write(qe)
                return
            if func == _CTAS_INNER_WRITE:
                return  # the CTAS/RTAS that runs it is reported, as one run
            # A streaming micro-batch (a V2 sink's ``nextBatch.collect()``, a Delta sink's write)
            # is the streaming run's, never a batch run. Without read-only actions its
            # ``collect`` never gets here and its analysed root is no write command; with them,
            # one py4j call tells it before anything else is read.
            if self.read_only_actions and jvm.is_micro_batch(gateway, qe):
                return
            # Decide before paying for a snapshot (~8 py4j calls, ~60 without batched reads): an action that writes
            # nothing is read only when it will be reported.
            analyzed = qe.analyzed()
            command = str(analyzed.nodeName())  # jvm.command_of, its analysed plan kept for the snapshot
            if command in jvm.MICRO_BATCH_WRITES:
                return
            if command not in jvm.WRITE_COMMANDS and not self.read_only_actions:
                return
            snap = jvm.snapshot(gateway, self.spark._jsparkSession, func, qe, command=command, analyzed=analyzed,
                                max_plan_bytes=self.max_plan_bytes, error=error)
            job = (self._action_job(gateway, qe, snap.query_id) if snap.output is not None or self.read_only_actions
                   else {})
        except Exception as err:  # noqa: BLE001 - capture must never break the job
            self.capture_errors += 1
            log.warning("lineage: could not read action %r: %s", func, err)
            if command in jvm.WRITE_COMMANDS or (command is None and func in _WRITE_FUNCS):
                self._emit_unreadable(qe, func, f"could not read the action: {err!r}", ended, duration_ns, error)
            return
        if snap.output is None and not self.read_only_actions:
            return
        if snap.output is not None and not snap.metrics and error is None:
            for path in [snap.output.location, *snap.output.paths]:
                if path and _path_key(path) in self._nested_writes:
                    snap.metrics = self._nested_writes.pop(_path_key(path))
                    break
        try:
            lineage = capture.analyse(snap, self.settings)
        except Exception as err:  # noqa: BLE001
            self.capture_errors += 1
            log.warning("lineage: could not analyse action %r: %s", func, err)
            self._emit_unreadable(qe, func, f"could not analyse the action: {err!r}", ended, duration_ns, error)
            return
        started = (snap.started_ms / 1000.0 if snap.started_ms else
                   ended - (duration_ns or 0) / 1e9)
        run_id = events.new_run_id()
        # Looked up once the action is read, so that its query's inputs are more likely known.
        stream = self._stream_of(qe)
        parent = self._child_parent() if stream is None else self._stream_parent(*stream[:2])
        if stream is not None and not lineage.inputs:
            # The micro-batch a foreachBatch function writes is an RDD (no dataset): what it
            # derives from is its query's inputs, as known so far.
            lineage.inputs = stream[2]
        run_facets = {**parent, **capture.engine_facets(self.settings), **job, **lineage.run_facets}
        job_facets = {**capture.job_facets(self.settings, "SQL_JOB"), **lineage.job_facets}
        common = dict(run_id=run_id, job_namespace=self.settings.namespace, job_name=lineage.job_name,
                      job_facets=job_facets)
        end_facets = dict(run_facets)
        if error is not None:
            end_facets.update(capture.error_facet(snap.error or "action failed", snap.stack))
        if not self._emit_action(func, [
                events.run_event("START", event_time=events.iso(min(started, ended)),
                                 run_facets={**run_facets, **self._start_facets()},
                                 inputs=[_without_stats(i) for i in lineage.inputs],
                                 outputs=[_without_stats(o) for o in lineage.outputs], **common),
                events.run_event("FAIL" if error is not None else "COMPLETE", event_time=events.iso(ended),
                                 run_facets=end_facets, inputs=lineage.inputs, outputs=lineage.outputs, **common)]):
            return
        self.actions_captured += 1
        streaming = self._streaming
        if stream is not None and error is None and lineage.outputs and streaming is not None:
            streaming.add_batch_outputs(stream[1], lineage.outputs)

    def _emit_action(self, func: str, run_events: list[dict]) -> bool:
        """Emit an action's events (emission only queues), unless the application's terminal
        is being emitted or capture stopped since its callback began: then they are dropped
        (one debug line, counted in ``late_actions``), so that none comes after the terminal."""
        with self._lock:
            if self._closed or self._listeners is None:
                self.late_actions += 1
                late = True
            else:
                late = False
                for event in run_events:
                    self.sender.emit(event)
        if late:
            log.debug("lineage: action %r finished after %s; not reported", func,
                      "the application's end" if self._closed else "capture stopped")
        return not late

    def _stream_of(self, qe: Any) -> tuple[str, str, list[dict]] | None:
        """(job name, runId, inputs known so far) of the foreachBatch streaming run whose function
        ran ``qe``, if any."""
        streaming = self._streaming
        if streaming is None:
            return None
        try:
            return streaming.foreach_batch_run(qe)
        except Exception as err:  # noqa: BLE001 - the action stays the application's child
            log.debug("lineage: could not tell the action's streaming query: %s", err)
            return None

    def _stream_parent(self, job_name: str, run_id: str) -> dict:
        """A foreachBatch write's parent: its streaming run (itself the application run's child)."""
        root = self.root or self.parent or (self.settings.namespace, self.settings.app_job_name, self.app_run_id)
        return {"parent": events.parent_facet(self.settings.namespace, job_name, run_id, root=root)}

    def _emit_unreadable(self, qe: Any, func: str, message: str, ended: float, duration_ns: int | None,
                         error: Any) -> None:
        """A write we could not read still becomes a run, named after the action, carrying
        an ``extractionError`` facet, so the gap is visible in the collector; its parent is the
        application run, or the streaming run whose foreachBatch function made it."""
        try:
            trace = traceback.format_exc(limit=5)
            stream = self._stream_of(qe)
            parent = self._child_parent() if stream is None else self._stream_parent(*stream[:2])
            run_id = events.new_run_id()
            run_facets = {**parent, **capture.engine_facets(self.settings),
                          "extractionError": events.facet("ExtractionErrorRunFacet", {
                              "totalTasks": 1, "failedTasks": 1,
                              "errors": [{"errorMessage": message, "stackTrace": trace}]})}
            common = dict(run_id=run_id, job_namespace=self.settings.namespace,
                          job_name=f"{self.settings.app_job_name}.{capture.snake(func)}",
                          job_facets=capture.job_facets(self.settings, "SQL_JOB"))
            start = events.run_event("START", event_time=events.iso(ended - (duration_ns or 0) / 1e9),
                                     run_facets={**run_facets, **self._start_facets()}, **common)
            end_facets = dict(run_facets)
            if error is not None:
                try:
                    detail = str(error.getMessage())
                except Exception:  # noqa: BLE001 - the Java object may be unusable
                    detail = "action failed"
                end_facets.update(capture.error_facet(detail, None))
            self._emit_action(func, [start, events.run_event("FAIL" if error is not None else "COMPLETE",
                                                             event_time=events.iso(ended), run_facets=end_facets,
                                                             **common)])
        except Exception:  # noqa: BLE001
            log.exception("lineage: could not report a capture error")

    def _remember_nested_write(self, qe: Any) -> None:
        # CTAS and saveAsTable run an inner file write first; its metrics belong to the
        # outer command, which reports the table. Bounded: a handful of entries.
        analyzed = qe.analyzed()
        if analyzed.getClass().getSimpleName() not in jvm.FILE_WRITES:
            return
        metrics = plain_reads.plan_metrics(qe.executedPlan())
        if len(self._nested_writes) > 16:
            self._nested_writes.clear()
        self._nested_writes[_path_key(analyzed.outputPath().toString())] = metrics


def _path_key(path: str) -> str:
    """One spelling per location for matching a table's nested file write: Hadoop's
    ``outputPath`` is ``file:/a b`` where the catalog's location URI is ``file:///a%20b``."""
    parts = urlsplit(path)
    return f"{parts.scheme}://{parts.netloc}{unquote(parts.path).rstrip('/') or '/'}"


def _without_stats(dataset: dict) -> dict:
    """A dataset as a START carries it: no statistics (an input's or output's facets, all
    counts, known when the action has run)."""
    return {k: v for k, v in dataset.items() if k not in ("inputFacets", "outputFacets")}
