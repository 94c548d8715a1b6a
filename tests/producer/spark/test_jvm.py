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


def test_a_plan_above_the_limit_is_not_read_but_its_size_is_reported(spark):
    plan = _plan(spark, 3)
    size = len(plan.toJSON())
    assert jvm.plan_json(spark.sparkContext._gateway, plan, max_chars=size - 1) == (None, size)
    assert jvm.plan_json(spark.sparkContext._gateway, plan, max_chars=size)[0] is not None


def test_the_stall_free_path_is_the_one_taken(spark):
    """plan_json falls back to ``toJSON`` (one ~40 ms stall per action) if json4s' mapper
    cannot be reached; on the Spark we ship with, it must be reachable."""
    mapper, string_writer = jvm._json_tools(spark.sparkContext._gateway)
    writer = string_writer()
    mapper.writeValue(writer, _plan(spark, 1).jsonValue())
    assert writer.getBuffer().length() > 0
