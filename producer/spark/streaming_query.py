"""The py4j reads of a running streaming query (its JVM ``StreamExecution``) that name a run's
datasets: its Kafka sources' servers, the schema it writes, its Kafka sink's topic. For
:mod:`producer.spark.streaming`, whose docstring says when each is read (once a run, by the
thread reading the run's progress, outside the run's lock).

What each read costs, and what it gives when there is nothing to read:

* :func:`_kafka_servers`: ``kafka.bootstrap.servers`` of each streaming leaf of the query's
  analysed plan, in order (None for a leaf without them), so that each Kafka source is named in
  its own cluster (a query may read two): three py4j calls, then four per leaf, two more for
  a ``StreamingRelationV2`` leaf, one more at the end; None when there is no query.
* :func:`_static_relations`: the data at rest a query reads besides its streams (a
  stream-static join's table or files), from the leaves of its logical plan that its JSON
  (read once a run for the sources' schemas) shows to be relations (:func:`static_leaves`):
  none, no py4j call; else two, then one per such leaf and what the batch capture pays to
  read that relation.
* :func:`_output_schema`: the schema the query writes, its analysed plan's (three py4j calls);
  None when there is no query or the schema has no fields.
* :func:`_kafka_sink`: a Kafka sink (whose description names no topic) as the ``topic`` of the
  writer's options in ``kafka://<first of its kafka.bootstrap.servers>``, from the write node of
  the query's logical plan: ten py4j calls when the option keys are written in lower case;
  otherwise a walk over the options, two more per option (:func:`_option`). When it is not
  known, the reason as text instead of a dataset: no query, a plan whose node holds no
  writer's options (a continuous-trigger query's), no ``topic`` option (each row names its
  topic), no ``kafka.bootstrap.servers`` option.

A read that fails raises (py4j's ``Py4JJavaError``; its ``Py4JError`` once the gateway is gone;
or whatever else went wrong): the caller catches it and names it, as :func:`_text` gives it
(one py4j call for a Java exception), in the run's ``extractionError`` facet.
"""

from __future__ import annotations

from typing import Any

import orjson

from producer.spark import capture
from producer.spark.capture import DatasetRef
from producer.spark.relations import RELATION_KINDS, LeafInfo, Relation, relation_of
from producer.spark.streaming_names import kafka_namespace

#: The streaming leaves of a query's analysed plan: one per source (a source used twice, twice).
_STREAMING_RELATIONS = frozenset({"StreamingRelationV2", "StreamingRelation", "StreamingExecutionRelation"})


def _kafka_servers(query: Any) -> list[str | None] | None:
    """``kafka.bootstrap.servers`` of each streaming leaf of the query's analysed plan, in its
    pre-order (the order of the progress's sources, see
    :func:`producer.spark.streaming_names.pair_servers`): None for a leaf without them (not a
    Kafka source); None when there is no query. Only ``StreamingRelationV2`` leaves carry the
    reader's options; batch leaves (a stream-static join's table) are skipped."""
    if query is None:
        return None
    found: list[str | None] = []
    leaves = query.analyzedPlan().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        kind = leaf.getClass().getSimpleName()
        if kind not in _STREAMING_RELATIONS:
            continue
        servers = leaf.extraOptions().get("kafka.bootstrap.servers") if kind == "StreamingRelationV2" else None
        found.append(str(servers) if servers else None)
    return found


def static_leaves(plan_json: str) -> list[tuple[int, LeafInfo, list[dict]]]:
    """The leaves of a streaming query's logical plan (``toJSON``) that are data at rest (a
    stream-static join's table or files: ``LogicalRelation``, ``HiveTableRelation``,
    ``DataSourceV2Relation``), as (position in ``collectLeaves()``, what the JSON tells of it,
    its schema-facet fields)."""
    nodes = orjson.loads(plan_json)
    found = []
    leaves = [n for n in nodes if isinstance(n, dict) and n.get("num-children") == 0]
    for index, node in enumerate(leaves):
        kind = str(node.get("class", "")).rsplit(".", 1)[-1]
        if kind not in RELATION_KINDS:
            continue
        attrs = [a[0] for a in node.get("output") or [] if isinstance(a, list) and a and isinstance(a[0], dict)]
        schema = capture.struct_fields({"fields": [{"name": str(a.get("name", "")), "type": a.get("dataType")}
                                                   for a in attrs]})
        found.append((index, LeafInfo(kind, node.get("catalogTable") is not None), schema))
    return found


def _static_relations(gateway: Any, query: Any, leaves: list[tuple[int, LeafInfo, list[dict]]]
                      ) -> list[tuple[Relation | None, list[dict]]]:
    """Where each of :func:`static_leaves` keeps its data, read as the batch capture reads an
    input leaf (:func:`producer.spark.relations.relation_of`): two py4j calls, then one per
    leaf and what reading its relation costs (a path: about six). None when there are none."""
    if query is None or not leaves:
        return []
    plan_leaves = query.logicalPlan().collectLeaves()
    return [(relation_of(gateway, plan_leaves.apply(index), leaf), schema) for index, leaf, schema in leaves]


def _output_schema(query: Any) -> list[dict] | None:
    """The schema the query writes, as a schema facet's fields: its analysed plan's (three
    py4j calls; Spark's StructType JSON, read as the batch capture reads a written schema)."""
    if query is None:
        return None
    return capture.struct_fields(orjson.loads(str(query.analyzedPlan().schema().json()))) or None


def _kafka_sink(query: Any) -> DatasetRef | str:
    """A Kafka sink's topic as a dataset, from the writer's options (``topic``,
    ``kafka.bootstrap.servers``) in the query's logical plan (``WriteToMicroBatchDataSource``,
    or its V1 form), or why it is not known (any other node holds no options). Ten py4j calls
    when the keys are written in lower case (see :func:`_option`). Read once the query runs:
    the plan is built on the query's own thread when its first batch starts, and must not be
    built elsewhere."""
    if query is None:
        return "the query was not found"
    plan = query.logicalPlan()
    node = str(plan.getClass().getSimpleName())
    if node not in _WRITE_NODES:
        return f"the query's plan is a {node}, which holds no writer options"
    options = plan.writeOptions()
    topic, servers = _option(options, "topic"), _option(options, "kafka.bootstrap.servers")
    if not topic:
        return "no topic option: each row names its topic (its topic column)"
    if not servers:
        return "no kafka.bootstrap.servers option"
    return DatasetRef(kafka_namespace(servers), topic)


#: The write nodes of a micro-batch query's logical plan (a V2 sink's, a V1 sink's): they hold the writer's options.
_WRITE_NODES = frozenset({"WriteToMicroBatchDataSource", "WriteToMicroBatchDataSourceV1"})


def _text(err: BaseException) -> str:
    """An error for an ``extractionError`` facet: its type and its message's first line; for a
    py4j error, the Java exception's own (its message goes on with the whole Java stack trace)."""
    message = str(err)
    java = getattr(err, "java_exception", None)
    if java is not None:
        try:
            message = str(java.toString())
        except Exception:  # noqa: BLE001 - the gateway may be gone: py4j's own text then
            pass
    first = message.strip().split("\n", 1)[0].strip()
    return f"{type(err).__name__}: {first[:300]}" if first else type(err).__name__


def _option(options: Any, key: str) -> str | None:
    """A writer option (a Scala ``Map[String, String]``), its key in any case as Spark
    compares them: three py4j calls when found as given; otherwise two, then a walk over the
    keys (one call, two per key looked at, one more when none matches) and two if one does."""
    found = options.get(key)
    if found is not None and found.isDefined():
        return str(found.get())
    keys = options.keysIterator()
    while keys.hasNext():
        name = keys.next()
        if str(name).lower() == key:
            return str(options.get(name).get())
    return None
