"""The only module that talks to the JVM: one action's QueryExecution -> plain data.

Cost is bounded per action: the plan crosses py4j once, as JSON (``TreeNode.toJSON``'s text,
read in pieces that py4j returns without a stall, see :func:`plan_json`), and
a handful of calls per input leaf and per write target fetch what the JSON leaves out
(paths, tables, JDBC URLs, metrics). Everything returned is plain Python, so the event
building in :mod:`producer.spark.capture` is testable without Spark.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

# -- one release per action for the Java objects it made ---------------------------------
# Every Java object that crosses py4j is kept alive on the JVM's side until Python lets it
# go, which py4j does one object at a time: a "delete" round trip per object (measured: 86
# per action, more than the calls that made them). Inside ``released_together(gateway)``,
# the objects this thread receives are not finalised one by one; their ids are collected
# and removed from py4j's table in one call when the block ends. Other threads (the job's)
# are untouched.

_tracking = threading.local()
_PATCHED: list[bool] = []


def _install_tracking() -> None:
    """Wrap ``py4j.java_gateway.JavaObject.__init__`` once: inside a tracking block, a new
    object's finalizer is dropped (so py4j never deletes it alone) and its id kept."""
    if _PATCHED:
        return
    from py4j.java_gateway import JavaObject

    original = JavaObject.__init__

    def __init__(self: Any, target_id: str, gateway_client: Any) -> None:
        original(self, target_id, gateway_client)
        _take_over(gateway_client, target_id)

    JavaObject.__init__ = __init__
    _PATCHED.append(True)


def _take_over(client: Any, target_id: str) -> None:
    """Inside a tracking block: drop the object's py4j finalizer (its key as py4j builds
    it) and keep its id for the block's release."""
    ids = getattr(_tracking, "ids", None)
    if ids is None:
        return
    from py4j.finalizer import ThreadSafeFinalizer

    ThreadSafeFinalizer.remove_finalizer(f"{client.address}{client.port}{target_id}")
    ids.append(target_id)


def adopt(obj: Any) -> None:
    """Release ``obj`` (a Java object made before the block, e.g. a callback's argument)
    with the block's objects instead of on its own."""
    target_id = getattr(obj, "_target_id", None)
    client = getattr(obj, "_gateway_client", None)
    if target_id is not None and client is not None:
        _take_over(client, target_id)


@contextmanager
def untracked() -> Iterator[None]:
    """Objects made here are finalised by py4j as usual (for those kept across actions)."""
    ids = getattr(_tracking, "ids", None)
    _tracking.ids = None
    try:
        yield
    finally:
        _tracking.ids = ids


class _Bindings:
    """py4j's object table on the JVM's side and what removes many ids in one call."""

    def __init__(self, gateway: Any) -> None:
        with untracked():
            self.keys = gateway.java_gateway_server.getGateway().getBindings().keySet()
            self.tokenizer = gateway.jvm.java.util.StringTokenizer
            self.as_list = gateway.jvm.java.util.Collections.list
        self.leftover: list[str] = []  # the last release's own tokenizer and list

    def release(self, ids: list[str]) -> None:
        ids = self.leftover + ids
        self.leftover = []
        if not ids:
            return
        _tracking.ids = self.leftover  # the tokenizer and list made by this release go next time
        try:
            # py4j matches no varargs (Arrays.asList), hence a tokenizer, an Enumeration.
            self.keys.removeAll(self.as_list(self.tokenizer(",".join(ids), ",")))
        finally:
            _tracking.ids = None


_BINDINGS: dict[int, tuple[Any, _Bindings]] = {}


def _per_gateway(cache: dict[int, tuple[Any, Any]], gateway: Any, build: Any) -> Any:
    """``build(gateway)``, made once per gateway. Keyed by identity: a py4j gateway answers
    any attribute, so nothing can be stored on it."""
    entry = cache.get(id(gateway))
    if entry is None or entry[0] is not gateway:
        entry = cache[id(gateway)] = (gateway, build(gateway))
    return entry[1]


@contextmanager
def released_together(gateway: Any) -> Iterator[None]:
    """See above. Nests (an inner block adds to the outer one). If the bulk release fails
    (another py4j), the ids are deleted one by one, as py4j would have."""
    if getattr(_tracking, "ids", None) is not None:
        yield
        return
    _install_tracking()
    ids: list[str] = []
    try:
        entry = _per_gateway(_BINDINGS, gateway, _Bindings)
    except Exception:  # noqa: BLE001 - no bulk release here: py4j's own, object by object
        yield
        return
    _tracking.ids = ids
    try:
        yield
    finally:
        _tracking.ids = None
        try:
            entry.release(ids)
        except Exception:  # noqa: BLE001
            _BINDINGS.pop(id(gateway), None)
            client = gateway._gateway_client
            for target_id in ids + entry.leftover:
                client.garbage_collect_object(target_id)


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


def command_of(qe: Any) -> str:
    """The class name of the action's analysed plan (``TreeNode.nodeName``), in two py4j
    calls: enough to tell a write (one of :data:`WRITE_COMMANDS`) from a read before paying
    for a :func:`snapshot`."""
    return str(qe.analyzed().nodeName())


@dataclass
class Relation:
    """Where data lives: a path, a catalog table (with its location), a JDBC table or a
    DataSourceV2 table name."""

    paths: list[str] = field(default_factory=list)
    table: str | None = None          # db.table
    location: str | None = None       # a catalog table's storage location
    jdbc_url: str | None = None
    jdbc_table: str | None = None
    v2_name: str | None = None        # a DataSourceV2 table's identifier in its catalog
    v2_catalog: str | None = None     # that catalog's name (``spark_catalog``, ``iceberg``, ...)
    fmt: str | None = None


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

    @cached_property
    def query_nodes(self) -> list[dict[str, Any]] | None:
        """``query_json`` parsed, once for the leaf lookup and the analysis; raises
        ``orjson.JSONDecodeError`` when it is not JSON."""
        return None if self.query_json is None else orjson.loads(self.query_json)


def _opt(value: Any) -> Any:
    return value.get() if value is not None and value.isDefined() else None


#: Joins a Scala Seq's strings in one py4j call; no path contains it.
_SEP = "\u001f"


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

    return _per_gateway(_JSON_TOOLS, gateway, build)


_JSON_TOOLS: dict[int, tuple[Any, tuple[Any, Any]]] = {}


def plan_json(gateway: Any, plan: Any, max_chars: int) -> tuple[str | None, int]:
    """``plan.toJSON()`` (the same text) and its length; None when it exceeds ``max_chars``
    (then it is never sent over py4j)."""
    try:
        mapper, string_writer = _json_tools(gateway)
        writer = string_writer()
        mapper.writeValue(writer, plan.jsonValue())
        text = writer.getBuffer()
        length = text.length()
    except Exception:  # noqa: BLE001 - another json4s: the plain call, stall and all
        whole = plan.toJSON()
        return (whole if len(whole) <= max_chars else None), len(whole)
    if length > max_chars:
        return None, length
    if length <= _PIECE_CHARS or length > _PIECED_UP_TO:
        return text.toString(), length
    return "".join(text.substring(i, min(length, i + _PIECE_CHARS)) for i in range(0, length, _PIECE_CHARS)), length


@dataclass(frozen=True)
class LeafInfo:
    """A plan leaf as its JSON describes it."""

    kind: str  # the class's simple name
    has_table: bool  # a catalog table is attached (the JSON has "catalogTable" only then)


def _leaf_infos(snap: ActionSnapshot) -> list[list[LeafInfo]] | None:
    """From the plan's JSON, its leaves in ``collectLeaves()`` order (both are pre-order
    walks of the children), then each subquery plan's in ``subqueriesAll()`` order (see
    :func:`producer.spark.columns.leaf_groups`): one list per plan; None when unknown."""
    from producer.spark.columns import leaf_groups  # pure; the one definition of the order

    try:
        if snap.query_nodes is None:
            return None
        return [[LeafInfo(node["class"].rpartition(".")[2], node.get("catalogTable") is not None)
                 for node in group] for group in leaf_groups(snap.query_nodes)]
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def _input_leaves(gateway: Any, snap: ActionSnapshot, query: Any) -> list[Relation | None]:
    """Every leaf of ``query`` and of its subquery plans (a table read only inside
    ``IN (SELECT ...)``, ``EXISTS`` or a scalar subquery is an input too), in the order of
    :func:`_leaf_infos`. Without subqueries (known from the JSON), two calls as before."""
    groups = _leaf_infos(snap)
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
    return [relation_of(gateway, seq.apply(i), info) if info is None or info.kind in _RELATION_KINDS else None
            for seq, group in zip(seqs, infos) for i, info in enumerate(group)]


def _catalog_table(table: Any) -> Relation:
    ident = table.identifier()
    db = _opt(ident.database())
    name = f"{db}.{ident.table()}" if db else ident.table()
    loc = _opt(table.storage().locationUri())
    return Relation(table=name, location=loc.toString() if loc is not None else None,
                    fmt=_opt(table.provider()))


def _logical_relation(gateway: Any, leaf: Any, has_table: bool | None = None) -> Relation | None:
    relation = leaf.relation()
    kind = relation.getClass().getSimpleName()
    table = _opt(leaf.catalogTable()) if has_table is not False else None
    if kind == "HadoopFsRelation":
        rel = _catalog_table(table) if table is not None else Relation()
        joined = relation.location().rootPaths().mkString(_SEP)
        rel.paths = joined.split(_SEP) if joined else []
        rel.fmt = rel.fmt or relation.fileFormat().toString().lower()
        return rel
    if kind == "JDBCRelation":
        options = relation.jdbcOptions()
        return Relation(jdbc_url=options.url(), jdbc_table=options.tableOrQuery())
    if table is not None:
        return _catalog_table(table)
    return None


#: Leaf classes that can be data at rest; any other leaf (a local relation, a range) is not.
_RELATION_KINDS = frozenset({"LogicalRelation", "HiveTableRelation", "DataSourceV2Relation",
                             "DataSourceV2ScanRelation"})


def relation_of(gateway: Any, node: Any, leaf: LeafInfo | None = None) -> Relation | None:
    """A plan leaf (or write target) as a :class:`Relation`, or None when it is not data
    at rest (an in-memory DataFrame, a range). ``leaf``: what the plan's JSON tells about
    it, which saves asking."""
    kind = leaf.kind if leaf is not None else node.getClass().getSimpleName()
    if kind == "LogicalRelation":
        return _logical_relation(gateway, node, leaf.has_table if leaf is not None else None)
    if kind == "HiveTableRelation":
        return _catalog_table(node.tableMeta())
    if kind in ("DataSourceV2Relation", "DataSourceV2ScanRelation"):
        rel = node if kind == "DataSourceV2Relation" else node.relation()
        catalog = _opt(rel.catalog())
        return v2_table(rel.table(), catalog.name() if catalog is not None else None, _opt(rel.identifier()))
    return None


def v2_table(table: Any, catalog: str | None, ident: Any) -> Relation | None:
    """A DataSourceV2 ``Table`` (None for Spark's ``noop`` sink). Named as the official
    integration does: a JDBC catalog's table by its JDBC URL, a table with a ``location``
    property (Iceberg, Delta, the session catalog) by that location, any other by its
    catalog and identifier (``ident``; ``Table.name()`` when there is none)."""
    kind = table.getClass().getSimpleName()
    if kind == "NoopTable":
        return None
    name = str(ident.toString()) if ident is not None else str(table.name())
    if kind == "JDBCTable":
        return Relation(jdbc_url=table.jdbcOptions().url(), jdbc_table=name)
    location = table.properties().get("location")
    return Relation(v2_name=name, v2_catalog=catalog, location=str(location) if location is not None else None)


def _v2_created(created: Any) -> Relation:
    """The table a V2 CTAS/RTAS wrote (``ResolvedIdentifier``: catalog and identifier),
    loaded from its catalog for its location or JDBC URL; if it cannot be loaded (a
    failed CTAS), named by catalog and identifier."""
    catalog, ident = created.catalog(), created.identifier()
    catalog_name = str(catalog.name())
    try:
        rel = v2_table(catalog.loadTable(ident), catalog_name, ident)
    except Exception:  # noqa: BLE001 - not created, or not a TableCatalog
        rel = None
    return rel if rel is not None else Relation(v2_name=str(ident.toString()), v2_catalog=catalog_name)


def _unaliased(plan: Any) -> Any:
    """``plan`` without its ``SubqueryAlias`` wrappers (``MERGE INTO t AS target``)."""
    for _ in range(8):
        if plan.nodeName() != "SubqueryAlias":
            break
        plan = plan.child()
    return plan


def _table_location(session: Any, table: Any) -> str | None:
    try:
        meta = session.sessionState().catalog().getTableMetadata(table.identifier())
        return meta.location().toString()
    except Exception:  # noqa: BLE001 - the table may not exist (failed CTAS)
        return None


def _metrics(plan: Any, names: tuple[str, ...] = ("numOutputRows", "numOutputBytes", "numFiles")) -> dict[str, int]:
    out: dict[str, int] = {}
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
    for entry in metrics.mkString(_SEP).split(_SEP):
        match = _METRIC.fullmatch(entry)
        if match is not None and match.group(1) in names:
            out[match.group(1)] = int(match.group(2))
    return out or _metrics_one_by_one(metrics, names)


def _metrics_one_by_one(metrics: Any, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        metric = _opt(metrics.get(name))
        if metric is not None:
            out[name] = int(metric.value())
    return out


_METRIC = re.compile(r"(\w+) -> SQLMetric\(.*value: (-?\d+)\)", re.DOTALL)
#: "analysis -> PhaseSummary(<start ms>, <end ms>)" among the tracker's phases.
_ANALYSIS_PHASE = re.compile(r"(?:^|\u001f)analysis -> PhaseSummary\((\d+), ?-?\d+\)")


def _started_ms(qe: Any) -> int | None:
    try:
        phases = qe.tracker().phases()
        match = _ANALYSIS_PHASE.search(phases.mkString(_SEP))  # one call, not four
        return int(match.group(1)) if match is not None else _analysis_start_asked(phases)
    except Exception:  # noqa: BLE001 - older/other Spark: the caller falls back to the duration
        return None


def _analysis_start_asked(phases: Any) -> int | None:
    summary = _opt(phases.get("analysis"))
    return int(summary.startTimeMs()) if summary is not None else None


def snapshot(gateway: Any, session: Any, func: str, qe: Any, *, max_plan_bytes: int,
             error: Any = None, command: str | None = None) -> ActionSnapshot:
    """Everything lineage needs from one finished (or failed) action (``command``: its
    :func:`command_of`, when already known)."""
    analyzed = qe.analyzed()
    command = command or str(analyzed.nodeName())
    snap = ActionSnapshot(func=func, command=command, started_ms=_started_ms(qe))
    query = analyzed
    if command in FILE_WRITES:
        table = _opt(analyzed.catalogTable())
        snap.output = _catalog_table(table) if table is not None else Relation()
        snap.output.paths = [analyzed.outputPath().toString()]
        snap.output.fmt = snap.output.fmt or analyzed.fileFormat().toString().lower()
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in TABLE_CREATES:
        snap.output = _catalog_table(analyzed.tableDesc() if command != "CreateDataSourceTableAsSelectCommand"
                                     else analyzed.table())
        # saveAsTable into an existing table runs this command too: its SaveMode tells
        # an append (no lifecycle change) from an overwrite or a create.
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in TABLE_INSERTS:
        snap.output = _catalog_table(analyzed.table())
        snap.mode = "Overwrite" if analyzed.overwrite() else "Append"
        query = analyzed.query()
    elif command in SOURCE_SAVES:
        options = analyzed.options()
        source = analyzed.dataSource().getClass().getSimpleName()
        if "Jdbc" in source:
            snap.output = Relation(jdbc_url=_opt(options.get("url")), jdbc_table=_opt(options.get("dbtable")))
        elif _opt(options.get("path")) is not None:
            snap.output = Relation(paths=[_opt(options.get("path"))], fmt=source)
        snap.mode = analyzed.mode().toString()
        query = analyzed.query()
    elif command in V2_WRITES:
        snap.output = relation_of(gateway, analyzed.table())
        snap.mode = "Append" if command == "AppendData" else "Overwrite"
        query = analyzed.query()
    elif command in V2_CREATES:
        snap.output = _v2_created(analyzed.name())
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

    snap.query_json, snap.plan_bytes = plan_json(gateway, query, max_plan_bytes)
    if snap.output is not None:
        snap.output_schema_json = query.schema().json()
    snap.leaves = _input_leaves(gateway, snap, query)
    if error is None:
        try:
            snap.metrics = _metrics(qe.executedPlan())
        except Exception:  # noqa: BLE001 - metrics are a nicety
            snap.metrics = {}
    else:
        snap.error = str(error.getMessage() or error.toString())
        snap.stack = gateway.jvm.org.apache.spark.util.Utils.exceptionString(error)
    return snap
