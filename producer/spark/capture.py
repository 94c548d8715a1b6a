"""One action's :class:`~producer.spark.jvm.ActionSnapshot` -> OpenLineage events.

Pure: no py4j, no clock (times are handed in), so every rule here is unit-testable with
recorded snapshots. What it guarantees:

* datasets are named per the OpenLineage naming spec (:mod:`producer.spark.naming`), catalog
  tables by location with a ``symlinks`` facet naming the table;
* inputs carry ``schema`` and ``dataSource`` and, on success, ``inputStatistics`` from the
  scans' metrics (:mod:`producer.spark.input_stats`); the output also ``columnLineage`` (when the
  plan could be analysed), ``lifecycleStateChange`` (CREATE/OVERWRITE) and, on success,
  ``outputStatistics`` from the write's metrics;
* when analysis of the plan fails, the run still gets its START and COMPLETE/FAIL, with an
  ``extractionError`` facet naming what went wrong.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from producer import events
from producer.spark import columns, input_stats, job_names, naming, tags
from producer.spark.jvm import ActionSnapshot
from producer.spark.plan import Node, parse_plan
from producer.spark.relations import Relation

#: Where the custom facets' schemas are: this repository's spec/facets/, at the release _producer names.
SCHEMA_BASE = "https://raw.githubusercontent.com/lineage-relay/lineage-relay/0.1.0/spec/facets"


@dataclass(frozen=True)
class CaptureSettings:
    namespace: str = "default"
    app_job_name: str = "spark_application"
    spark_version: str = ""
    adapter_version: str = "0.1.0"
    column_lineage: bool = True
    #: False: whole-dataset column dependencies copied into every field (see columns.facet_fields).
    dataset_lineage: bool = True
    captured_properties: dict[str, str] = field(default_factory=dict)
    metastore_uris: str | None = None
    warehouse: str | None = None
    append_dataset_name: bool = True            # spark.openlineage.jobName.appendDatasetName
    replace_dot_with_underscore: bool = False   # spark.openlineage.jobName.replaceDotWithUnderscore
    #: (key, value, source) from spark.openlineage.job.tags / run.tags (see producer.spark.tags).
    job_tags: tuple[tuple[str, str, str], ...] = ()
    run_tags: tuple[tuple[str, str, str], ...] = ()
    #: (type, name) from spark.openlineage.job.owners.<type>.
    owners: tuple[tuple[str, str], ...] = ()


def snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", s).strip("_").lower()


def slug(name: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


@dataclass
class DatasetRef:
    namespace: str
    name: str
    symlink: tuple[str, str] | None = None


def dataset_refs(rel: Relation | None, settings: CaptureSettings, errors: list[dict] | None = None) -> list[DatasetRef]:
    """Every dataset a relation stands for (several root paths may be several datasets, a
    JDBC query the tables it reads); why there is none, when that is known, into ``errors``.
    A dataset whose namespace (or symlink namespace) could hold a credential is dropped
    (:func:`naming.unsafe_namespace`), with an error naming why but not the value."""
    refs = _dataset_refs(rel, settings, errors)
    safe = []
    for ref in refs:
        why = naming.unsafe_namespace(ref.namespace) or (
            naming.unsafe_namespace(ref.symlink[0]) if ref.symlink is not None else None)
        if why is None:
            safe.append(ref)
        elif errors is not None:
            errors.append({"errorMessage": f"dataset dropped: its namespace would hold {why}, "
                                           "possibly a credential"})
    return safe


def _dataset_refs(rel: Relation | None, settings: CaptureSettings, errors: list[dict] | None) -> list[DatasetRef]:
    if rel is None:
        return []
    if rel.jdbc_url:
        # A query (the reader's `query` option) is named by the tables it reads, when simple
        # enough to read them safely; else nothing (one made-up "<db>.query" linked
        # unrelated jobs).
        found, why = naming.jdbc_datasets(rel.jdbc_url, rel.jdbc_table or "")
        if why is not None and errors is not None:
            errors.append({"errorMessage": why})
        return [DatasetRef(naming.redact_uri(ns), name) for ns, name in found]
    if rel.v2_name:
        # A DataSourceV2 table: by location when it has one (named by a symlink), else by
        # its catalog and identifier.
        if rel.location:
            location = naming.redact_uri(rel.location)
            ns, name = naming.from_path(location)
            return [DatasetRef(ns, name, (_catalog_namespace(rel.v2_catalog, settings, location), rel.v2_name))]
        return [DatasetRef(_catalog_namespace(rel.v2_catalog, settings), rel.v2_name)]
    if rel.table:
        location = rel.location or (rel.paths[0] if rel.paths else None)
        if location is None:
            return [DatasetRef(naming.table_symlink_namespace(settings.metastore_uris, settings.warehouse), rel.table)]
        location = naming.redact_uri(location)
        ns, name = naming.from_path(location)
        # Named by the directory holding it (<warehouse>/mydb.db, an external table's parent
        # directory), as the official integration, or by the metastore.
        symlink = (naming.table_symlink_namespace(settings.metastore_uris, settings.warehouse, location), rel.table)
        return [DatasetRef(ns, name, symlink)]
    refs: list[DatasetRef] = []
    for path in rel.paths:
        ns, name = naming.from_path(naming.redact_uri(path))
        if not any(r.namespace == ns and r.name == name for r in refs):
            refs.append(DatasetRef(ns, name))
    return refs


def _catalog_namespace(catalog: str | None, settings: CaptureSettings, location: str | None = None) -> str:
    """Where a catalog's table names live: Spark's session catalog is the metastore or the
    directory holding the table's ``location`` (the warehouse without one), as for V1
    tables; another catalog is ``spark-catalog://<its name>`` (its name is only unique
    within the Spark configuration that defines it)."""
    if catalog in (None, "spark_catalog"):
        return naming.table_symlink_namespace(settings.metastore_uris, settings.warehouse, location)
    return f"spark-catalog://{catalog}"


def _type_name(data_type: Any) -> str:
    if isinstance(data_type, str):
        return data_type
    if isinstance(data_type, dict):
        return str(data_type.get("type", "struct"))
    return str(data_type)


def _schema_fields(data_type_fields: list[tuple[str, Any]]) -> list[dict]:
    out = []
    for name, dt in data_type_fields:
        entry: dict[str, Any] = {"name": name, "type": _type_name(dt)}
        if isinstance(dt, dict) and dt.get("type") == "struct":
            entry["fields"] = _schema_fields([(f["name"], f["type"]) for f in dt.get("fields", [])])
        out.append(entry)
    return out


def struct_fields(struct: dict) -> list[dict]:
    """A schema facet's fields from Spark's ``StructType.json()`` (parsed)."""
    return _schema_fields([(f["name"], f["type"]) for f in struct.get("fields", [])])


def _attr_schema(exprs: list[Node]) -> list[dict]:
    return _schema_fields([(e.name or "", _output_type(e)) for e in exprs])


def dataset_facets(ref: DatasetRef, schema: list[dict] | None) -> dict:
    facets: dict[str, Any] = {
        "dataSource": events.facet("DatasourceDatasetFacet",
                                   {"name": ref.namespace, "uri": _source_uri(ref.namespace)}),
    }
    if schema:
        facets["schema"] = events.facet("SchemaDatasetFacet", {"fields": schema})
    if ref.symlink is not None:
        facets["symlinks"] = events.facet("SymlinksDatasetFacet", {"identifiers": [
            {"namespace": ref.symlink[0], "name": ref.symlink[1], "type": "TABLE"}]})
    return facets


_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")


def _source_uri(namespace: str) -> str:
    """The facet's ``uri`` must be an absolute URI. The local file system's namespace is the
    bare scheme ``file`` (naming spec), whose URI form is ``file:///``; a namespace whose
    scheme is not a valid URI scheme (``spark_catalog``) gets one (``spark-catalog``), and
    characters a URI cannot hold are %-escaped."""
    scheme, colon, rest = namespace.partition(":")
    if not _URI_SCHEME.fullmatch(scheme):
        scheme = re.sub(r"[^A-Za-z0-9+.\-]", "-", scheme)
        scheme = scheme if scheme[:1].isalpha() else f"x{scheme}"
    return f"{scheme}:{quote(rest, safe=_URI_SAFE)}" if colon else f"{scheme}:///"


_URI_SAFE = "-._~:/?#[]@!$&'()*+,;=%"


#: Save mode -> lifecycleStateChange. ErrorIfExists writes only a new dataset; Append changes
#: none; Ignore writes nothing when the dataset exists (and whether it did is not known here).
_LIFECYCLE = {"Overwrite": "OVERWRITE", "Create": "CREATE", "ErrorIfExists": "CREATE"}


@dataclass
class ActionLineage:
    """What one action read and wrote, ready to put into its run's events."""

    job_name: str
    inputs: list[dict]
    outputs: list[dict]
    run_facets: dict
    job_facets: dict = field(default_factory=dict)


def _output_names(query: Node | None) -> list[tuple[str, Any]]:
    """The plan's output columns as its expressions say: the fallback when Spark's own
    schema of the written query is not at hand."""
    if query is None:
        return []
    # The root's output: a Project/Aggregate lists it; other roots pass their child's.
    node = query
    while True:
        for name in ("projectList", "aggregateExpressions", "output"):
            exprs = node.exprs(name)
            if exprs:
                return [(e.name or "", _output_type(e)) for e in exprs]
        if node.cls == "WithCTE" and node.children:
            node = node.children[-1]  # children: the CTE definitions, then the query
            continue
        if node.cls == "Window" and node.children:
            below = _output_names(node.children[0])
            return below + [(e.name or "", _output_type(e)) for e in node.exprs("windowExpressions")]
        if node.cls == "Join" and len(node.children) == 2:
            left = _output_names(node.children[0])
            return left if "Left" in str(node.fields.get("joinType")) and (
                "Semi" in str(node.fields.get("joinType")) or "Anti" in str(node.fields.get("joinType"))) \
                else left + _output_names(node.children[1])
        if not node.children:
            return []
        node = node.children[0]


def _output_schema(snap: ActionSnapshot, query: Node | None) -> list[dict] | None:
    """The written schema: Spark's own StructType when we have it (exact types), else
    what the plan's output expressions say."""
    if snap.output_schema_json:
        try:
            return struct_fields(orjson.loads(snap.output_schema_json))
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            pass
    return _schema_fields(_output_names(query)) if query is not None else None


def _output_type(expr: Node) -> Any:
    if "dataType" in expr.fields:
        return expr.fields["dataType"]
    child = expr.children[0] if expr.children else None
    while child is not None:
        if "dataType" in child.fields:
            return child.fields["dataType"]
        child = child.children[0] if child.children else None
    return "unknown"


def analyse(snap: ActionSnapshot, settings: CaptureSettings) -> ActionLineage:
    """Datasets, facets and column lineage of one action. Never raises: analysis errors
    become an ``extractionError`` run facet."""
    run_facets: dict[str, Any] = {}
    errors: list[dict] = []
    query: Node | None = None
    if snap.query_json is not None:
        try:
            query = parse_plan(snap.query_nodes)
        except (ValueError, orjson.JSONDecodeError) as err:
            errors.append({"errorMessage": f"plan JSON unreadable: {err}"})
    elif snap.plan_error is not None:
        errors.append({"errorMessage": f"plan JSON could not be built: {snap.plan_error}; "
                                       "column lineage and schemas skipped"})
    elif snap.plan_bytes:
        errors.append({"errorMessage": f"plan of {snap.plan_bytes} bytes (or, estimated before its JSON is built, "
                                       "its cost) is above the analysis limit; column lineage and schemas skipped"})

    # Inputs: one entry per distinct dataset; leaf -> dataset index for column lineage.
    # Leaves of subquery plans too, in the order the JVM side resolved them (their schemas).
    leaf_nodes = columns.plan_leaves(query) if query is not None else []
    inputs: list[DatasetRef] = []
    leaf_ds: list[tuple[int, ...]] = []    # the datasets that hold a leaf's columns
    leaf_sets: list[tuple[int, ...]] = []  # every dataset a leaf stands for
    schemas: dict[int, list[dict]] = {}
    for i, rel in enumerate(snap.leaves):
        refs = dataset_refs(rel, settings, errors)
        if not refs:
            leaf_ds.append(())
            leaf_sets.append(())
            continue
        found_all: list[int] = []
        for ref in refs:
            found = next((k for k, r in enumerate(inputs) if (r.namespace, r.name) == (ref.namespace, ref.name)), None)
            if found is None:
                inputs.append(ref)
                found = len(inputs) - 1
            found_all.append(found)
        leaf_sets.append(tuple(dict.fromkeys(found_all)))
        if rel is not None and rel.jdbc_url and naming.is_jdbc_query(rel.jdbc_table or ""):
            # A JDBC `query` read (or a `dbtable` FROM clause: `a o JOIN b c ON ...`, read as
            # SELECT * FROM it): its columns are the query's result (aliases, expressions:
            # `a * 2 AS dbl`), not columns of the tables it reads, and that result is no
            # dataset. Crediting its names to a table would invent columns (`orders.dbl`) and
            # a wrong schema for the table: no column lineage from it and no schema facet.
            leaf_ds.append(())
            continue
        # Several root directories read as one (spark.read.parquet(d1, d2)): each holds the
        # leaf's columns, so each is credited with them and gets their schema.
        leaf_ds.append(leaf_sets[-1])
        if i < len(leaf_nodes):
            for index in leaf_sets[-1]:
                if index not in schemas:
                    schemas[index] = _attr_schema(leaf_nodes[i].exprs("output"))

    outputs: list[dict] = []
    out_refs = dataset_refs(snap.output, settings, errors)
    if out_refs:
        ref = out_refs[0]
        schema = _output_schema(snap, query)
        # columnLineage is keyed by the schema facet's names, by position: a name found by
        # walking the plan can be a CTE definition's or an inner query's.
        column_names = [f["name"] for f in schema or []]
        facets = dataset_facets(ref, schema)
        if settings.column_lineage and query is not None:
            try:
                result = columns.trace(query, lambda i, _leaf: leaf_ds[i] if i < len(leaf_ds) else ())
                fields, dataset_level = columns.facet_fields(
                    result, [(r.namespace, r.name) for r in inputs], column_names or None,
                    dataset_lineage=settings.dataset_lineage)
                body: dict[str, Any] = {"fields": fields}
                if dataset_level:
                    body["dataset"] = dataset_level
                facets["columnLineage"] = events.facet("ColumnLineageDatasetFacet", body)
            except Exception as err:  # noqa: BLE001 - never let analysis break capture
                errors.append({"errorMessage": f"column lineage: {err!r}",
                               "stackTrace": traceback.format_exc(limit=5)})
        lifecycle = _LIFECYCLE.get(snap.mode or "")
        if lifecycle:
            facets["lifecycleStateChange"] = events.facet("LifecycleStateChangeDatasetFacet",
                                                          {"lifecycleStateChange": lifecycle})
        output_facets = {}
        if snap.error is None and snap.metrics:
            stats = {"rowCount": snap.metrics.get("numOutputRows")}
            if "numOutputBytes" in snap.metrics:
                stats["size"] = snap.metrics["numOutputBytes"]
            if "numFiles" in snap.metrics:
                stats["fileCount"] = snap.metrics["numFiles"]
            if stats["rowCount"] is not None:
                output_facets["outputStatistics"] = events.facet("OutputStatisticsOutputDatasetFacet", stats)
        outputs.append(events.dataset(ref.namespace, ref.name, facets, output_facets=output_facets))

    # Named as the official Spark integration names the job (see producer.spark.job_names).
    job_name = job_names.child_name(
        settings.app_job_name, snap.node_name, job_names.suffix(snap, out_refs[0].name if out_refs else None),
        append_dataset_name=settings.append_dataset_name,
        replace_dot_with_underscore=settings.replace_dot_with_underscore)
    if errors:
        run_facets["extractionError"] = events.facet("ExtractionErrorRunFacet", {
            "totalTasks": 1, "failedTasks": len(errors), "errors": errors})
    # The statement's text, as the official integration's SQLJobFacet (spark.sql actions
    # only), credentials masked (naming.mask_sql).
    job_facets = ({"sql": events.facet("SQLJobFacet", {"query": naming.mask_sql(snap.sql_text)})}
                  if snap.sql_text else {})
    read = _input_statistics(snap, leaf_nodes, leaf_sets)
    return ActionLineage(
        job_name=job_name,
        inputs=[events.dataset(r.namespace, r.name, dataset_facets(r, schemas.get(k)), input_facets=(
            {"inputStatistics": events.facet("InputStatisticsInputDatasetFacet", read[k])} if k in read else None))
            for k, r in enumerate(inputs)],
        outputs=outputs, run_facets=run_facets, job_facets=job_facets)


def _input_statistics(snap: ActionSnapshot, leaf_nodes: list[Node],
                      leaf_sets: list[tuple[int, ...]]) -> dict[int, dict[str, int]]:
    """What each input's scans read (see :mod:`producer.spark.input_stats`): nothing for a
    failed action (partial counts), nor when the plan's leaves are not all known."""
    if snap.error is not None or not snap.scans or len(leaf_nodes) != len(leaf_sets):
        return {}
    leaf_ids = [frozenset(e.expr_id for e in leaf.exprs("output") if e.expr_id is not None) for leaf in leaf_nodes]
    return input_stats.input_statistics(snap.scans, leaf_ids, leaf_sets)


def engine_facets(settings: CaptureSettings) -> dict:
    facets = {"processing_engine": events.facet("ProcessingEngineRunFacet", {
        "version": settings.spark_version, "name": "spark", "openlineageAdapterVersion": settings.adapter_version})}
    if settings.captured_properties:
        facets["spark_properties"] = events.custom_facet(
            {"properties": dict(settings.captured_properties)},
            schema_url=f"{SCHEMA_BASE}/SparkPropertiesRunFacet.json")
    if settings.run_tags:
        facets["tags"] = events.facet("TagsRunFacet", {"tags": tags.tag_list(settings.run_tags)})
    return facets


def job_type(kind: str, processing: str = "BATCH") -> dict:
    return {"jobType": events.facet("JobTypeJobFacet", {"processingType": processing, "integration": "SPARK",
                                                        "jobType": kind})}


def job_facets(settings: CaptureSettings, kind: str, processing: str = "BATCH") -> dict:
    """Every Spark job's facets: its type, and the configured tags and owners."""
    facets = job_type(kind, processing)
    if settings.job_tags:
        facets["tags"] = events.facet("TagsJobFacet", {"tags": tags.tag_list(settings.job_tags)})
    if settings.owners:
        facets["ownership"] = events.facet("OwnershipJobFacet", {
            "owners": [{"name": name, "type": kind_} for kind_, name in settings.owners]})
    return facets


def error_facet(message: str, stack: str | None, language: str = "JAVA") -> dict:
    """The errorMessage facet; credentials masked as in the sql facet (Spark's messages quote
    the statement's text around a failing expression)."""
    body = {"message": naming.mask_sql(message), "programmingLanguage": language}
    if stack:
        body["stackTrace"] = naming.mask_sql(stack)
    return {"errorMessage": events.facet("ErrorMessageRunFacet", body)}
