"""Reading a plan's JSON over py4j (producer.spark.plan_reads): the same text as Spark's
``toJSON``, whatever its size."""

from __future__ import annotations

import pytest

from producer.spark import batched_reads, jvm, plan_reads

pytestmark = pytest.mark.spark


def _plan(spark, joins: int):
    from pyspark.sql import functions as F

    df = spark.range(10).selectExpr("id", "CASE WHEN id > 3 THEN 'large' ELSE 'small' END AS band")
    for i in range(joins):
        joined = spark.range(3).selectExpr(f"id AS k{i}", f"'v{i}\\u00e9\\n\"' AS s{i}")
        df = df.join(joined, F.col("id") == F.col(f"k{i}"))
    return df._jdf.queryExecution().analyzed()


@pytest.mark.parametrize("joins", [0, 3, 12])
def test_plan_json_is_exactly_spark_to_json(spark, joins):
    plan = _plan(spark, joins)
    expected = plan.toJSON()
    text, length = plan_reads.plan_json(spark.sparkContext._gateway, plan, max_chars=10**8)
    assert length == len(expected)
    assert text == expected
    if joins == 12:
        assert length > 4 * batched_reads.PIECE_CHARS  # read in several pieces
    # the estimate made before the JSON is built is below its real length (a plan near the
    # limit is decided by its JSON's own length)
    assert 0 < plan_reads.estimate_plan_chars(spark.sparkContext._gateway, plan, 10**8) <= length


def test_a_plan_above_the_limit_is_not_read_but_its_size_is_reported(spark):
    plan = _plan(spark, 3)
    size = len(plan.toJSON())
    assert plan_reads.plan_json(spark.sparkContext._gateway, plan, max_chars=size - 1) == (None, size)
    assert plan_reads.plan_json(spark.sparkContext._gateway, plan, max_chars=size)[0] is not None


def test_the_estimate_stops_just_past_the_limit_and_charges_long_child_lists(spark):
    """``isin`` over 20,000 values: its JSON (5 MB) takes seconds to build, its children
    being found by ``indexOf``; the estimate says so at once, and stops counting past the limit."""
    import time

    from pyspark.sql import functions as F

    gateway = spark.sparkContext._gateway
    plan = spark.range(10).where(F.col("id").isin(list(range(20_000))))._jdf.queryExecution().analyzed()
    plan_reads.estimate_plan_chars(gateway, spark.range(1)._jdf.queryExecution().analyzed(), 10)  # compiled once
    started = time.perf_counter()
    assert plan_reads.estimate_plan_chars(gateway, plan, 32 * 1024 * 1024) > 32 * 1024 * 1024
    assert time.perf_counter() - started < 1.0
    assert plan_reads.plan_json(gateway, plan, 32 * 1024 * 1024)[0] is None
    assert 1000 < plan_reads.estimate_plan_chars(gateway, plan, 1000) < 1000 + 20_000 ** 2


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

    monkeypatch.setattr(plan_reads, "estimate_plan_chars", lambda *_args: None)
    monkeypatch.setattr(plan_reads, "_json_tools", lambda _gateway: (Mapper(), lambda: object()))
    with pytest.raises(Py4JJavaError) as raised:
        plan_reads.plan_json(object(), Plan(), max_chars=10**6)
    assert Plan.to_json_calls == 0
    assert jvm._first_line(raised.value) == "JavaError: java.lang.OutOfMemoryError: Java heap space"

    # only json4s' tools not being there (another Spark) falls back to the plain call
    def no_tools(_gateway):
        raise AttributeError("no org.json4s.jackson.JsonMethods$")
    monkeypatch.setattr(plan_reads, "_json_tools", no_tools)
    assert plan_reads.plan_json(object(), Plan(), max_chars=10**6) == ("{}", 2)
    assert Plan.to_json_calls == 1


def test_the_stall_free_path_is_the_one_taken(spark):
    """plan_json falls back to ``toJSON`` (one ~40 ms stall per action) if json4s' mapper
    cannot be reached; on the Spark we ship with, it must be reachable."""
    mapper, string_writer = plan_reads._json_tools(spark.sparkContext._gateway)
    writer = string_writer()
    mapper.writeValue(writer, _plan(spark, 1).jsonValue())
    assert writer.getBuffer().length() > 0
