"""An action's inputs read from its plan's leaves (producer.spark.input_leaves)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_inputs_from_a_catalog_table_and_from_files_are_told_apart_from_the_plan(spark, tmp_path):
    """The plan's JSON says which leaves carry a catalog table (and which are not data at
    rest at all), so capture asks the JVM only about those; a table read must still come
    out as its table, a file read as its path, and an in-memory frame as nothing."""
    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain

    spark.sql("CREATE DATABASE IF NOT EXISTS jvm_leaves")
    spark.range(5).selectExpr("id", "id * 2 AS v").write.mode("overwrite").saveAsTable("jvm_leaves.src")
    files = str(tmp_path / "files")
    spark.range(5).selectExpr("id", "id * 3 AS w").write.mode("overwrite").parquet(files)
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="leaves", app_name="leaves")
    try:
        table = spark.table("jvm_leaves.src")
        local = spark.createDataFrame([(1, "x")], "id LONG, tag STRING")
        (table.join(spark.read.parquet(files), "id").join(local, "id")
         .write.mode("overwrite").parquet(str(tmp_path / "out")))
        drain(spark)
    finally:
        disable_lineage(spark)
    done = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["job"]["name"] != "leaves"]
    assert len(done) == 1
    inputs = done[0]["inputs"]
    warehouse = spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
    by_name = {i["name"]: i for i in inputs}
    assert set(by_name) == {f"{warehouse}/jvm_leaves.db/src", files}, sorted(by_name)
    assert by_name[f"{warehouse}/jvm_leaves.db/src"]["facets"]["symlinks"]["identifiers"][0]["name"] == "jvm_leaves.src"
    assert "symlinks" not in by_name[files]["facets"]
