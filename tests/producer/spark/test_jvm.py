"""Reading a plan's JSON over py4j: the same text as Spark's ``toJSON``, whatever its size."""

from __future__ import annotations

import pytest

from producer.spark import jvm

pytestmark = pytest.mark.spark


def _plan(spark, joins: int):
    from pyspark.sql import functions as F

    df = spark.range(10).selectExpr("id", "CASE WHEN id > 3 THEN 'large' ELSE 'small' END AS band")
    for i in range(joins):
        df = df.join(spark.range(3).selectExpr(f"id AS k{i}", f"'v{i}\\u00e9\\n\"' AS s{i}"), F.col("id") == F.col(f"k{i}"))
    return df._jdf.queryExecution().analyzed()


@pytest.mark.parametrize("joins", [0, 3, 12])
def test_plan_json_is_exactly_spark_to_json(spark, joins):
    plan = _plan(spark, joins)
    expected = plan.toJSON()
    text, length = jvm.plan_json(spark.sparkContext._gateway, plan, max_chars=10**8)
    assert length == len(expected)
    assert text == expected
    if joins == 12:
        assert length > 4 * jvm._PIECE_CHARS  # read in several pieces
    # the estimate made before the JSON is built is below its real length (a plan near the
    # limit is decided by its JSON's own length)
    assert 0 < jvm.estimate_plan_chars(spark.sparkContext._gateway, plan, 10**8) <= length


def test_a_plan_above_the_limit_is_not_read_but_its_size_is_reported(spark):
    plan = _plan(spark, 3)
    size = len(plan.toJSON())
    assert jvm.plan_json(spark.sparkContext._gateway, plan, max_chars=size - 1) == (None, size)
    assert jvm.plan_json(spark.sparkContext._gateway, plan, max_chars=size)[0] is not None


def test_the_estimate_stops_just_past_the_limit_and_charges_long_child_lists(spark):
    """``isin`` over 20,000 values: its JSON (5 MB) takes seconds to build, its children
    being found by ``indexOf``; the estimate says so at once, and stops counting past the limit."""
    import time

    from pyspark.sql import functions as F

    gateway = spark.sparkContext._gateway
    plan = spark.range(10).where(F.col("id").isin(list(range(20_000))))._jdf.queryExecution().analyzed()
    jvm.estimate_plan_chars(gateway, spark.range(1)._jdf.queryExecution().analyzed(), 10)  # compiled once
    started = time.perf_counter()
    assert jvm.estimate_plan_chars(gateway, plan, 32 * 1024 * 1024) > 32 * 1024 * 1024
    assert time.perf_counter() - started < 1.0
    assert jvm.plan_json(gateway, plan, 32 * 1024 * 1024)[0] is None
    assert 1000 < jvm.estimate_plan_chars(gateway, plan, 1000) < 1000 + 20_000 ** 2


def test_a_java_error_from_the_json_writer_is_raised_never_retried(monkeypatch):
    """An OutOfMemoryError while Spark writes the JSON must not be followed by ``toJSON``
    (the same work again, and the same failure): it raises to the snapshot, which reports it."""
    from py4j.protocol import Py4JJavaError

    class JavaError(Py4JJavaError):
        def __init__(self):
            Exception.__init__(self, "An error occurred while calling o1.writeValue")
            self.java_exception = "java.lang.OutOfMemoryError: Java heap space"

        def __str__(self):
            return "An error occurred while calling o1.writeValue"

    class Mapper:
        def writeValue(self, writer, value):  # noqa: N802 - the Java name
            raise JavaError()

    class Plan:
        to_json_calls = 0

        def jsonValue(self):  # noqa: N802
            return object()

        def toJSON(self):  # noqa: N802
            Plan.to_json_calls += 1
            return "{}"

    monkeypatch.setattr(jvm, "estimate_plan_chars", lambda *_args: None)
    monkeypatch.setattr(jvm, "_json_tools", lambda _gateway: (Mapper(), lambda: object()))
    with pytest.raises(Py4JJavaError) as raised:
        jvm.plan_json(object(), Plan(), max_chars=10**6)
    assert Plan.to_json_calls == 0
    assert jvm._first_line(raised.value) == "JavaError: java.lang.OutOfMemoryError: Java heap space"

    # only json4s' tools not being there (another Spark) falls back to the plain call
    def no_tools(_gateway):
        raise AttributeError("no org.json4s.jackson.JsonMethods$")
    monkeypatch.setattr(jvm, "_json_tools", no_tools)
    assert jvm.plan_json(object(), Plan(), max_chars=10**6) == ("{}", 2)
    assert Plan.to_json_calls == 1


def test_the_stall_free_path_is_the_one_taken(spark):
    """plan_json falls back to ``toJSON`` (one ~40 ms stall per action) if json4s' mapper
    cannot be reached; on the Spark we ship with, it must be reachable."""
    mapper, string_writer = jvm._json_tools(spark.sparkContext._gateway)
    writer = string_writer()
    mapper.writeValue(writer, _plan(spark, 1).jsonValue())
    assert writer.getBuffer().length() > 0


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


def test_write_metrics_and_the_start_time_come_from_one_call_each(spark, tmp_path, monkeypatch):
    """Metrics and the analysis phase's start are parsed from one ``mkString`` each; the
    per-item fallback (four round trips per metric) is for a Spark whose text differs,
    and must not be what runs here."""
    import time

    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain

    slow: list[str] = []
    for name in ("_metrics_one_by_one", "_analysis_start_asked"):
        real = getattr(jvm, name)
        monkeypatch.setattr(jvm, name, lambda *a, _real=real, _name=name: slow.append(_name) or _real(*a))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="calls", app_name="calls")
    try:
        before = time.time()
        spark.range(1000).selectExpr("id", "id % 7 AS k").write.mode("overwrite").parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
    start, done = [[e for e in recorder.events if e["eventType"] == kind and e["job"]["name"] != "calls"]
                   for kind in ("START", "COMPLETE")]
    assert slow == []
    stats = done[0]["outputs"][0]["outputFacets"]["outputStatistics"]
    assert stats["rowCount"] == 1000 and stats["size"] > 0 and stats["fileCount"] >= 1
    from datetime import datetime

    started = datetime.fromisoformat(start[0]["eventTime"].replace("Z", "+00:00")).timestamp()
    assert before - 1 <= started <= datetime.fromisoformat(done[0]["eventTime"].replace("Z", "+00:00")).timestamp()
