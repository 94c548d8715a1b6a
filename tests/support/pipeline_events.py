"""A medallion pipeline's OpenLineage events, shaped like openlineage-spark's: landing files
-> bronze -> silver.orders -> gold.daily_revenue and gold.customer_ltv.

Tables are written as Spark does: the dataset is the warehouse path
(``s3://acme-lakehouse`` / ``warehouse/silver.db/orders``) and the catalog table name is a
``symlinks`` identifier (``silver.orders``). Outputs carry ``schema``, ``dataSource``,
``symlinks`` and ``columnLineage`` (per-column ``inputFields`` with DIRECT transformations,
plus dataset-wide INDIRECT JOIN / FILTER / GROUP_BY entries). Every event is valid against
OpenLineage spec 2-0-2. Deterministic: the same bytes on every call.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from relay.embedded.sample import FACET_SCHEMA_URLS, PRODUCER_URI, SCHEMA_URL

SYMLINKS_URL = "https://openlineage.io/spec/facets/1-0-1/SymlinksDatasetFacet.json#/$defs/SymlinksDatasetFacet"
JOB_NAMESPACE = "spark-prod"
WAREHOUSE = "s3://acme-lakehouse"
METASTORE = "hive://metastore.acme.internal:9083"
START = datetime(2024, 6, 3, 1, 0, tzinfo=UTC)

Columns = list[tuple[str, str]]

LANDING_ORDERS = ("file", "/data/landing/orders.csv")
LANDING_CUSTOMERS = ("s3://acme-landing", "exports/customers.json")


def table(layer: str, name: str) -> tuple[str, str]:
    return WAREHOUSE, f"warehouse/{layer}.db/{name}"


BRONZE_ORDERS = table("bronze", "orders")
BRONZE_CUSTOMERS = table("bronze", "customers")
SILVER_ORDERS = table("silver", "orders")
GOLD_DAILY_REVENUE = table("gold", "daily_revenue")
GOLD_CUSTOMER_LTV = table("gold", "customer_ltv")


def ds_id(dataset: tuple[str, str]) -> str:
    """The store's id: ``file:/data/x`` for a local path, ``namespace/name`` otherwise."""
    namespace, name = dataset
    return f"file:{name}" if namespace == "file" else f"{namespace}/{name}"


def job_id(name: str) -> str:
    return f"{JOB_NAMESPACE}/{name}"


ORDER_COLUMNS: Columns = [("order_id", "long"), ("customer_id", "long"), ("amount", "decimal(12,2)"),
                          ("currency", "string"), ("status", "string"), ("order_ts", "timestamp")]
CUSTOMER_COLUMNS: Columns = [("customer_id", "long"), ("name", "string"), ("email", "string"),
                             ("country", "string"), ("signup_date", "date")]
SILVER_COLUMNS: Columns = [("order_id", "long"), ("customer_id", "long"), ("customer_name", "string"),
                           ("country", "string"), ("amount_eur", "decimal(12,2)"), ("order_date", "date"),
                           ("status", "string")]
DAILY_REVENUE_COLUMNS: Columns = [("order_date", "date"), ("country", "string"),
                                  ("total_revenue", "decimal(18,2)"), ("order_count", "long")]
LTV_COLUMNS: Columns = [("customer_id", "long"), ("customer_name", "string"),
                        ("lifetime_revenue", "decimal(18,2)"), ("first_order_date", "date")]
SCHEMAS: dict[tuple[str, str], Columns] = {
    LANDING_ORDERS: ORDER_COLUMNS,
    LANDING_CUSTOMERS: CUSTOMER_COLUMNS,
    BRONZE_ORDERS: [*ORDER_COLUMNS, ("ingested_at", "timestamp")],
    BRONZE_CUSTOMERS: [("customer_id", "long"), ("name", "string"), ("email_sha256", "string"),
                       ("country", "string"), ("signup_date", "date")],
    SILVER_ORDERS: SILVER_COLUMNS,
    GOLD_DAILY_REVENUE: DAILY_REVENUE_COLUMNS,
    GOLD_CUSTOMER_LTV: LTV_COLUMNS,
}

# (source dataset, source column, type, subtype[, masking]) per output column
Sources = list[tuple[Any, ...]]


def _same(source: tuple[str, str], columns: Columns) -> dict[str, Sources]:
    return {name: [(source, name, "DIRECT", "IDENTITY")] for name, _ in columns}


JOBS: list[dict[str, Any]] = [
    {"name": "bronze_ingest.orders", "inputs": [LANDING_ORDERS], "output": BRONZE_ORDERS,
     "fields": _same(LANDING_ORDERS, ORDER_COLUMNS), "dataset": []},
    {"name": "bronze_ingest.customers", "inputs": [LANDING_CUSTOMERS], "output": BRONZE_CUSTOMERS,
     "fields": {**_same(LANDING_CUSTOMERS, [c for c in CUSTOMER_COLUMNS if c[0] != "email"]),
                "email_sha256": [(LANDING_CUSTOMERS, "email", "DIRECT", "TRANSFORMATION", True)]},
     "dataset": []},
    {"name": "silver_build.orders", "inputs": [BRONZE_ORDERS, BRONZE_CUSTOMERS], "output": SILVER_ORDERS,
     "fields": {
         "order_id": [(BRONZE_ORDERS, "order_id", "DIRECT", "IDENTITY")],
         "customer_id": [(BRONZE_ORDERS, "customer_id", "DIRECT", "IDENTITY")],
         "customer_name": [(BRONZE_CUSTOMERS, "name", "DIRECT", "IDENTITY")],
         "country": [(BRONZE_CUSTOMERS, "country", "DIRECT", "IDENTITY")],
         "amount_eur": [(BRONZE_ORDERS, "amount", "DIRECT", "TRANSFORMATION"),
                        (BRONZE_ORDERS, "currency", "DIRECT", "TRANSFORMATION")],
         "order_date": [(BRONZE_ORDERS, "order_ts", "DIRECT", "TRANSFORMATION")],
         "status": [(BRONZE_ORDERS, "status", "DIRECT", "IDENTITY")],
     },
     "dataset": [(BRONZE_ORDERS, "customer_id", "INDIRECT", "JOIN"),
                 (BRONZE_CUSTOMERS, "customer_id", "INDIRECT", "JOIN"),
                 (BRONZE_ORDERS, "status", "INDIRECT", "FILTER")]},
    {"name": "gold_build.daily_revenue", "inputs": [SILVER_ORDERS], "output": GOLD_DAILY_REVENUE,
     "fields": {
         "order_date": [(SILVER_ORDERS, "order_date", "DIRECT", "IDENTITY")],
         "country": [(SILVER_ORDERS, "country", "DIRECT", "IDENTITY")],
         "total_revenue": [(SILVER_ORDERS, "amount_eur", "DIRECT", "AGGREGATION")],
         "order_count": [(SILVER_ORDERS, "order_id", "DIRECT", "AGGREGATION")],
     },
     "dataset": [(SILVER_ORDERS, "order_date", "INDIRECT", "GROUP_BY"),
                 (SILVER_ORDERS, "country", "INDIRECT", "GROUP_BY"),
                 (SILVER_ORDERS, "status", "INDIRECT", "FILTER")]},
    {"name": "gold_build.customer_ltv", "inputs": [SILVER_ORDERS, BRONZE_CUSTOMERS], "output": GOLD_CUSTOMER_LTV,
     "fields": {
         "customer_id": [(SILVER_ORDERS, "customer_id", "DIRECT", "IDENTITY")],
         "customer_name": [(BRONZE_CUSTOMERS, "name", "DIRECT", "IDENTITY")],
         "lifetime_revenue": [(SILVER_ORDERS, "amount_eur", "DIRECT", "AGGREGATION")],
         "first_order_date": [(SILVER_ORDERS, "order_date", "DIRECT", "AGGREGATION")],
     },
     "dataset": [(SILVER_ORDERS, "customer_id", "INDIRECT", "GROUP_BY"),
                 (BRONZE_CUSTOMERS, "customer_id", "INDIRECT", "JOIN")]},
]


def _facet(facet_name: str, /, **fields: Any) -> dict[str, Any]:
    url = SYMLINKS_URL if facet_name == "symlinks" else FACET_SCHEMA_URLS[facet_name]
    return {"_producer": PRODUCER_URI, "_schemaURL": url, **fields}


def _input_field(source: tuple[Any, ...]) -> dict[str, Any]:
    (namespace, name), field, kind, subtype, *masking = source
    transformation = {"type": kind, "subtype": subtype, "masking": bool(masking and masking[0])}
    return {"namespace": namespace, "name": name, "field": field, "transformations": [transformation]}


def _dataset(dataset: tuple[str, str], job: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace, name = dataset
    schema = [{"name": col, "type": typ} for col, typ in SCHEMAS[dataset]]
    facets: dict[str, Any] = {
        "schema": _facet("schema", fields=schema),
        "dataSource": _facet("dataSource", name=namespace, uri="file:///" if namespace == "file" else namespace),
    }
    if namespace == WAREHOUSE:
        table_name = name.removeprefix("warehouse/").replace(".db/", ".")
        facets["symlinks"] = _facet("symlinks", identifiers=[
            {"namespace": METASTORE, "name": table_name, "type": "TABLE"}])
    if job is not None:
        facets["columnLineage"] = _facet(
            "columnLineage",
            fields={col: {"inputFields": [_input_field(s) for s in sources]} for col, sources in job["fields"].items()},
            dataset=[_input_field(s) for s in job["dataset"]],
        )
    return {"namespace": namespace, "name": name, "facets": facets}


def pipeline_events() -> list[dict[str, Any]]:
    """START and COMPLETE of each job, in run order (upstream jobs first)."""
    events = []
    for n, job in enumerate(JOBS):
        run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lineage-relay-test/{job['name']}"))
        started = START + timedelta(minutes=10 * n)
        for event_type, moment, outputs in (
            ("START", started, []),
            ("COMPLETE", started + timedelta(minutes=4), [_dataset(job["output"], job)]),
        ):
            events.append({
                "eventTime": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "producer": PRODUCER_URI,
                "schemaURL": SCHEMA_URL,
                "eventType": event_type,
                "run": {"runId": run_id, "facets": {}},
                "job": {"namespace": JOB_NAMESPACE, "name": job["name"], "facets": {
                    "jobType": _facet("jobType", processingType="BATCH", integration="SPARK", jobType="SQL_JOB")}},
                "inputs": [_dataset(ds) for ds in job["inputs"]],
                "outputs": outputs,
            })
    return events
