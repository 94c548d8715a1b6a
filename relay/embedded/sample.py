"""Realistic OpenLineage traffic for the demo, the tests and the benchmarks.

:func:`spark_run` builds the events one Spark action emits (what openlineage-spark sends:
START, RUNNING..., then COMPLETE or FAIL, with the usual facets). :func:`sample_stream`
interleaves many runs into ``(key, value)`` Kafka records exactly as the official
OpenLineage Kafka transports write them, optionally with byte-identical duplicates and
with terminal events that overtake their START, the two faults the relay must absorb.

Guarantees: every event is valid against OpenLineage spec 2-0-2 and every facet carries
``_producer`` and the ``_schemaURL`` of its real facet schema; within a run, eventTimes
strictly increase (ISO-8601, millisecond precision, ``Z``); the same arguments and seed
give the same bytes. Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import orjson

PRODUCER_URI = "https://github.com/OpenLineage/OpenLineage/tree/1.24.2/integration/spark"

_SPEC = "https://openlineage.io/spec"
SCHEMA_URL = f"{_SPEC}/2-0-2/OpenLineage.json#/$defs/RunEvent"
DATASET_EVENT_SCHEMA_URL = f"{_SPEC}/2-0-2/OpenLineage.json#/$defs/DatasetEvent"
JOB_EVENT_SCHEMA_URL = f"{_SPEC}/2-0-2/OpenLineage.json#/$defs/JobEvent"
#: What openlineage-spark puts in ``_schemaURL`` of its own (non-standard) run facets.
CUSTOM_RUN_FACET_SCHEMA_URL = f"{_SPEC}/2-0-2/OpenLineage.json#/$defs/RunFacet"

#: ``_schemaURL`` of each standard facet used here, as the spec's facet files define them.
FACET_SCHEMA_URLS: Mapping[str, str] = MappingProxyType(
    {
        "parent": f"{_SPEC}/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet",
        "processing_engine": f"{_SPEC}/facets/1-1-1/ProcessingEngineRunFacet.json#/$defs/ProcessingEngineRunFacet",
        "errorMessage": f"{_SPEC}/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet",
        "jobType": f"{_SPEC}/facets/2-0-4/JobTypeJobFacet.json#/$defs/JobTypeJobFacet",
        "sql": f"{_SPEC}/facets/1-1-0/SQLJobFacet.json#/$defs/SQLJobFacet",
        "schema": f"{_SPEC}/facets/1-2-0/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet",
        "dataSource": f"{_SPEC}/facets/1-0-1/DatasourceDatasetFacet.json#/$defs/DatasourceDatasetFacet",
        "columnLineage": f"{_SPEC}/facets/1-2-0/ColumnLineageDatasetFacet.json#/$defs/ColumnLineageDatasetFacet",
        "outputStatistics": (
            f"{_SPEC}/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet"
        ),
    }
)

JobRef = tuple[str, str, str]
"""``(job namespace, job name, run id)`` of a parent or root run."""

_SPARK_VERSION = "3.5.1"
_ADAPTER_VERSION = "1.24.2"
_COLUMNS = (
    ("id", "long"),
    ("customer_id", "long"),
    ("amount", "decimal(12,2)"),
    ("currency", "string"),
    ("status", "string"),
    ("created_at", "timestamp"),
    ("country", "string"),
    ("is_active", "boolean"),
    ("score", "double"),
    ("quantity", "integer"),
    ("event_date", "date"),
    ("updated_at", "timestamp"),
)
_RAW_NAMESPACE = "s3://acme-lake-raw"
_WAREHOUSE_NAMESPACE = "s3://acme-warehouse"
_TABLES = ("orders", "customers", "payments", "shipments", "products", "sessions", "refunds", "inventory")
_SPARK_NAMESPACES = ("spark-prod", "spark-analytics")
_APPS = ("orders_etl", "billing_daily", "customer_360", "inventory_sync", "sessionize")
_COMMANDS = ("execute_insert_into_hadoop_fs_relation_command", "create_data_source_table_as_select_command")
_AIRFLOW_NAMESPACE = "airflow-prod"
_FAILURE = "org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 7.0 failed 4 times"


def new_run_id(rng: random.Random) -> str:
    """A random (version 4) UUID drawn from ``rng``, so runs are reproducible per seed."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def iso_time(moment: datetime) -> str:
    """``2024-05-01T02:00:00.000Z``; a naive datetime is taken to be UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


def message_key(event: Mapping[str, Any]) -> str:
    """The Kafka key the OpenLineage Kafka transports give ``event``.

    RunEvent: ``run:<ns>/<name>`` of the root parent job, else the parent job, else the
    run's own job, so a whole run tree lands on one partition. DatasetEvent:
    ``dataset:<ns>/<name>``. JobEvent: ``job:<ns>/<name>``.
    """
    if "run" in event:
        parent = (event["run"].get("facets") or {}).get("parent") or {}
        job = (parent.get("root") or {}).get("job") or parent.get("job") or {}
        if not (job.get("namespace") and job.get("name")):
            job = event["job"]
        return f"run:{job['namespace']}/{job['name']}"
    if "dataset" in event:
        return f"dataset:{event['dataset']['namespace']}/{event['dataset']['name']}"
    return f"job:{event['job']['namespace']}/{event['job']['name']}"


def _facet(facet_name: str, /, **fields: Any) -> dict[str, Any]:
    return {"_producer": PRODUCER_URI, "_schemaURL": FACET_SCHEMA_URLS[facet_name], **fields}


def _job_type() -> dict[str, Any]:
    return _facet("jobType", processingType="BATCH", integration="SPARK", jobType="SQL_JOB")


def _fields(columns: int) -> list[tuple[str, str]]:
    return [_COLUMNS[i] if i < len(_COLUMNS) else (f"attr_{i}", "string") for i in range(columns)]


def _dataset(namespace: str, name: str, columns: int, **extra_facets: dict[str, Any]) -> dict[str, Any]:
    schema = [{"name": col, "type": typ, "ordinal_position": n} for n, (col, typ) in enumerate(_fields(columns), 1)]
    return {
        "namespace": namespace,
        "name": name,
        "facets": {
            "schema": _facet("schema", fields=schema),
            "dataSource": _facet("dataSource", name=namespace, uri=namespace),
            **extra_facets,
        },
    }


def _column_lineage(inputs: Sequence[tuple[str, str]], columns: int) -> dict[str, Any]:
    def source(dataset: tuple[str, str], field: str, kind: str, subtype: str) -> dict[str, Any]:
        transformation = {"type": kind, "subtype": subtype, "masking": False}
        return {"namespace": dataset[0], "name": dataset[1], "field": field, "transformations": [transformation]}

    names = [column for column, _ in _fields(columns)]
    fields = {
        column: {"inputFields": [source(inputs[i % len(inputs)], column, "DIRECT", "IDENTITY")]}
        for i, column in enumerate(names)
    }
    # Spark also reports the columns a filter or join read as lineage into the whole dataset.
    dataset_wide = [source(inputs[0], names[0] if names else "id", "INDIRECT", "FILTER")]
    return _facet("columnLineage", fields=fields, dataset=dataset_wide)


def _parent_facet(parent: JobRef, root: JobRef) -> dict[str, Any]:
    def ref(job: JobRef) -> dict[str, Any]:
        return {"run": {"runId": job[2]}, "job": {"namespace": job[0], "name": job[1]}}

    return _facet("parent", **ref(parent), root=ref(root))


def spark_run(
    job_namespace: str,
    job_name: str,
    *,
    run_id: str | None = None,
    start: datetime,
    rng: random.Random,
    columns: int = 8,
    with_running: bool | int = True,
    fail: bool = False,
    parent: JobRef | None = None,
    root: JobRef | None = None,
) -> list[dict[str, Any]]:
    """The RunEvents of one Spark action, in emission order.

    START (inputs with ``schema`` and ``dataSource``; ``processing_engine`` and the custom
    ``spark_properties`` run facets; ``jobType`` job facet), then ``int(with_running)``
    RUNNING events (``True`` is one), then COMPLETE with outputs carrying ``schema``,
    ``dataSource``, ``columnLineage`` and the ``outputStatistics`` output facet, or, with
    ``fail``, FAIL with an ``errorMessage`` run facet. ``parent`` adds a ``parent`` run
    facet to every event; its ``root`` is ``root`` or, if not given, the parent itself.
    Everything random (run id, datasets, timings, statistics) comes from ``rng``.
    """
    run_id = run_id or new_run_id(rng)
    app = job_name.split(".", 1)[0]
    inputs = [(_RAW_NAMESPACE, f"raw/{table}") for table in rng.sample(_TABLES, rng.randint(1, 2))]
    output = (_WAREHOUSE_NAMESPACE, f"warehouse/{job_name.rsplit('.', 1)[-1]}")

    base_run_facets: dict[str, Any] = {
        "processing_engine": _facet(
            "processing_engine", version=_SPARK_VERSION, name="spark", openlineageAdapterVersion=_ADAPTER_VERSION
        ),
    }
    if parent is not None:
        base_run_facets["parent"] = _parent_facet(parent, root or parent)

    def event(event_type: str, moment: datetime, run_facets: dict[str, Any], outputs: list[dict[str, Any]]):
        return {
            "eventTime": iso_time(moment),
            "producer": PRODUCER_URI,
            "schemaURL": SCHEMA_URL,
            "eventType": event_type,
            "run": {"runId": run_id, "facets": {**base_run_facets, **run_facets}},
            "job": {"namespace": job_namespace, "name": job_name, "facets": {"jobType": _job_type()}},
            "inputs": [_dataset(ns, name, columns) for ns, name in inputs],
            "outputs": outputs,
        }

    spark_properties = {
        "_producer": PRODUCER_URI,
        "_schemaURL": CUSTOM_RUN_FACET_SCHEMA_URL,
        "properties": {"spark.master": "yarn", "spark.app.name": app},
    }
    moment = start
    events = [event("START", moment, {"spark_properties": spark_properties}, [])]
    for _ in range(int(with_running)):
        moment += timedelta(milliseconds=rng.randint(500, 30_000))
        events.append(event("RUNNING", moment, {}, []))
    moment += timedelta(milliseconds=rng.randint(1_000, 120_000))
    if fail:
        error = _facet("errorMessage", message=_FAILURE, programmingLanguage="JAVA", stackTrace=f"{_FAILURE}\n\tat ...")
        events.append(event("FAIL", moment, {"errorMessage": error}, [_dataset(*output, columns)]))
    else:
        written = _dataset(*output, columns, columnLineage=_column_lineage(inputs, columns))
        rows = rng.randint(1_000, 5_000_000)
        written["outputFacets"] = {
            "outputStatistics": _facet(
                "outputStatistics", rowCount=rows, size=rows * rng.randint(40, 400), fileCount=rng.randint(1, 64)
            )
        }
        events.append(event("COMPLETE", moment, {}, [written]))
    return events


def dataset_event(namespace: str, name: str, *, event_time: datetime, columns: int = 8) -> dict[str, Any]:
    """A DatasetEvent declaring a dataset's ``schema`` and ``dataSource`` (static metadata)."""
    return {
        "eventTime": iso_time(event_time),
        "producer": PRODUCER_URI,
        "schemaURL": DATASET_EVENT_SCHEMA_URL,
        "dataset": _dataset(namespace, name, columns),
    }


def job_event(
    namespace: str,
    name: str,
    *,
    event_time: datetime,
    inputs: Sequence[tuple[str, str]] = (),
    outputs: Sequence[tuple[str, str]] = (),
    sql: str | None = None,
) -> dict[str, Any]:
    """A JobEvent declaring a job's lineage (``inputs``/``outputs`` as ``(ns, name)``) and type."""
    facets: dict[str, Any] = {"jobType": _job_type()}
    if sql is not None:
        facets["sql"] = _facet("sql", query=sql)
    return {
        "eventTime": iso_time(event_time),
        "producer": PRODUCER_URI,
        "schemaURL": JOB_EVENT_SCHEMA_URL,
        "job": {"namespace": namespace, "name": name, "facets": facets},
        "inputs": [{"namespace": ns, "name": n} for ns, n in inputs],
        "outputs": [{"namespace": ns, "name": n} for ns, n in outputs],
    }


def sample_stream(
    n_runs: int,
    *,
    seed: int,
    duplicate_ratio: float = 0.0,
    out_of_order_ratio: float = 0.0,
    running_per_run: tuple[int, int] = (0, 3),
    columns: int = 8,
) -> list[tuple[bytes, bytes]]:
    """``n_runs`` Spark runs as Kafka ``(key, value)`` records, in topic order.

    Runs overlap in time and their events are interleaved by eventTime, so each run's own
    order is kept. About a third of the runs are Airflow-triggered (``parent`` facet; their
    key is the root DAG's job), about one in ten fails. Each run has between
    ``running_per_run[0]`` and ``running_per_run[1]`` RUNNING events (inclusive).

    Faults, both exact in count: ``round(n_runs * out_of_order_ratio)`` runs have their
    terminal event moved to just before their START; then ``round(events *
    duplicate_ratio)`` records re-appear as byte-identical copies 1 to 4 positions after
    the original (or at the end of the stream). Same arguments, same bytes.
    """
    for knob, ratio in (("duplicate_ratio", duplicate_ratio), ("out_of_order_ratio", out_of_order_ratio)):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"{knob} must be between 0 and 1, got {ratio}")
    low, high = running_per_run
    if not 0 <= low <= high:
        raise ValueError(f"running_per_run must be (low, high) with 0 <= low <= high, got {running_per_run}")

    rng = random.Random(seed)
    epoch = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
    # (eventTime, run, position in run, record); sorting it is the topic's interleaving.
    timeline: list[tuple[str, int, int, tuple[bytes, bytes]]] = []
    for run in range(n_runs):
        app, command, table = rng.choice(_APPS), rng.choice(_COMMANDS), rng.choice(_TABLES)
        parent = root = None
        if rng.random() < 0.3:
            dag = f"{app}_dag"
            root = (_AIRFLOW_NAMESPACE, dag, new_run_id(rng))
            parent = (_AIRFLOW_NAMESPACE, f"{dag}.spark_{table}", new_run_id(rng))
        # Starts spread over ~2 s per run while runs last seconds to minutes: they overlap.
        start = epoch + timedelta(milliseconds=rng.randint(0, max(1, n_runs) * 2_000))
        events = spark_run(
            rng.choice(_SPARK_NAMESPACES),
            f"{app}.{command}.{table}_daily",
            start=start,
            rng=rng,
            columns=columns,
            with_running=rng.randint(low, high),
            fail=rng.random() < 0.1,
            parent=parent,
            root=root,
        )
        for position, event in enumerate(events):
            record = (message_key(event).encode(), orjson.dumps(event))
            timeline.append((event["eventTime"], run, position, record))
    timeline.sort(key=lambda entry: entry[:3])

    # Out of order: the terminal record takes a slot just before its run's START.
    slots: list[tuple[float, tuple[bytes, bytes]]] = [(float(i), entry[3]) for i, entry in enumerate(timeline)]
    start_slot = {entry[1]: i for i, entry in enumerate(timeline) if entry[2] == 0}
    last_slot = {entry[1]: i for i, entry in enumerate(timeline)}
    for run in rng.sample(range(n_runs), round(n_runs * out_of_order_ratio)):
        terminal = last_slot[run]
        slots[terminal] = (start_slot[run] - 0.5, slots[terminal][1])
    records = [record for _, record in sorted(slots, key=lambda slot: slot[0])]

    # Duplicates: a producer retry re-sends the same bytes a few records later.
    copies = sorted(
        (min(original + rng.randint(1, 4), len(records) - 1), original)
        for original in rng.sample(range(len(records)), round(len(records) * duplicate_ratio))
    )
    out: list[tuple[bytes, bytes]] = []
    pending = iter(copies)
    nxt = next(pending, None)
    for index, record in enumerate(records):
        out.append(record)
        while nxt is not None and nxt[0] == index:
            out.append(records[nxt[1]])
            nxt = next(pending, None)
    return out
