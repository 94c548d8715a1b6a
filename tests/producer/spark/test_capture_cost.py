"""What capture costs the job: an action that will not be reported is not read.

With read-only actions off (the default), a query that writes nothing must not pay for a
snapshot (the plan's JSON, its leaves, its metrics: ~50 py4j calls, tens of ms on Spark's
listener thread, seconds for a wide plan)."""

from __future__ import annotations

import pytest

from producer.spark import disable_lineage, enable_lineage, jvm
from tests.producer.spark.support import Recorder, drain

pytestmark = pytest.mark.spark


@pytest.fixture
def snapshots(monkeypatch):
    taken: list[str] = []
    original = jvm.snapshot

    def counting(gateway, session, func, qe, **kwargs):
        taken.append(func)
        return original(gateway, session, func, qe, **kwargs)
    monkeypatch.setattr(jvm, "snapshot", counting)
    return taken


def test_read_only_actions_are_not_snapshotted_and_cost_next_to_no_py4j_calls(spark, tmp_path, snapshots,
                                                                                py4j_calls):
    spark.range(20).selectExpr("id", "id % 3 AS k").write.mode("overwrite").parquet(str(tmp_path / "src"))
    src = spark.read.parquet(str(tmp_path / "src"))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name="cost")
    try:
        drain(spark)
        py4j_calls.clear()
        for _ in range(10):
            src.groupBy("k").count().collect()
        drain(spark)
        assert snapshots == []
        assert py4j_calls == [], "a Dataset read action is dropped by its name"

        for _ in range(10):
            spark.sql("SHOW DATABASES")  # a command that writes nothing: one class lookup
        drain(spark)
        assert snapshots == []
        assert len(py4j_calls) <= 10 * 6, len(py4j_calls)

        src.write.mode("overwrite").parquet(str(tmp_path / "out"))
        drain(spark)
        assert snapshots == ["command"] or snapshots == ["save"], "a write is still read"
    finally:
        drain(spark)
        disable_lineage(spark)
    assert [e["eventType"] for e in recorder.events if e["job"]["name"] != "cost"] == ["START", "COMPLETE"]


def test_with_read_only_actions_on_a_read_is_reported(spark, tmp_path, snapshots):
    spark.range(5).write.mode("overwrite").parquet(str(tmp_path / "src"))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name="cost", read_only_actions=True)
    try:
        spark.read.parquet(str(tmp_path / "src")).collect()
        drain(spark)
    finally:
        disable_lineage(spark)
    assert "collectToPython" in snapshots
    child = [e for e in recorder.events if e["job"]["name"] != "cost" and e["eventType"] == "COMPLETE"]
    assert any(d["name"] == str(tmp_path / "src") for e in child for d in e["inputs"])


def _comparable(events: list[dict], app: str) -> list[dict]:
    """The actions' events without what differs from run to run (ids, times, job ids)."""
    import json
    import re

    text = json.dumps([e for e in events if e["job"]["name"] != app], sort_keys=True)
    text = re.sub(r'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"', '"<uuid>"', text)
    text = re.sub(r'"(eventTime|jobId)": ("[^"]*"|\d+)', r'"\1": null', text)
    return json.loads(text)


def test_the_batched_reads_report_what_the_plain_reads_do_in_a_few_py4j_calls(spark, tmp_path, monkeypatch,
                                                                              py4j_calls):
    """An action read through the compiled helper (producer.spark.batched_reads) gives the same
    events as the plain reads, call by call, that a Spark without the helper gets."""
    from pyspark.sql import functions as F

    from producer.spark import batched_reads

    src = tmp_path / "src.csv"
    src.write_text("id,amount,status\n" + "\n".join(f"{i},{i * 3},{'ok' if i % 2 else 'no'}" for i in range(50)))
    dims = tmp_path / "dims"
    spark.range(5).selectExpr("id", "CAST(id AS STRING) AS name").write.mode("overwrite").parquet(str(dims))

    def run(out: str) -> tuple[list[dict], int]:
        recorder = Recorder()
        enable_lineage(spark, producer=recorder, app_name="batched")
        try:
            drain(spark)
            py4j_calls.clear()
            orders = spark.read.option("header", True).schema("id INT, amount INT, status STRING").csv(str(src))
            (orders.join(spark.read.parquet(str(dims)), "id").where(F.col("status") == "ok")
             .groupBy("name").agg(F.sum("amount").alias("total"))
             .write.mode("overwrite").parquet(str(tmp_path / out)))
            drain(spark)
            calls = len(py4j_calls)
        finally:
            disable_lineage(spark)
        return _comparable(recorder.events, "batched"), calls

    run("out")  # the helper, the scan reader and the job reader's mapper made (once per gateway)
    batched, batched_calls = run("out")
    monkeypatch.setattr(batched_reads, "helper", lambda *_args: None)
    plain, plain_calls = run("out")
    assert [e["eventType"] for e in batched] == ["START", "COMPLETE"]
    assert batched == plain
    assert batched[1]["outputs"][0]["facets"]["columnLineage"]["fields"]
    assert all("inputStatistics" in i["inputFacets"] for i in batched[1]["inputs"])
    assert batched_calls <= 12 < plain_calls, (batched_calls, plain_calls)
