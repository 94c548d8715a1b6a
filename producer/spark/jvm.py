"""One action's QueryExecution -> plain data (where its data lives: :mod:`producer.spark.relations`).

Cost is bounded per action: the plan crosses py4j once, as JSON (``TreeNode.toJSON``'s text,
read in pieces that py4j returns without a stall, see :func:`plan_json`), and
a handful of calls per input leaf and per write target fetch what the JSON leaves out
(paths, tables, JDBC URLs, metrics). Everything returned is plain Python, so the event
building in :mod:`producer.spark.capture` is testable without Spark.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson
from py4j.protocol import Py4JJavaError

from producer.spark import batched_reads, input_stats, scans
from producer.spark.java_objects import per_gateway, untracked
from producer.spark.job_names import trim_path
from producer.spark.relations import (
    _QUALIFIED,
    RELATION_KINDS,
    SEP,
    LeafInfo,
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


#: py4j answers with one message written through an 8 KiB buffer; a longer answer stalls
#: ~40 ms on loopback (Nagle's algorithm on the JVM's side meets the delayed ACK on ours).
#: Text is therefore read in pieces that fit, up to this length; above it, at once (one
#: stall costs less than that many round trips).
_PIECE_CHARS = 4000  # py4j doubles backslashes: 8,000 bytes at most for ASCII JSON
_PIECED_UP_TO = 400_000


def _json_tools(gateway: Any) -> tuple[Any, Any]:
    """json4s' Jackson mapper and the StringWriter class, looked up once per gateway (each
    ``gateway.jvm.a.b.C`` lookup is a py4j round trip per dotted name)."""
    def build(gateway: Any) -> tuple[Any, Any]:
        with untracked():  # kept across actions
            module = getattr(getattr(gateway.jvm.org.json4s.jackson, "JsonMethods$"), "MODULE$")
            return module.mapper(), gateway.jvm.java.io.StringWriter

    return per_gateway(_JSON_TOOLS, gateway, build)


_JSON_TOOLS: dict[int, tuple[Any, tuple[Any, Any]]] = {}


#: The plan's size, estimated in the driver JVM before its JSON is built: a walk of the plan's
#: nodes and expressions (and of subquery plans) in Java, compiled once per gateway with the
#: Janino compiler Spark ships for its own code generation (no jar to install). It charges each
#: node about what it adds to ``toJSON``'s text at least (its class, child count, an attribute's
#: name and type, a literal's value, an ``InSet``'s elements: about 0.6 of the real length), plus
#: what Spark's JSON writer spends finding a node's children in its fields (``children.indexOf``
#: per child: k*(k-1)/2 comparisons for k children, ~15 ns each against ~40 ns per character
#: written, so charged half a character each), which makes ``isin`` over 20,000 values take
#: seconds though its text is 5 MB. The walk stops as soon as the total passes the limit, so it
#: costs in proportion to the limit at most (a few ms), and a plan above it is never turned into
#: JSON at all.
_ESTIMATOR_SOURCE = """
public static long estimate(Object root, long limit) {
    java.util.ArrayDeque todo = new java.util.ArrayDeque();
    todo.push(root);
    long total = 0;
    while (!todo.isEmpty()) {
        Object o = todo.pop();
        if (!(o instanceof org.apache.spark.sql.catalyst.trees.TreeNode)) continue;
        org.apache.spark.sql.catalyst.trees.TreeNode node = (org.apache.spark.sql.catalyst.trees.TreeNode) o;
        total += 48 + node.nodeName().length();
        long k = 0;
        scala.collection.Iterator it = node.children().iterator();
        while (it.hasNext()) { todo.push(it.next()); k++; }
        total += k * (k - 1) / 4;
        if (o instanceof org.apache.spark.sql.catalyst.plans.QueryPlan) {
            it = ((org.apache.spark.sql.catalyst.plans.QueryPlan) o).expressions().iterator();
            while (it.hasNext()) todo.push(it.next());
        }
        if (o instanceof org.apache.spark.sql.catalyst.expressions.AttributeReference) {
            total += 120 + ((org.apache.spark.sql.catalyst.expressions.AttributeReference) o).name().length();
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.Literal) {
            Object v = ((org.apache.spark.sql.catalyst.expressions.Literal) o).value();
            total += 24 + (v instanceof org.apache.spark.unsafe.types.UTF8String
                    ? ((org.apache.spark.unsafe.types.UTF8String) v).numBytes() : 4);
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.InSet) {
            total += 4L * ((org.apache.spark.sql.catalyst.expressions.InSet) o).hset().size();
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.SubqueryExpression) {
            todo.push(((org.apache.spark.sql.catalyst.expressions.SubqueryExpression) o).plan());
        }
        if (total > limit) return total;
    }
    return total;
}
"""
_ESTIMATOR: dict[int, tuple[Any, Any]] = {}


def _estimator(gateway: Any, plan: Any) -> Any:
    """An instance of the compiled estimator class, once per gateway; None when it cannot be
    compiled (another Spark's classes): then the JSON is built unestimated, as before."""
    def build(gateway: Any) -> Any:
        try:
            with untracked():  # kept across actions
                evaluator = gateway.jvm.org.codehaus.janino.ClassBodyEvaluator()
                evaluator.setParentClassLoader(plan.getClass().getClassLoader())
                evaluator.cook(_ESTIMATOR_SOURCE)
                cls = evaluator.getClazz()
                return cls.getDeclaredConstructor(gateway.new_array(gateway.jvm.java.lang.Class, 0)).newInstance(
                    gateway.new_array(gateway.jvm.java.lang.Object, 0))
        except Exception as err:  # noqa: BLE001 - no estimate: the JSON's own length decides
            log.warning("lineage: cannot estimate plan sizes (%s); plans are serialised before their size is known",
                        err)
            return None

    return per_gateway(_ESTIMATOR, gateway, build)


def estimate_plan_chars(gateway: Any, plan: Any, max_chars: int) -> int | None:
    """A lower bound of ``plan.toJSON()``'s cost in characters (see :data:`_ESTIMATOR_SOURCE`),
    counted no further than just past ``max_chars``: one py4j call (after the estimator's
    compilation, once per gateway); None when it cannot be estimated."""
    estimator = _estimator(gateway, plan)
    if estimator is None:
        return None
    try:
        return int(estimator.estimate(plan, max_chars))
    except Py4JJavaError:
        raise
    except Exception:  # noqa: BLE001 - not the estimator's class (py4j-level): unestimated
        return None


def plan_json(gateway: Any, plan: Any, max_chars: int) -> tuple[str | None, int]:
    """``plan.toJSON()`` (the same text) and its length; None when it exceeds ``max_chars``
    (then it is never sent over py4j). A plan whose estimate (:func:`estimate_plan_chars`)
    is already above ``max_chars`` is not turned into JSON at all: its estimate is returned
    as its length. A failure of Spark's JSON writer (an ``OutOfMemoryError``, say) raises,
    never retried: only when json4s' tools cannot be looked up is ``toJSON`` called instead.
    With the batched reads (:mod:`producer.spark.batched_reads`): all of it in one py4j call,
    the text deflated on the way."""
    helper = batched_reads.helper(gateway, plan)
    if helper is not None:
        answer = helper.planJson(plan, max_chars, _PIECE_CHARS, _PIECED_UP_TO)
        return batched_reads.plan_answer(batched_reads.read_text(answer))
    estimate = estimate_plan_chars(gateway, plan, max_chars)
    if estimate is not None and estimate > max_chars:
        return None, estimate
    try:
        mapper, string_writer = _json_tools(gateway)
    except Exception:  # noqa: BLE001 - another json4s: the plain call, stall and all
        whole = plan.toJSON()
        return (whole if len(whole) <= max_chars else None), len(whole)
    writer = string_writer()
    mapper.writeValue(writer, plan.jsonValue())
    text = writer.getBuffer()
    length = text.length()
    if length > max_chars:
        return None, length
    if length <= _PIECE_CHARS or length > _PIECED_UP_TO:
        return text.toString(), length
    return "".join(text.substring(i, min(length, i + _PIECE_CHARS)) for i in range(0, length, _PIECE_CHARS)), length


def _first_line(err: Exception) -> str:
    """An error's type and its message's first line (a Py4JJavaError's message holds the
    whole Java stack)."""
    text = str(getattr(err, "java_exception", None) or err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _leaf_infos(snap: ActionSnapshot) -> list[list[LeafInfo]] | None:
    """From the plan's JSON, its leaves in ``collectLeaves()`` order (both are pre-order
    walks of the children), then each subquery plan's in ``subqueriesAll()`` order (see
    :func:`producer.spark.columns.leaf_groups`): one list per plan; None when unknown."""
    from producer.spark.columns import (
        leaf_groups,  # pure; the one definition of the order
    )

    try:
        if snap.query_nodes is None:
            return None
        return [[LeafInfo(node["class"].rpartition(".")[2], node.get("catalogTable") is not None)
                 for node in group] for group in leaf_groups(snap.query_nodes)]
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def _input_leaves(gateway: Any, snap: ActionSnapshot, query: Any, helper: Any = None) -> list[Relation | None]:
    """Every leaf of ``query`` and of its subquery plans (a table read only inside
    ``IN (SELECT ...)``, ``EXISTS`` or a scalar subquery is an input too), in the order of
    :func:`_leaf_infos`. Without subqueries (known from the JSON), two calls as before; with
    the batched reads (``helper``), one, plus the plain reads of a leaf it does not describe."""
    groups = _leaf_infos(snap)
    if helper is not None and groups is not None and len(groups) == 1:
        text = batched_reads.read_text(helper.leaves(query, SEP, batched_reads.PIECE_CHARS))
        summaries = batched_reads.fields(text)
        if len(summaries) == len(groups[0]):
            return _described_leaves(gateway, query, groups[0], summaries)
    plans = [query]
    if groups is None or len(groups) > 1:
        subqueries = query.subqueriesAll()
        plans += [subqueries.apply(j) for j in range(subqueries.length())]
    # Indexed by length()/apply(): py4j's iterator protocol ends every loop with a Java
    # NoSuchElementException that PySpark converts at a cost of ~40 ms.
    seqs = [plan.collectLeaves() for plan in plans]
    counts = [seq.length() for seq in seqs]
    infos: list[list[LeafInfo | None]] = (
        groups if groups is not None and [len(g) for g in groups] == counts else [[None] * c for c in counts])
    # A leaf that cannot be data at rest (known from the JSON) is not even fetched.
    return [relation_of(gateway, seq.apply(i), info) if info is None or info.kind in RELATION_KINDS else None
            for seq, group in zip(seqs, infos) for i, info in enumerate(group)]


def _described_leaves(gateway: Any, query: Any, infos: list[LeafInfo], summaries: list) -> list[Relation | None]:
    """The leaves of ``query`` (no subqueries) from the helper's ``leaves`` answer: a file read
    with one qualified root and no catalog table as it describes it (what
    ``relations.relation_of`` would read); any other leaf that can be data at rest asked."""
    seq = None
    out: list[Relation | None] = []
    for i, (info, summary) in enumerate(zip(infos, summaries)):
        if info.kind not in RELATION_KINDS:
            out.append(None)
            continue
        rel = _described_file_read(info, summary)
        if rel is None:
            seq = seq if seq is not None else query.collectLeaves()
            rel = relation_of(gateway, seq.apply(i), info)
        out.append(rel)
    return out


def _described_file_read(info: LeafInfo, summary: Any) -> Relation | None:
    if info.kind != "LogicalRelation" or info.has_table or not isinstance(summary, str) or not summary.startswith("H"):
        return None
    file_format, _, joined = summary[1:].partition("\u001e")
    paths = joined.split(SEP) if joined else []
    if len(paths) > 1 or not all(_QUALIFIED.match(path) for path in paths):
        return None  # several roots (directories), or one to qualify: asked
    return Relation(paths=paths, fmt=file_format.lower())


def _unaliased(plan: Any) -> Any:
    """``plan`` without its ``SubqueryAlias`` wrappers (``MERGE INTO t AS target``)."""
    for _ in range(8):
        if plan.nodeName() != "SubqueryAlias":
            break
        plan = plan.child()
    return plan


def _node_name(plan: Any) -> str:
    """The executed plan's root node name (``Execute InsertIntoHadoopFsRelationCommand``,
    ``AdaptiveSparkPlan``), a whole-stage-codegen stage's child's: one py4j call, two for
    a codegen stage."""
    name = str(plan.nodeName())
    return str(plan.child().nodeName()) if name.startswith("WholeStageCodegen") else name


def _save_suffix(source: str, path: str | None, options: Any, output: Relation | None) -> str | None:
    """A ``SaveIntoDataSourceCommand``'s job-name suffix as the official visitor gives it:
    a Delta path as written (its last two segments); a JDBC table; a ``kustotable`` or
    ``table`` option; else the first option whose key holds ``table`` (Snowflake's and
    Redshift's ``dbtable``, Hudi's ``hoodie.table.name``), in the options' order; else none."""
    if "DeltaDataSource" in source and path is not None:
        return trim_path(path)
    if output is not None and output.jdbc_url is not None:
        return output.jdbc_table
    for key in ("kustotable", "table"):
        if (value := opt(options.get(key))) is not None:
            return value
    for key in str(options.keys().mkString(SEP)).split(SEP):
        if "table" in key.lower():
            return opt(options.get(key))
    return None


def _table_location(session: Any, table: Any) -> str | None:
    try:
        meta = session.sessionState().catalog().getTableMetadata(table.identifier())
        return meta.location().toString()
    except Exception:  # noqa: BLE001 - the table may not exist (failed CTAS)
        return None


def _metrics(plan: Any, names: tuple[str, ...] = ("numOutputRows", "numOutputBytes", "numFiles")) -> dict[str, int]:
    # Adaptive query execution wraps the write (DataWritingCommandExec) in its final plan
    # and a result query stage.
    for _ in range(4):
        kind = plan.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            plan = plan.executedPlan()
        elif kind.endswith("QueryStageExec"):
            plan = plan.plan()
        else:
            break
    metrics = plan.metrics()
    # All of them in one call, as "name -> SQLMetric(id: 1, name: Some(...), value: 42)"
    # (four round trips per metric otherwise); another format: one by one.
    return _parsed_metrics(str(metrics.mkString(SEP)), names) or _metrics_one_by_one(metrics, names)


def _parsed_metrics(joined: str, names: tuple[str, ...] = ("numOutputRows", "numOutputBytes", "numFiles")
                    ) -> dict[str, int]:
    """The ``names`` metrics of a plan's ``metrics.mkString(SEP)``."""
    out: dict[str, int] = {}
    for entry in joined.split(SEP):
        match = _METRIC.fullmatch(entry)
        if match is not None and match.group(1) in names:
            out[match.group(1)] = int(match.group(2))
    return out


def _metrics_one_by_one(metrics: Any, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        metric = opt(metrics.get(name))
        if metric is not None:
            out[name] = int(metric.value())
    return out


_METRIC = re.compile(r"(\w+) -> SQLMetric\(.*value: (-?\d+)\)", re.DOTALL)
#: "analysis -> PhaseSummary(<start ms>, <end ms>)" among the tracker's phases.
_ANALYSIS_PHASE = re.compile(r"(?:^|\u001f)analysis -> PhaseSummary\((\d+), ?-?\d+\)")


def _started_ms(qe: Any) -> int | None:
    try:
        phases = qe.tracker().phases()
        match = _ANALYSIS_PHASE.search(phases.mkString(SEP))  # one call, not four
        return int(match.group(1)) if match is not None else _analysis_start_asked(phases)
    except Exception:  # noqa: BLE001 - older/other Spark: the caller falls back to the duration
        return None


def _analysis_start_asked(phases: Any) -> int | None:
    summary = opt(phases.get("analysis"))
    return int(summary.startTimeMs()) if summary is not None else None


def _sql_text(plan: Any) -> str | None:
    """The SQL text ``plan`` was parsed from (its ``origin``'s, set by Spark's parser for every
    node of a ``spark.sql`` statement and kept by the analyser), None for a DataFrame built
    in code: three py4j calls. ``Option.toString`` is ``Some(<text>)`` or ``None``."""
    text = str(plan.origin().sqlText().toString())
    return text[5:-1] if text.startswith("Some(") and text.endswith(")") else None


def snapshot(gateway: Any, session: Any, func: str, qe: Any, *, max_plan_bytes: int,
             error: Any = None, command: str | None = None, analyzed: Any = None) -> ActionSnapshot:
    """Everything lineage needs from one finished (or failed) action (``command``: its
    :func:`command_of`, and ``analyzed``: its analysed plan, when already known). With the
    batched reads (:mod:`producer.spark.batched_reads`) the same, in about a dozen py4j calls."""
    analyzed = analyzed if analyzed is not None else qe.analyzed()
    command = command or str(analyzed.nodeName())
    helper = batched_reads.helper(gateway, analyzed)
    snap = ActionSnapshot(func=func, command=command, started_ms=None if helper is not None else _started_ms(qe))
    query = analyzed
    if command in FILE_WRITES and helper is not None:
        has_table, path, file_format, mode = batched_reads.fields(batched_reads.read_text(
            helper.fileWrite(analyzed, batched_reads.PIECE_CHARS)))
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
        snap.output_suffix = _save_suffix(source, path, options, snap.output)
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
        snap.output.location = _table_location(session, analyzed.table() if command ==
                                                "CreateDataSourceTableAsSelectCommand" else analyzed.tableDesc())

    try:
        snap.query_json, snap.plan_bytes = plan_json(gateway, query, max_plan_bytes)
    except Exception as err:  # noqa: BLE001 - no JSON (an OutOfMemoryError, say): datasets still read
        snap.plan_error = _first_line(err)
        log.warning("lineage: no column lineage for action %r, its plan's JSON could not be built: %s",
                    func, snap.plan_error)
    if helper is not None:
        snap.leaves = _input_leaves(gateway, snap, query, helper)
        _read_facts(gateway, helper, snap, qe, query, error)
        return snap
    try:
        snap.sql_text = _sql_text(query)
    except Exception:  # noqa: BLE001 - an older Spark's Origin has no sqlText: no sql facet
        snap.sql_text = None
    if snap.output is not None:
        snap.output_schema_json = query.schema().json()
    snap.leaves = _input_leaves(gateway, snap, query)
    try:
        executed = qe.executedPlan()
        snap.node_name = _node_name(executed)
    except Exception:  # noqa: BLE001 - not planned: the job name has no node part (as the official one)
        executed = None
    if error is None:
        try:
            snap.metrics = _metrics(executed) if executed is not None else {}
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


def _read_facts(gateway: Any, helper: Any, snap: ActionSnapshot, qe: Any, query: Any, error: Any) -> None:
    """What the plain reads at the end of :func:`snapshot` fill in, from one py4j call (the
    helper's ``facts``); each fact that fails there is treated as its plain read's failure."""
    scans_wanted = (error is None and input_stats.counts_its_run(snap.func, snap.command in WRITE_COMMANDS)
                    and any(leaf is not None for leaf in snap.leaves))
    reader = scan_reader(gateway) if scans_wanted else None
    answer = helper.facts(qe, query, snap.output is not None, error is None, reader, SEP, batched_reads.PIECE_CHARS)
    query_id, phases, sql_text, schema, node_name, metrics, scanned = batched_reads.fields(
        batched_reads.read_text(answer))
    snap.query_id = query_id if isinstance(query_id, str) else None
    if isinstance(phases, str):
        match = _ANALYSIS_PHASE.search(phases)
        snap.started_ms = int(match.group(1)) if match is not None else _started_ms(qe)
    if isinstance(sql_text, str):
        snap.sql_text = sql_text[5:-1] if sql_text.startswith("Some(") and sql_text.endswith(")") else None
    if snap.output is not None:
        # Asked again when it failed there, so that it raises as the plain read does.
        snap.output_schema_json = schema if isinstance(schema, str) else query.schema().json()
    if isinstance(node_name, str):
        snap.node_name = node_name
    if error is None:
        parsed = _parsed_metrics(metrics) if isinstance(metrics, str) else {}
        if not parsed and isinstance(metrics, str):
            try:  # another format: asked one by one, as the plain read does
                parsed = _metrics(qe.executedPlan())
            except Exception:  # noqa: BLE001 - metrics are a nicety
                parsed = {}
        snap.metrics = parsed
        snap.scans = scans.parse_scans(scanned) if isinstance(scanned, str) else None
    else:
        snap.error = str(error.getMessage() or error.toString())
        snap.stack = gateway.jvm.org.apache.spark.util.Utils.exceptionString(error)
