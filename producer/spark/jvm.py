"""One action's QueryExecution -> plain data: an :class:`ActionSnapshot` (:func:`snapshot`).

Cost is bounded per action: the plan crosses py4j once, as JSON
(:func:`producer.spark.plan_reads.plan_json`; not at all when it is estimated too large), and
a handful of calls per input leaf (:mod:`producer.spark.input_leaves`) and per write target
fetch what the JSON leaves out (paths, tables, JDBC URLs; where each lives:
:mod:`producer.spark.relations`). The action's other facts (metrics, start time, SQL text,
schema, node name, scans) come from one call of the batched reads
(:mod:`producer.spark.batched_reads`), or call by call (:mod:`producer.spark.plain_reads`)
when its helper cannot be compiled: the same snapshot either way. Everything returned is
plain Python, so the event building in :mod:`producer.spark.capture` is testable without Spark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from producer.spark import batched_reads, input_stats, plain_reads, plan_reads, scans
from producer.spark.input_leaves import read_input_leaves
from producer.spark.java_objects import per_gateway, untracked
from producer.spark.relations import (
    SEP,
    Relation,
    catalog_table,
    opt,
    qualified,
    relation_of,
    v2_created,
)
from producer.spark.scans import Scan, read_scans, scan_reader

log = logging.getLogger("producer.spark")

#: Analysed-plan roots that write data, by how their target is found.
FILE_WRITES = {"InsertIntoHadoopFsRelationCommand"}
TABLE_CREATES = {"CreateDataSourceTableAsSelectCommand", "CreateHiveTableAsSelectCommand",
                 "OptimizedCreateHiveTableAsSelectCommand"}
TABLE_INSERTS = {"InsertIntoHiveTable"}
SOURCE_SAVES = {"SaveIntoDataSourceCommand"}
V2_WRITES = {"AppendData", "OverwriteByExpression", "OverwritePartitionsDynamic"}
V2_CREATES = {"CreateTableAsSelect", "ReplaceTableAsSelect", "AtomicCreateTableAsSelect"}
#: Row-level changes: Spark's DataSourceV2 commands (rewritten to ReplaceData/WriteDelta for
#: tables that support it) and Delta Lake's own commands, which name their target ``target``.
V2_ROW_LEVEL = {"ReplaceData", "WriteDelta", "MergeIntoTable", "DeleteFromTable", "UpdateTable"}
DELTA_ROW_LEVEL = {"MergeIntoCommand", "DeleteCommand", "UpdateCommand"}
WRITE_COMMANDS = (FILE_WRITES | TABLE_CREATES | TABLE_INSERTS | SOURCE_SAVES | V2_WRITES | V2_CREATES
                  | V2_ROW_LEVEL | DELTA_ROW_LEVEL)


#: Analysed-plan roots of a streaming micro-batch's own execution (a V2 sink's ``nextBatch.collect()``):
#: never a batch action, whatever it is named.
MICRO_BATCH_WRITES = frozenset({"WriteToDataSourceV2", "WriteToMicroBatchDataSource", "WriteToMicroBatchDataSourceV1"})
#: The QueryExecution of a streaming micro-batch (Spark 4.1 moved it to ``runtime``).
_INCREMENTAL_EXECUTION = ("org.apache.spark.sql.execution.streaming.runtime.IncrementalExecution",
                          "org.apache.spark.sql.execution.streaming.IncrementalExecution")
_INCREMENTAL: dict[int, tuple[Any, Any]] = {}


def _incremental_class(gateway: Any) -> Any:
    """The JVM class of a micro-batch's QueryExecution, looked up once per gateway; None when
    this Spark has neither name (the analysed root, :data:`MICRO_BATCH_WRITES`, still tells)."""
    def build(gateway: Any) -> Any:
        with untracked():  # kept across actions
            for name in _INCREMENTAL_EXECUTION:
                try:
                    return gateway.jvm.py4j.reflection.ReflectionUtil.classForName(name)
                except Exception:  # noqa: BLE001 - ClassNotFoundException: the other name
                    continue
        return None

    return per_gateway(_INCREMENTAL, gateway, build)


def is_micro_batch(gateway: Any, qe: Any) -> bool:
    """Whether ``qe`` is a streaming micro-batch's own execution (an ``IncrementalExecution``),
    in one py4j call (after the class's lookup, once per gateway). A write a ``foreachBatch``
    function makes is not: it is an ordinary batch execution on the query's thread."""
    cls = _incremental_class(gateway)
    return cls is not None and bool(cls.isInstance(qe))


def command_of(qe: Any) -> str:
    """The class name of the action's analysed plan (``TreeNode.nodeName``), in two py4j
    calls: enough to tell a write (one of :data:`WRITE_COMMANDS`) from a read before paying
    for a :func:`snapshot`."""
    return str(qe.analyzed().nodeName())


@dataclass
class ActionSnapshot:
    func: str
    command: str
    query_json: str | None = None
    leaves: list[Relation | None] = field(default_factory=list)
    output: Relation | None = None
    mode: str | None = None
    metrics: dict[str, int] = field(default_factory=dict)
    started_ms: int | None = None
    error: str | None = None
    stack: str | None = None
    plan_bytes: int = 0
    output_schema_json: str | None = None  # the written query's StructType, exact types
    node_name: str | None = None  # the executed plan's root node name (the job name's middle part)
    output_suffix: str | None = None  # a save()'s job-name suffix (see producer.spark.job_names)
    sql_text: str | None = None  # the SQL statement the written query was parsed from (spark.sql)
    scans: list[Scan] | None = None  # the executed plan's leaves and their metrics (a finished action's)
    plan_error: str | None = None  # why the plan's JSON could not be built (then no column lineage)
    query_id: str | None = None  # the QueryExecution's queryId (its Spark job's key), when read with the rest

    @cached_property
    def query_nodes(self) -> list[dict[str, Any]] | None:
        """``query_json`` parsed, once for the leaf lookup and the analysis; raises
        ``orjson.JSONDecodeError`` when it is not JSON."""
        return None if self.query_json is None else orjson.loads(self.query_json)


def _first_line(err: Exception) -> str:
    """An error's type and its message's first line (a Py4JJavaError's message holds the
    whole Java stack)."""
    text = str(getattr(err, "java_exception", None) or err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _unaliased(plan: Any) -> Any:
    """``plan`` without its ``SubqueryAlias`` wrappers (``MERGE INTO t AS target``)."""
    for _ in range(8):
        if plan.nodeName() != "SubqueryAlias":
            break
        plan = plan.child()
    return plan


def snapshot(gateway: Any, session: Any, func: str, qe: Any, *, max_plan_bytes: int,
             error: Any = None, command: str | None = None, analyzed: Any = None) -> ActionSnapshot:
    """Everything lineage needs from one finished (or failed) action (``command``: its
    :func:`command_of`, and ``analyzed``: its analysed plan, when already known). With the
    batched reads (:mod:`producer.spark.batched_reads`) the same, in about a dozen py4j calls."""
    analyzed = analyzed if analyzed is not None else qe.analyzed()
    command = command or str(analyzed.nodeName())
    helper = batched_reads.helper(gateway, analyzed)
    snap = ActionSnapshot(func=func, command=command,
                          started_ms=None if helper is not None else plain_reads.started_ms(qe))
    query = analyzed
    written = _batched_file_write(helper, analyzed, func) if command in FILE_WRITES and helper is not None else None
    if written is not None:
        has_table, path, file_format, mode = written
        snap.output = catalog_table(analyzed.catalogTable().get()) if has_table == "1" else Relation()
        snap.output.paths = [path]
        snap.output.fmt = snap.output.fmt or str(file_format).lower()
        snap.mode = mode
        query = analyzed.query()
    elif command in FILE_WRITES:
        table = opt(analyzed.catalogTable())
        snap.output = catalog_table(table) if table is not None else Relation()
        snap.output.paths = [analyzed.outputPath().toString()]
        snap.output.fmt = snap.output.fmt or analyzed.fileFormat().toString().lower()
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in TABLE_CREATES:
        snap.output = catalog_table(analyzed.tableDesc() if command != "CreateDataSourceTableAsSelectCommand"
                                     else analyzed.table())
        # saveAsTable into an existing table runs this command too: its SaveMode tells
        # an append (no lifecycle change) from an overwrite or a create.
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in TABLE_INSERTS:
        snap.output = catalog_table(analyzed.table())
        snap.mode = "Overwrite" if analyzed.overwrite() else "Append"
        query = analyzed.query()
    elif command in SOURCE_SAVES:
        options = analyzed.options()
        source = analyzed.dataSource().getClass().getSimpleName()
        path = None
        if "Jdbc" in source:
            snap.output = Relation(jdbc_url=opt(options.get("url")), jdbc_table=opt(options.get("dbtable")))
        elif (path := opt(options.get("path"))) is not None:
            snap.output = Relation(paths=[qualified(gateway, session, path, options)], fmt=source)
        snap.output_suffix = plain_reads.save_suffix(source, path, options, snap.output)
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in V2_WRITES:
        snap.output = relation_of(gateway, analyzed.table())
        snap.mode = "Append" if command == "AppendData" else "Overwrite"
        query = analyzed.query()
    elif command in V2_CREATES:
        snap.output = v2_created(analyzed.name())
        snap.mode = "Create" if command != "ReplaceTableAsSelect" else "Overwrite"
        query = analyzed.query()
    elif command in V2_ROW_LEVEL or command in DELTA_ROW_LEVEL:
        # The target is read and written; MERGE also reads its source. What cannot be
        # found here raises, and the listener reports the run with an extractionError.
        if command == "MergeIntoTable":
            target, query = _unaliased(analyzed.targetTable()), analyzed.sourceTable()
        elif command in ("ReplaceData", "WriteDelta"):
            target, query = analyzed.table(), analyzed.query()
        elif command in DELTA_ROW_LEVEL:
            target = _unaliased(analyzed.target())
            query = analyzed.source() if command == "MergeIntoCommand" else target
        else:
            target = query = _unaliased(analyzed.table())
        snap.output = relation_of(gateway, target)
    if snap.output is not None and command in TABLE_CREATES and snap.output.location is None:
        snap.output.location = plain_reads.table_location(
            session, analyzed.table() if command == "CreateDataSourceTableAsSelectCommand" else analyzed.tableDesc())

    try:
        snap.query_json, snap.plan_bytes = plan_reads.plan_json(gateway, query, max_plan_bytes)
    except Exception as err:  # noqa: BLE001 - no JSON (an OutOfMemoryError, say): datasets still read
        snap.plan_error = _first_line(err)
        log.warning("lineage: no column lineage for action %r, its plan's JSON could not be built: %s",
                    func, snap.plan_error)
    if helper is not None:
        snap.leaves = read_input_leaves(gateway, snap, query, helper)
        if _read_facts(gateway, helper, snap, qe, query, error):
            return snap
        snap.started_ms = plain_reads.started_ms(qe)
    try:
        snap.sql_text = plain_reads.sql_text(query)
    except Exception:  # noqa: BLE001 - an older Spark's Origin has no sqlText: no sql facet
        snap.sql_text = None
    if snap.output is not None:
        snap.output_schema_json = query.schema().json()
    snap.leaves = read_input_leaves(gateway, snap, query)
    try:
        executed = qe.executedPlan()
        snap.node_name = plain_reads.node_name(executed)
    except Exception:  # noqa: BLE001 - not planned: the job name has no node part (as the official one)
        executed = None
    if error is None:
        try:
            snap.metrics = plain_reads.plan_metrics(executed) if executed is not None else {}
        except Exception:  # noqa: BLE001 - metrics are a nicety
            snap.metrics = {}
        # What the inputs' scans read (inputStatistics): one call, none without data at rest
        # nor for an action rerunning a DataFrame's plan (its metrics may be another run's).
        if (executed is not None and input_stats.counts_its_run(func, command in WRITE_COMMANDS)
                and any(leaf is not None for leaf in snap.leaves)):
            try:
                snap.scans = read_scans(gateway, executed)
            except Exception:  # noqa: BLE001 - a nicety too
                snap.scans = None
    else:
        snap.error = str(error.getMessage() or error.toString())
        snap.stack = gateway.jvm.org.apache.spark.util.Utils.exceptionString(error)
    return snap


def _batched_file_write(helper: Any, analyzed: Any, func: str) -> list | None:
    """A file write's target from the helper's ``fileWrite`` (raising as the plain reads
    would); None when its answer cannot be parsed: then read call by call."""
    text = batched_reads.read_text(helper.fileWrite(analyzed, batched_reads.PIECE_CHARS))
    try:
        return batched_reads.fields(text, count=4)
    except ValueError as err:
        _unparsed(func, "fileWrite", err)
        return None


def _unparsed(func: str, read: str, err: ValueError) -> None:
    log.warning("lineage: action %r: the batched reads' %s answer cannot be parsed (%s); read call by call",
                func, read, err)


def _read_facts(gateway: Any, helper: Any, snap: ActionSnapshot, qe: Any, query: Any, error: Any) -> bool:
    """What the plain reads at the end of :func:`snapshot` fill in, from one py4j call (the
    helper's ``facts``); each fact that fails there is treated as its plain read's failure.
    False, ``snap`` untouched, when the answer cannot be parsed: the caller reads them call by call."""
    scans_wanted = (error is None and input_stats.counts_its_run(snap.func, snap.command in WRITE_COMMANDS)
                    and any(leaf is not None for leaf in snap.leaves))
    reader = scan_reader(gateway) if scans_wanted else None
    answer = helper.facts(qe, query, snap.output is not None, error is None, reader, SEP, batched_reads.PIECE_CHARS)
    try:
        query_id, phases, sql_text, schema, node_name, metrics, scanned = batched_reads.fields(
            batched_reads.read_text(answer), count=7)
    except ValueError as err:
        _unparsed(snap.func, "facts", err)
        return False
    snap.query_id = query_id if isinstance(query_id, str) else None
    if isinstance(phases, str):
        match = plain_reads.ANALYSIS_PHASE.search(phases)
        snap.started_ms = int(match.group(1)) if match is not None else plain_reads.started_ms(qe)
    if isinstance(sql_text, str):
        snap.sql_text = sql_text[5:-1] if sql_text.startswith("Some(") and sql_text.endswith(")") else None
    if snap.output is not None:
        # Asked again when it failed there, so that it raises as the plain read does.
        snap.output_schema_json = schema if isinstance(schema, str) else query.schema().json()
    if isinstance(node_name, str):
        snap.node_name = node_name
    if error is None:
        parsed = plain_reads.parsed_metrics(metrics) if isinstance(metrics, str) else {}
        if not parsed and isinstance(metrics, str):
            try:  # another format: asked one by one, as the plain read does
                parsed = plain_reads.plan_metrics(qe.executedPlan())
            except Exception:  # noqa: BLE001 - metrics are a nicety
                parsed = {}
        snap.metrics = parsed
        snap.scans = scans.parse_scans(scanned) if isinstance(scanned, str) else None
    else:
        snap.error = str(error.getMessage() or error.toString())
        snap.stack = gateway.jvm.org.apache.spark.util.Utils.exceptionString(error)
    return True
