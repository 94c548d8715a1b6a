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
