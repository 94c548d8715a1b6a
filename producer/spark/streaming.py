"""Structured Streaming lineage: one OpenLineage run per run of a streaming query.

Micro-batches never reach the ``QueryExecutionListener`` of :mod:`producer.spark.listener`;
this module listens to the session's ``StreamingQueryManager`` instead, through the py4j
callback server that listener already uses (Spark's own ``PythonStreamingQueryListener``
interface, which PySpark's ``spark.streams.addListener`` uses too, Spark 3.4+).

What is guaranteed:

* Each run of a query (``StreamingQuery.runId``, new at every ``start()``, also when it resumes
  from a checkpoint) is one OpenLineage run with that ``runId``, a child of the application
  run (``parent`` facet as the batch child runs), job type ``STREAMING`` / ``SPARK`` /
  ``SQL_JOB`` as the official integration reports streaming queries, and job name
  ``<app>.streaming.<target>``: ``<target>`` is the sink's dataset (the last two segments of
  its path, as for batch writes), else the query's name (``queryName``), else the sink's kind
  (``memory_sink``, ``console_table``, ``foreach_batch_sink``). The name is fixed at START,
  when a Kafka sink's topic is not known yet: such a query is named by its ``queryName``, else
  ``kafka_table`` (set a ``queryName`` to tell two Kafka-writing queries apart).
* START when the query starts (its output dataset when the sink is a file sink; the inputs
  are not known yet); RUNNING when the datasets known from the query's progress first differ
  from those last reported (so, usually, once, after the first micro-batch); COMPLETE when it
  stops without an error, FAIL with an ``errorMessage`` facet when it stops with one, ABORT
  when the application ends (or ``disable_lineage`` is called) while it still runs. The last
  three carry the datasets last known.
* Order per run, whatever thread a callback comes on (``onQueryStarted`` runs on the query's
  thread, the others on the listener bus, the application's end on the driver's): START
  first, one terminal, nothing after it, and every terminal before the application's
  COMPLETE. A run's datasets, row counts and what was reported change, and its event is
  emitted, under one lock (emission only queues); py4j calls are made outside it. What a run
  looks up once (Kafka servers, a Kafka sink's topic, the output's schema, the topics a
  pattern matched) is written only by the thread reading its progress (the listener bus),
  before it takes that lock to apply what it found. A query that starts once the application has
  ended (or capture has stopped) is not reported (one log line).
* A run's progress is read (two py4j calls) at its first micro-batch and then at most once
  every :data:`PROGRESS_READ_INTERVAL_S`, or sooner once :data:`READ_EVERY_PROGRESSES` progress
  callbacks (any run's) came since its last read, each run on its own schedule: while no open
  run is due, a progress callback costs no py4j call. An idle notice (``onQueryIdle``, Spark 3.5+,
  two py4j calls) puts its run's next read an interval later: a query idle from its start
  never posts a progress, and would otherwise keep every other query's progress read. A
  run whose progress was never read (idle until it stopped) has its last one read at its
  end (two py4j calls), so its terminal names its datasets.
  Starting a query costs about a dozen py4j calls (its ids, name and sink), made on the
  query's thread before ``start()`` returns; its end, about five.
* Datasets are named by :mod:`producer.spark.streaming_names` from Spark's descriptions of the
  sources and sink: ``FileStreamSource[<path>]`` and ``FileSink[<path>]`` (``DeltaSink[...]``
  too) by path (a glob's pattern segments dropped); ``KafkaV2[Subscribe[a, b]]`` and
  ``Assign[...]`` as topics in ``kafka://<first bootstrap server>``, each source's servers
  read once from the query's plan (a query reading two clusters names each topic in its
  own); a ``SubscribePattern`` as the topics its progress shows offsets for (every topic it
  matched so far in the run: one that matches later comes with a later read, and one no
  longer shown stays); a Kafka sink (whose description names no topic) as the
  ``topic`` of the writer's options, read once at the run's first progress read. Rate, socket,
  memory, console and foreach sources and sinks are no dataset. Anything else (a Kafka sink
  without a ``topic`` option, whose rows name their topics; a pattern that matched nothing
  yet; an unknown source or sink) is left out and named in an ``extractionError`` run facet,
  as is what could not be read; what was left out is as of the last read. The output dataset
  carries a ``schema`` facet: the schema the query writes, read with the first read that names
  an output (so not on START). Each input carries the schema its source reads (the logical
  plan's streaming leaves, :mod:`producer.spark.streaming_stats`; two py4j calls with the first
  read that names an input). Data at rest the query reads besides its streams (a stream-static
  join's files or table: the logical plan's ``LogicalRelation``, ``HiveTableRelation`` and
  ``DataSourceV2Relation`` leaves) are inputs too, named as a batch read names them, with the
  schema the leaf reads and no row count: read once, at the run's first read (the plan's JSON,
  the same two py4j calls as the sources' schemas, shared; then, only when there are such
  leaves, two more and those the batch capture pays per relation). How the query's plan is
  read for the Kafka servers, the sink's topic and the written schema, what each read costs
  in py4j calls and what it gives when it finds nothing: :mod:`producer.spark.streaming_query`.
* Row counts (:mod:`producer.spark.streaming_stats`): each input's ``inputStatistics`` and the
  output's ``outputStatistics`` carry the rows of every micro-batch of the run so far
  (``rowCount``), on RUNNING and on the terminal, an ABORT too; they never cause an event of
  their own. At each read, and at the run's end, the query's recent progress is read from the
  newest down to the last batch counted (two py4j calls, then two per progress: about two per
  micro-batch in all, paid at the reads, not on each callback). An ABORT's read is made on the
  thread ending the application (or calling ``disable_lineage``), for a run a callback has
  read before (a run never read has no datasets known to put counts on); if it fails, the
  ABORT carries no counts, named in ``extractionError``. Exact or left out: batches Spark
  dropped from its recent progress before they were read (after the last batch counted, or,
  at a run's first read, from the batch whose progress triggered it on: its listener bus
  dropped their progress events, or ``spark.sql.streaming.numRecentProgressUpdates`` is below
  100) give the run's counts up, named in ``extractionError``. A source that is several
  datasets (a Kafka source of several topics) has no count per topic: its datasets get none;
  a sink that counts nothing (Spark's file sink reports ``-1``) gives no ``outputStatistics``.
* ``foreachBatch`` (as the official integration attributes the SQL jobs a streaming query runs
  to its run): what the function runs are batch actions, reported by the batch listener as
  runs of their own (a write always; a read with read-only actions), but an action run in the
  query's own session (the DataFrame the function is given, and what it derives from it;
  ``batch_df.sparkSession.sql(...)`` too) is the streaming run's child: its ``parent`` facet
  names the streaming run (the root stays the application's), and, when the action names no
  input of its own (the micro-batch is an RDD to it), its inputs are the streaming run's as
  known when its callback runs (none before the run's first read), without row counts. What
  such a write wrote is added to the streaming run's outputs (with its schema, no counts) from
  the run's next event on (its next RUNNING, if its datasets changed, or its terminal), when the
  write's callback comes while the run is open: Spark delivers it on another listener thread,
  so a write of the run's last micro-batch may come after its terminal, and is then on its own
  run only (still the streaming run's child, up to :data:`ENDED_GRACE_S` after its end). The
  session is told by its identity hash: two py4j calls when the query starts, and two per
  reported action while a foreachBatch query runs (or ended within the grace); none otherwise.
  Actions the function runs in another session (the application's ``spark``) are the
  application run's children, as any other.
* Nothing raises into the query: every callback is guarded, a failure is a log line (and an
  ``extractionError`` facet on the run's next event). Emission only queues.

Not guaranteed: queries started before ``enable_lineage`` (or in another session) are not
reported; a continuous-trigger query's (``trigger(continuous=...)``) Kafka sink is left out,
with the reason (its plan's write node holds no writer options); datasets of a query that
fails before its first micro-batch completes are not known (a RUNNING with them may come up
to an interval after an idle query's first micro-batch, or only its terminal has them);
no ``size`` or ``fileCount`` in the statistics (progress has none).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import orjson

from producer import events
from producer.spark import capture
from producer.spark.capture import DatasetRef
from producer.spark.streaming_names import (
    KAFKA_SINKS,
    KAFKA_SOURCES,
    datasets,
    job_name,
    offset_topics,
    pair_servers,
    source_kind,
)
from producer.spark.streaming_query import (
    _kafka_servers,
    _kafka_sink,
    _output_schema,
    _static_relations,
    _text,
    static_leaves,
)
from producer.spark.streaming_run import _Run
from producer.spark.streaming_stats import (
    RECENT_PROGRESS,
    RowCounts,
    input_datasets,
    output_datasets,
    read_new_progress,
    source_schemas,
)

if TYPE_CHECKING:
    from producer.spark.listener import SparkLineage

log = logging.getLogger("producer.spark")

#: What a progress read found: inputs, outputs, what could not be read (kept for the run),
#: what was left out (replaced at the next read), the datasets of each of the progress's sources.
_Found = tuple[list[DatasetRef], list[DatasetRef], list[str], list[str], list[list[DatasetRef]]]

#: After a run's first progress, its progress is read again at most this often (seconds).
PROGRESS_READ_INTERVAL_S = 30.0
#: ... or once this many progress callbacks (of any run) came since: half of Spark's recent progress.
READ_EVERY_PROGRESSES = RECENT_PROGRESS // 2
#: The most datasets a run's foreachBatch writes add to its outputs, and foreachBatch runs remembered once ended.
MAX_BATCH_OUTPUTS = 32
#: How long the writes of a foreachBatch run that ended are still its children (their callbacks come late).
ENDED_GRACE_S = 60.0
#: Sinks that run a user's function on each micro-batch (its writes are batch actions in the query's session).
FOREACH_BATCH_SINKS = frozenset({"ForeachBatchSink", "PythonForeachBatchSink"})
#: How long :meth:`StreamingLineage.abort_open` waits for the ABORTs another thread's call is emitting.
ABORT_WAIT_S = 10.0


class StreamingLineage:
    """Streaming-query runs of one :class:`~producer.spark.listener.SparkLineage`; made by
    :meth:`attach`, ended by :meth:`detach` (and :meth:`abort_open` at the application's end)."""

    def __init__(self, lineage: SparkLineage, *, read_interval_s: float = PROGRESS_READ_INTERVAL_S,
                 clock: Any = time.monotonic) -> None:
        self._lineage = lineage
        self._interval, self._clock = read_interval_s, clock
        self._runs: dict[str, _Run] = {}
        self._progresses = 0      # progress callbacks so far (a run's are never more)
        self._closed = False      # the application ended or capture stopped: no new run
        self._lock = threading.Lock()  # _runs, _closed, _aborting, a run's datasets and counts, and every emit
        self._aborts_done = threading.Condition(self._lock)
        self._aborting: list[int] = []   # the threads in abort_open between taking runs and emitting their ABORTs
        self._listeners: Any = None   # the session's SessionListeners, while attached
        # foreachBatch session -> (job, run, inputs, when) of runs ended within ENDED_GRACE_S
        self._ended_batch_runs: dict[int, tuple[str, str, list[dict], float]] = {}

    @classmethod
    def attach(cls, lineage: SparkLineage, listeners: Any) -> StreamingLineage | None:
        """Own the session's streaming listener (``listeners``: its
        :class:`~producer.spark.session_listeners.SessionListeners`), registered on its
        StreamingQueryManager; None (one log line) when that cannot be done (Spark before 3.4, a
        session without streams): batch capture goes on."""
        streaming = cls(lineage)
        try:
            listeners.attach_streams(streaming, lineage.spark._jsparkSession)
        except Exception as err:  # noqa: BLE001 - streaming capture is optional
            log.warning("lineage: streaming queries will not be captured (%s: %s)", type(err).__name__, err)
            return None
        streaming._listeners = listeners
        return streaming

    def detach(self) -> None:
        """ABORT the runs still open (capture stops while their queries run), then let the
        session's streaming listener go (unregistered, idle; the object stays for the session)."""
        self.abort_open()
        listeners, self._listeners = self._listeners, None
        if listeners is not None:
            try:
                jsession = self._lineage.spark._jsparkSession
            except Exception:  # noqa: BLE001 - detached all the same
                jsession = None
            listeners.detach_streams(self, jsession)

    def abort_open(self) -> None:
        """ABORT every run still open (the application ends, or capture stops, while its queries
        run); no run starts after. A run whose progress a callback has read has its new progress
        read first, on this thread and outside the lock (two py4j calls, then two per progress
        since its last read), so its ABORT carries the rows of every micro-batch up to now; if
        that read fails, its ABORT carries no row counts and its ``extractionError`` says why.
        A run never read (its datasets are not known) is not read here.

        When this returns, every event another thread was emitting has been emitted, and so
        has the ABORT of every run open when it was called, also of those another thread's
        call took first (waited for up to :data:`ABORT_WAIT_S`, then one log line); not of those
        a call on this same thread took (re-entered from a signal handler during its read)."""
        me = threading.get_ident()
        with self._lock:
            self._closed = True
            runs, self._runs = list(self._runs.values()), {}
            self._aborting.append(me)
        recent: list[tuple[list[dict], bool] | str | None] = []
        try:
            # Out of _runs, their counts are this thread's alone: a callback reading one now drops what it read.
            for run in runs:
                read_before = run.first_batch is not None or run.counts.last_batch is not None
                recent.append(self._recent(run) if read_before else None)
        finally:
            with self._lock:
                for index, run in enumerate(runs):
                    self._forget(run)
                    self._count(run, recent[index] if index < len(recent) else None)
                    self._emit(run, "ABORT")
                self._aborting.remove(me)
                self._aborts_done.notify_all()
                # Not for this thread's own (a signal handler ending the application inside its read).
                if not self._aborts_done.wait_for(lambda: all(t == me for t in self._aborting), ABORT_WAIT_S):
                    log.warning("lineage: streaming runs another thread is aborting were not emitted within %s s",
                                ABORT_WAIT_S)

    # -- callbacks (py4j threads; each guarded by _QueryListener) ------------------------------
    def on_started(self, jevent: Any) -> None:
        run_id, query_id, name, at = (str(jevent.runId().toString()), str(jevent.id().toString()),
                                      jevent.name(), jevent.timestamp())
        sink, query = None, None
        errors = []
        try:
            wrapper = self._lineage.spark._jsparkSession.streams().get(query_id)
            query = wrapper.streamingQuery() if wrapper is not None else None
            sink = str(query.sink().toString()) if query is not None else None
        except Exception as err:  # noqa: BLE001 - the run is still reported, without its sink
            errors.append(f"could not read the query's sink: {_text(err)}")
        run = _Run(run_id, job_name(self._lineage.settings.app_job_name, sink, name), query=query, errors=errors)
        if sink:
            _, run.outputs, run.left_out = datasets([], sink, None)
            if source_kind(sink)[0] in FOREACH_BATCH_SINKS:
                try:   # two py4j calls: the session its function's writes run in
                    run.session_key = int(query.sparkSessionForStream().hashCode())
                except Exception as err:  # noqa: BLE001 - its writes stay the application's children
                    run.note(f"could not read the query's session: {_text(err)}")
        run.reported = run.key()
        with self._lock:
            if self._closed:
                log.info("lineage: streaming run %s started after capture ended; not reported", run_id)
                return
            self._runs[run_id] = run
            self._emit(run, "START", at)

    # -- foreachBatch writes (the batch listener's thread) ----------------------------------------
    def foreach_batch_run(self, qe: Any) -> tuple[str, str, list[dict]] | None:
        """(job name, runId, inputs known so far) of the foreachBatch run whose function ran the
        action ``qe`` (it runs in the query's own session), or of one that ended lately; None
        when there is none (no py4j call when no foreachBatch query runs or ran lately; else two)."""
        with self._lock:
            now = self._clock()
            for session in [k for k, (_, _, _, at) in self._ended_batch_runs.items() if now - at > ENDED_GRACE_S]:
                del self._ended_batch_runs[session]
            if not any(r.session_key is not None for r in self._runs.values()) and not self._ended_batch_runs:
                return None
        key = int(qe.sparkSession().hashCode())
        with self._lock:
            run = next((r for r in self._runs.values() if r.session_key == key), None)
            if run is not None:
                return run.job_name, run.run_id, _plain_inputs(run)
            ended = self._ended_batch_runs.get(key)
            return ended[:3] if ended is not None else None

    def add_batch_outputs(self, run_id: str, outputs: list[dict]) -> None:
        """What a foreachBatch function wrote (datasets as its batch run reports them, without
        statistics) becomes its streaming run's outputs from its next event on; bounded."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return  # ended: the write's own run still names it, as the streaming run's child
            for dataset in outputs:
                key = (dataset["namespace"], dataset["name"])
                if len(run.batch_outputs) < MAX_BATCH_OUTPUTS and key not in {
                        (d["namespace"], d["name"]) for d in run.batch_outputs}:
                    run.batch_outputs.append({k: v for k, v in dataset.items() if k != "outputFacets"})

    def _forget(self, run: _Run) -> None:
        """A run leaves ``_runs`` (under the lock): its foreachBatch session is remembered a while,
        for the callbacks of its last writes that come after its terminal."""
        if run.session_key is not None:
            self._ended_batch_runs[run.session_key] = (run.job_name, run.run_id, _plain_inputs(run), self._clock())
            while len(self._ended_batch_runs) > MAX_BATCH_OUTPUTS:
                self._ended_batch_runs.pop(next(iter(self._ended_batch_runs)))

    def on_progress(self, jevent: Any) -> None:
        now = self._clock()
        with self._lock:
            self._progresses += 1
            due = any(self._due(r, now) for r in self._runs.values())
        if not due:
            return
        progress = orjson.loads(str(jevent.progress().json()))
        with self._lock:
            run = self._runs.get(str(progress.get("runId")))
            if run is None or not self._due(run, now):
                return  # another run was due: this one keeps its own schedule
            run.next_read, run.read_at_progress = now + self._interval, self._progresses
            if run.first_batch is None and run.counts.last_batch is None:
                run.first_batch = _batch_id(progress)
        found = self._datasets(run, progress)
        recent = self._recent(run)
        with self._lock:
            if self._runs.get(run.run_id) is not run:
                return  # ended while its progress was read
            self._take(run, *found)
            self._count(run, recent)
            if run.key() != run.reported:
                run.reported = run.key()
                self._emit(run, "RUNNING", progress.get("timestamp"))

    def _datasets(self, run: _Run, progress: dict) -> _Found:
        """The datasets a progress (as JSON data) names, what could not be read and what was
        left out; py4j only for a Kafka source's servers and a Kafka sink's topic, once a run."""
        run.read = True
        sources = [s for s in progress.get("sources") or [] if isinstance(s, dict)]
        descriptions = [str(s.get("description", "")) for s in sources]
        sink = (progress.get("sink") or {}).get("description")
        unread: list[str] = []
        # The listener bus is the only thread reading these (a run's end reads only a run never read).
        if any(source_kind(s)[0] in KAFKA_SOURCES for s in descriptions) and not run.kafka_looked_up:
            run.kafka_looked_up = True
            try:
                run.kafka_servers = _kafka_servers(run.query)
            except Exception as err:  # noqa: BLE001
                unread.append(f"could not read the kafka bootstrap servers: {_text(err)}")
        if sink and source_kind(sink)[0] in KAFKA_SINKS and not run.kafka_sink_looked_up:
            run.kafka_sink_looked_up = True
            try:
                run.kafka_sink = _kafka_sink(run.query)
            except Exception as err:  # noqa: BLE001
                run.kafka_sink = f"could not read the topic from the writer's options: {_text(err)}"
        topics = []
        for index, (source, description) in enumerate(zip(sources, descriptions)):
            if source_kind(description)[0] in KAFKA_SOURCES:
                # A pattern's topics are those it matched at any read of the run: a topic whose
                # offsets a later progress no longer shows was still read by this run.
                run.matched[index] = sorted(set(run.matched.get(index, ())) | set(offset_topics(source)))
            topics.append(run.matched.get(index, []))
        servers, unpaired = pair_servers(run.kafka_servers, descriptions)
        if unpaired:
            unread.append(unpaired)
        inputs, outputs, left_out = datasets(descriptions, sink, servers, source_topics=topics,
                                             kafka_sink=run.kafka_sink)
        if outputs and not run.schema_looked_up:
            run.schema_looked_up = True
            try:
                run.output_schema = _output_schema(run.query)
            except Exception as err:  # noqa: BLE001
                unread.append(f"could not read the schema the query writes: {_text(err)}")
        if not run.static_looked_up and run.query is not None:
            # Once a run, at its first read: the data at rest it reads besides its streams.
            run.static_looked_up = True
            try:
                leaves = static_leaves(self._plan_json(run))
                static = _static_relations(self._gateway(), run.query, leaves)
                dropped: list[dict] = []
                run.static = [(capture.dataset_refs(rel, self._lineage.settings, dropped), schema)
                              for rel, schema in static]
                unread.extend(e["errorMessage"] for e in dropped if "errorMessage" in e)
            except Exception as err:  # noqa: BLE001
                unread.append(f"could not read the data at rest the query reads: {_text(err)}")
        if inputs and not run.input_schemas_looked_up and run.query is not None:
            run.input_schemas_looked_up = True
            try:
                schemas = source_schemas(self._plan_json(run))
                if len(schemas) == len(sources):
                    run.input_schemas = schemas
                else:
                    unread.append(f"could not pair the plan's {len(schemas)} streaming sources with the "
                                  f"progress's {len(sources)}: no input schema")
            except Exception as err:  # noqa: BLE001
                unread.append(f"could not read the schemas the query reads: {_text(err)}")
        if run.input_schemas_looked_up and run.static_looked_up:
            run.plan_json = None
        per_source = [datasets([d], None, [s], source_topics=[t])[0]
                      for d, t, s in zip(descriptions, topics, servers)]
        return inputs, outputs, unread, left_out, per_source

    @staticmethod
    def _plan_json(run: _Run) -> str:
        """The query's logical plan as JSON, read once (two py4j calls) for its two reads."""
        if run.plan_json is None:
            run.plan_json = str(run.query.logicalPlan().toJSON())
        return run.plan_json

    def _gateway(self) -> Any:
        return getattr(getattr(self._lineage.spark, "sparkContext", None), "_gateway", None)

    @staticmethod
    def _recent(run: _Run) -> tuple[list[dict], bool] | str | None:
        """The run's progresses since its last counted batch (py4j; off the lock), or why not."""
        if run.query is None or run.counts.lost is not None:
            return None
        try:
            return read_new_progress(run.query, run.counts.last_batch)
        except Exception as err:  # noqa: BLE001 - the counts are given up, the datasets still go out
            return f"could not read the query's recent progress: {_text(err)}"

    def _due(self, run: _Run, now: float) -> bool:
        """An interval since its last read, or so many progresses (any run's) that its own
        batches since could soon fill half of Spark's recent progress."""
        return now >= run.next_read or self._progresses - run.read_at_progress >= READ_EVERY_PROGRESSES

    @staticmethod
    def _count(run: _Run, recent: tuple[list[dict], bool] | str | None) -> None:
        """Count what ``recent`` adds (under the lock); a reason to give the counts up is noted."""
        if recent is None or run.counts.lost is not None:
            return
        if isinstance(recent, str):
            run.counts.lost = recent
        else:
            run.counts.add(*recent, floor=run.first_batch)
        if run.counts.lost is not None:
            run.note(f"no row counts: {run.counts.lost}")

    @staticmethod
    def _take(run: _Run, inputs: list[DatasetRef], outputs: list[DatasetRef], unread: list[str],
              left_out: list[str], per_source: list[list[DatasetRef]]) -> None:
        run.inputs, run.outputs, run.left_out, run.source_refs = inputs, outputs, left_out, per_source
        for message in unread:
            run.note(message)

    def on_idle(self, jevent: Any) -> None:
        run_id, now = str(jevent.runId().toString()), self._clock()
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None:
                run.next_read = max(run.next_read, now + self._interval)

    def on_terminated(self, jevent: Any) -> None:
        run_id = str(jevent.runId().toString())
        with self._lock:
            if run_id not in self._runs:
                return
        failure = jevent.exception()
        text = str(failure.get()) if failure is not None and failure.isDefined() else None
        run = self._runs.get(run_id)
        found = None
        if run is not None and not run.read and run.query is not None:
            # Never read (idle until it stopped): its last progress names its datasets (2 calls).
            try:
                last = run.query.lastProgress()
                if last is not None:
                    found = self._datasets(run, orjson.loads(str(last.json())))
            except Exception as err:  # noqa: BLE001 - the terminal goes out without them
                found = (run.inputs, run.outputs, [f"could not read the query's last progress: {_text(err)}"],
                         run.left_out, run.source_refs)
        recent = self._recent(run) if run is not None else None   # the batches since its last read
        extra = None
        if text is not None:
            # Spark's text is the whole stack trace; the message is what comes before its Java frames
            # (for a Python error in foreachBatch, that includes the Python traceback's last line).
            extra = capture.error_facet(text.split("\n\tat ", 1)[0].strip()[:4000], text)
        with self._lock:
            run = self._runs.pop(run_id, None)
            if run is not None:  # else ABORTed meanwhile
                self._forget(run)
                if found is not None:
                    self._take(run, *found)
                self._count(run, recent)
                self._emit(run, "COMPLETE" if extra is None else "FAIL", extra=extra)

    def _emit(self, run: _Run, event_type: str, at: str | None = None, extra: dict | None = None) -> None:
        try:
            lineage = self._lineage
            run_facets = {**lineage._child_parent(), **capture.engine_facets(lineage.settings), **(extra or {})}
            errors = run.extraction_errors()
            if errors:
                run_facets["extractionError"] = events.facet("ExtractionErrorRunFacet", {
                    "totalTasks": len(errors), "failedTasks": len(errors),
                    "errors": [{"errorMessage": message} for message in errors]})
            lineage.sender.emit(events.run_event(
                event_type, run_id=run.run_id, event_time=at or None, job_namespace=lineage.settings.namespace,
                job_name=run.job_name, run_facets=run_facets,
                job_facets=capture.job_facets(lineage.settings, "SQL_JOB", "STREAMING"),
                inputs=input_datasets(*run.all_inputs(), run.counts),
                outputs=output_datasets(run.outputs, run.output_schema, run.counts) + run.batch_outputs))
        except Exception:  # noqa: BLE001 - never into the query
            log.exception("lineage: could not emit %s of streaming run %s", event_type, run.run_id)


def _plain_inputs(run: _Run) -> list[dict]:
    """A run's inputs as known so far, with their schemas and without row counts."""
    return [{k: v for k, v in d.items() if k != "inputFacets"} for d in input_datasets(*run.all_inputs(), RowCounts())]


def _batch_id(progress: dict) -> int | None:
    batch = progress.get("batchId")
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else None
