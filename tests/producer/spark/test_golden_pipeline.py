"""The golden pipeline: bronze -> silver -> gold on real PySpark with capture on.

Asserts the runs, job names, datasets, facets and the exact column lineage a user would
see in their collector, validates every event against the OpenLineage schemas, and sends
the same events through Kafka and the relay to a collector."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from producer import LineageProducer
from producer.spark import enable_lineage
from producer.spark.demo import prepare, run_pipeline
from relay.embedded.collector import RecordingCollector
from relay.stages.decode import REASONS
from tests.producer.spark.support import Recorder, drain
from tests.support.relay import RelayThread, relay_config
from tests.support.spec import validator

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

APP = "golden"
BRONZE_ORDERS = f"{APP}.execute_insert_into_hadoop_fs_relation_command.bronze_orders"
BRONZE_CUSTOMERS = f"{APP}.execute_insert_into_hadoop_fs_relation_command.bronze_customers"
SILVER = f"{APP}.adaptive_spark_plan.silver_orders"  # a join: the write runs inside adaptive execution
DAILY = f"{APP}.execute_create_data_source_table_as_select_command.gold_daily_revenue"
RANK = f"{APP}.adaptive_spark_plan.gold_customer_rank"
AUDIT = f"{APP}.execute_insert_into_hadoop_fs_relation_command.gold_audit"
CHILD_JOBS = [BRONZE_ORDERS, BRONZE_CUSTOMERS, SILVER, DAILY, RANK, AUDIT]


@pytest.fixture(scope="module")
def golden(spark, kafka, tmp_path_factory):
    """Run the pipeline once with capture on; every event goes to a recorder and to Kafka."""
    workdir = tmp_path_factory.mktemp("golden")
    paths = prepare(workdir / "data")
    topic = kafka.new_topic("spark-golden", partitions=2)
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic,
                               journal_dir=str(workdir / "journal"))
    recorder = Recorder(forward=producer)
    lineage = enable_lineage(spark, producer=recorder, namespace="demo", app_name=APP)
    try:
        result = run_pipeline(spark, paths)
        drain(spark)
    finally:
        lineage.end()  # the application's COMPLETE; the shared session keeps running
        assert producer.flush(30) == 0
        producer.close()
    warehouse = spark.conf.get("spark.sql.warehouse.dir")
    return {"events": recorder.events, "runs": recorder.runs(), "paths": paths, "result": result,
            "topic": topic, "lineage": lineage, "warehouse": warehouse.removeprefix("file:")}


def _by_job(golden: dict) -> dict[str, list[dict]]:
    jobs: dict[str, list[dict]] = {}
    for events in golden["runs"].values():
        jobs.setdefault(events[0]["job"]["name"], []).extend(events)
    return jobs


def _file(path: str) -> tuple[str, str]:
    return ("file", str(Path(path)))


def test_the_job_result_is_what_the_pipeline_computes(golden):
    assert golden["result"]["revenue"] == {
        ("2026-11-20", "DE"): 120.0, ("2026-11-20", "FR"): 35.5, ("2026-11-21", "DE"): 98.0,
        ("2026-11-21", "FR"): 64.0, ("2026-11-22", "DE"): 250.0}
    assert "audit rule violated" in str(golden["result"]["failure"])
    assert golden["lineage"].capture_errors == 0


def test_one_application_run_and_one_child_run_per_writing_action(golden):
    events = golden["events"]
    app = [e for e in events if e["job"]["name"] == APP]
    assert [e["eventType"] for e in app] == ["START", "COMPLETE"]
    assert events[0] is app[0] and events[-1] is app[1], "the application run brackets every action"
    app_run = app[0]["run"]["runId"]
    jobs = _by_job(golden)
    assert sorted(jobs) == sorted([APP, *CHILD_JOBS]), "no runs for read-only actions (collect, count)"
    for name in CHILD_JOBS:
        run = jobs[name]
        expected_end = "FAIL" if name == AUDIT else "COMPLETE"
        assert [e["eventType"] for e in run] == ["START", expected_end], name
        assert len({e["run"]["runId"] for e in run}) == 1
        assert run[0]["eventTime"] <= run[1]["eventTime"]
        assert app[0]["eventTime"] <= run[0]["eventTime"] and run[1]["eventTime"] <= app[1]["eventTime"]
        parent = run[1]["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == app_run and parent["job"] == {"namespace": "demo", "name": APP}
        assert parent["root"]["run"]["runId"] == app_run
        assert run[1]["job"]["facets"]["jobType"]["jobType"] == "SQL_JOB"
        assert run[1]["job"]["namespace"] == "demo"
    assert app[0]["job"]["facets"]["jobType"]["jobType"] == "APPLICATION"
    # actions run one after another, so their runs are in pipeline order
    order = [e["job"]["name"] for e in events if e["eventType"] == "START" and e["job"]["name"] != APP]
    assert order == CHILD_JOBS


def test_every_event_is_valid_against_the_openlineage_schemas(golden):
    v = validator()
    for event in golden["events"]:
        v.validate(event)


def test_datasets_are_named_per_the_naming_spec(golden):
    p = golden["paths"]
    jobs = _by_job(golden)
    expected = {
        BRONZE_ORDERS: ([_file(p["orders_csv"]), _file(p["orders_late_csv"])], [_file(p["bronze_orders"])]),
        BRONZE_CUSTOMERS: ([_file(p["customers_json"])], [_file(p["bronze_customers"])]),
        SILVER: ([_file(p["bronze_orders"]), _file(p["bronze_customers"])], [_file(p["silver_orders"])]),
        DAILY: ([_file(p["silver_orders"])], [_file(f"{golden['warehouse']}/gold.db/daily_revenue")]),
        RANK: ([_file(p["silver_orders"])], [_file(p["customer_rank"])]),
        AUDIT: ([_file(p["silver_orders"])], [_file(p["audit"])]),
    }
    for job, (inputs, outputs) in expected.items():
        for event in jobs[job]:
            assert [(d["namespace"], d["name"]) for d in event["inputs"]] == inputs, job
            assert [(d["namespace"], d["name"]) for d in event["outputs"]] == outputs, job


def _terminal(golden: dict, job: str) -> dict:
    return _by_job(golden)[job][-1]


def test_facets_schema_datasource_lifecycle_statistics_symlinks(golden, spark):
    bronze = _terminal(golden, BRONZE_ORDERS)
    out = bronze["outputs"][0]
    assert [(f["name"], f["type"]) for f in out["facets"]["schema"]["fields"]] == [
        ("order_id", "integer"), ("customer_id", "integer"), ("amount", "double"), ("status", "string"),
        ("ts", "timestamp")]
    assert [(f["name"], f["type"]) for f in bronze["inputs"][0]["facets"]["schema"]["fields"]] == [
        ("id", "integer"), ("cust", "integer"), ("amount_eur", "double"), ("status", "string"), ("ts", "timestamp")]
    assert out["facets"]["dataSource"]["name"] == "file"
    assert out["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"

    rows = {BRONZE_ORDERS: 7, BRONZE_CUSTOMERS: 3, SILVER: 6, DAILY: 5, RANK: 3}
    for job, count in rows.items():
        event = _terminal(golden, job)
        stats = event["outputs"][0]["outputFacets"]["outputStatistics"]
        assert stats["rowCount"] == count, job
        assert stats["size"] > 0 and stats["fileCount"] >= 1, job
        start = _by_job(golden)[job][0]
        assert "outputFacets" not in start["outputs"][0], "statistics exist only once the write is done"

    daily = _terminal(golden, DAILY)["outputs"][0]["facets"]
    assert daily["lifecycleStateChange"]["lifecycleStateChange"] == "CREATE"
    assert daily["symlinks"]["identifiers"] == [
        {"namespace": f"file:{golden['warehouse']}/gold.db", "name": "gold.daily_revenue", "type": "TABLE"}]
    assert [(f["name"], f["type"]) for f in daily["schema"]["fields"]] == [
        ("order_date", "date"), ("country", "string"), ("total_revenue", "double"), ("orders", "long")]

    for event in golden["events"]:
        engine = event["run"]["facets"]["processing_engine"]
        assert (engine["name"], engine["version"]) == ("spark", spark.version)
        assert event["run"]["facets"]["spark_properties"]["properties"] == {
            "spark.master": "local[2]", "spark.app.name": spark.sparkContext.appName}

    failed = _terminal(golden, AUDIT)
    error = failed["run"]["facets"]["errorMessage"]
    assert "audit rule violated" in error["message"] and error["programmingLanguage"] == "JAVA"
    assert "SparkRuntimeException" in error["stackTrace"] and "\n\tat " in error["stackTrace"]
    assert "outputStatistics" not in failed["outputs"][0].get("outputFacets", {})
    assert "errorMessage" not in _by_job(golden)[AUDIT][0]["run"]["facets"]


def _lineage_of(golden: dict, job: str) -> tuple[dict, list]:
    """Column lineage as {field: [(input file name, input field, [(type, subtype), ...])]}."""
    facet = _terminal(golden, job)["outputs"][0]["facets"]["columnLineage"]
    short = lambda name: Path(name).name if not Path(name).name.startswith("part-") else name  # noqa: E731
    fields = {
        field: sorted((Path(i["name"]).parent.name + "/" + short(i["name"]), i["field"],
                       [(t["type"], t["subtype"]) for t in i["transformations"]])
                      for i in body["inputFields"])
        for field, body in facet["fields"].items()}
    dataset = sorted((Path(i["name"]).parent.name + "/" + short(i["name"]), i["field"],
                      [(t["type"], t["subtype"]) for t in i["transformations"]])
                     for i in facet.get("dataset", []))
    return fields, dataset


IDENTITY, TRANSFORMATION, AGGREGATION = ("DIRECT", "IDENTITY"), ("DIRECT", "TRANSFORMATION"), ("DIRECT", "AGGREGATION")
JOIN, FILTER, GROUP_BY = ("INDIRECT", "JOIN"), ("INDIRECT", "FILTER"), ("INDIRECT", "GROUP_BY")
CONDITIONAL, WINDOW = ("INDIRECT", "CONDITIONAL"), ("INDIRECT", "WINDOW")


def test_exact_column_lineage_through_union_rename_join_filter_case_aggregate_window(golden):
    raw1, raw2 = "raw/orders.csv", "raw/orders_late.csv"
    fields, dataset = _lineage_of(golden, BRONZE_ORDERS)  # union of two csv files + renames
    assert fields == {
        "order_id": [(raw1, "id", [IDENTITY]), (raw2, "id", [IDENTITY])],
        "customer_id": [(raw1, "cust", [IDENTITY]), (raw2, "cust", [IDENTITY])],
        "amount": [(raw1, "amount_eur", [IDENTITY]), (raw2, "amount_eur", [IDENTITY])],
        "status": [(raw1, "status", [IDENTITY]), (raw2, "status", [IDENTITY])],
        "ts": [(raw1, "ts", [IDENTITY]), (raw2, "ts", [IDENTITY])],
    }
    assert dataset == []

    fields, dataset = _lineage_of(golden, SILVER)  # join, filter, CASE WHEN, to_date, alias
    bo, bc = "bronze/orders", "bronze/customers"
    assert fields == {
        "order_id": [(bo, "order_id", [IDENTITY])],
        "customer_id": [(bo, "customer_id", [IDENTITY])],
        "customer_name": [(bc, "name", [IDENTITY])],
        "country": [(bc, "country", [IDENTITY])],
        "amount": [(bo, "amount", [IDENTITY])],
        "order_date": [(bo, "ts", [TRANSFORMATION])],
        "size_band": [(bo, "amount", [CONDITIONAL])],
    }
    assert dataset == [(bc, "customer_id", [JOIN]), (bo, "customer_id", [JOIN]), (bo, "status", [FILTER])]

    so = "silver/orders"
    fields, dataset = _lineage_of(golden, DAILY)  # CTAS with GROUP BY and aggregates
    assert fields == {
        "order_date": [(so, "order_date", [IDENTITY])],
        "country": [(so, "country", [IDENTITY])],
        "total_revenue": [(so, "amount", [AGGREGATION])],
        "orders": [(so, "order_id", [AGGREGATION])],
    }
    assert dataset == [(so, "country", [GROUP_BY]), (so, "order_date", [GROUP_BY])]

    fields, dataset = _lineage_of(golden, RANK)  # aggregate, then rank() over a window
    assert fields == {
        "customer_id": [(so, "customer_id", [IDENTITY])],
        "customer_name": [(so, "customer_name", [IDENTITY])],
        "country": [(so, "country", [IDENTITY])],
        "spend": [(so, "amount", [AGGREGATION])],
        "rank_in_country": [(so, "amount", [WINDOW]), (so, "country", [WINDOW])],
    }
    assert dataset == [(so, "country", [GROUP_BY]), (so, "customer_id", [GROUP_BY]),
                       (so, "customer_name", [GROUP_BY])]

    # The failing action still reports its lineage. ``otherwise(amount)``: the value as is (a
    # CASE WHEN's branch value transforms nothing, as the official integration reports it).
    fields, _ = _lineage_of(golden, AUDIT)
    assert fields == {"order_id": [(so, "order_id", [IDENTITY])],
                      "checked": [(so, "amount", [IDENTITY, CONDITIONAL])]}


def test_the_events_reach_a_collector_through_kafka_and_the_relay(golden, kafka):
    sent = golden["events"]
    with RecordingCollector() as collector:
        cfg = relay_config(kafka.bootstrap_servers, golden["topic"], {"marquez": collector.url},
                           group=kafka.new_group(), dlq=kafka.new_topic("dlq"))
        with RelayThread(cfg) as relay:
            assert collector.wait_for(lambda c: c.count >= len(sent), 60), f"got {collector.count}/{len(sent)}"
            dead = relay.relay.metrics.registry.get_sample_value
            assert not any(dead("lineage_relay_events_dead_lettered_total", {"reason": r}) for r in REASONS)
    got = collector.events()
    canon = lambda d: orjson.dumps(d, option=orjson.OPT_SORT_KEYS)  # noqa: E731
    assert sorted(map(canon, got)) == sorted(map(canon, sent))
    for run_id, events in golden["runs"].items():
        received = [e["eventType"] for e in got if e["run"]["runId"] == run_id]
        assert received == [e["eventType"] for e in events], "START first, one terminal event per run"
    for event in got:
        validator().validate(event)
