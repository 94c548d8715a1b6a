"""Column lineage of queries with common table expressions, on real PySpark with capture on.

Spark 4 keeps ``WithCTE`` in the analysed plan with the CTE definitions as its first
children and the query as its last: the columnLineage facet must be keyed by the columns
the write produces (the schema facet's), not by a CTE definition's. Each shape here renames
or adds columns after the CTE, so the two differ."""

from __future__ import annotations

import pytest

from tests.producer.spark.support import completes_by_output, validated_capture

pytestmark = pytest.mark.spark

APP = "ctes"
DB = "cte_db"
ORDERS = f"{DB}.orders"
LIMITS = f"{DB}.limits"

#: Queries written to parquet through the DataFrame writer, by output directory name.
FILE_WRITES = {
    "cte_transform": f"WITH a AS (SELECT id AS oid, amt AS v FROM {ORDERS}) SELECT oid, v + 1 AS w FROM a",
    "cte_aggregate": f"WITH a AS (SELECT id AS oid, amt AS v FROM {ORDERS}) "
                     "SELECT oid, sum(v) AS total FROM a GROUP BY oid",
    "cte_chained": f"WITH a AS (SELECT id AS k, amt AS v FROM {ORDERS}), b AS (SELECT k AS k2, v * 2 AS v2 FROM a) "
                   "SELECT k2 AS key, v2 + 1 AS score FROM b",
    "cte_nested_with": f"WITH b AS (WITH a AS (SELECT id AS k, amt AS v FROM {ORDERS}) "
                       "SELECT k AS k2, v * 2 AS v2 FROM a) SELECT k2 AS key, v2 AS score FROM b",
    "cte_twice": f"WITH c AS (SELECT id AS cid, amt AS x FROM {ORDERS}) "
                 "SELECT l.cid AS left_id, r.x * 2 AS doubled FROM c l JOIN c r ON l.cid = r.cid",
    "cte_union": f"WITH a AS (SELECT id AS k, amt AS v FROM {ORDERS}), b AS (SELECT id AS k, lim AS v FROM {LIMITS}) "
                 "SELECT k AS key, sum(v) AS total FROM (SELECT * FROM a UNION ALL SELECT * FROM b) GROUP BY k",
    "cte_star": f"WITH a AS (SELECT id AS k, amt * 3 AS t FROM {ORDERS}) SELECT t + 1 AS t1, * FROM a",
}

#: The same shape written to a catalog table four ways (spark.sql text and saveAsTable).
CTE = f"WITH a AS (SELECT id AS k, amt AS v FROM {ORDERS}) "
TABLE_WRITES = {
    "t_insert_into": f"INSERT INTO {DB}.t_insert_into {CTE}SELECT k, v + 1 AS w FROM a",
    "t_with_insert": f"{CTE}INSERT OVERWRITE TABLE {DB}.t_with_insert SELECT k, v + 1 AS w FROM a",
    "t_ctas": f"CREATE TABLE {DB}.t_ctas USING parquet AS {CTE}SELECT k AS tid, v + 1 AS score FROM a",
}


@pytest.fixture(scope="module")
def completes(spark, tmp_path_factory):
    """Each write's COMPLETE event by the last segment of its output's name."""
    out_dir = tmp_path_factory.mktemp("cte_out")
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DB}")
    spark.createDataFrame([(1, "a", 5.0), (2, "b", 7.0)], "id INT, v STRING, amt DOUBLE") \
        .write.mode("overwrite").saveAsTable(ORDERS)
    spark.createDataFrame([(1, 100.0)], "id INT, lim DOUBLE").write.mode("overwrite").saveAsTable(LIMITS)
    for table in (*TABLE_WRITES, "t_save_as_table"):
        spark.sql(f"DROP TABLE IF EXISTS {DB}.{table}")
    # Target columns named unlike the query's: an insert matches them by position.
    for table in ("t_insert_into", "t_with_insert"):
        spark.sql(f"CREATE TABLE {DB}.{table} (tid INT, score DOUBLE) USING parquet")
    def write_all():
        for name, query in FILE_WRITES.items():
            spark.sql(query).write.mode("overwrite").parquet(str(out_dir / name))
        for statement in TABLE_WRITES.values():
            spark.sql(statement)
        spark.sql(f"{CTE}SELECT k AS tid, v + 1 AS score FROM a").write.mode("overwrite") \
            .saveAsTable(f"{DB}.t_save_as_table")

    return completes_by_output(validated_capture(spark, write_all, namespace=APP, app_name=APP))


def _schema_names(event: dict) -> list[str]:
    return [f["name"] for f in event["outputs"][0]["facets"]["schema"]["fields"]]


def _columns(event: dict) -> dict[str, set[tuple[str, str, str, str]]]:
    fields = event["outputs"][0]["facets"]["columnLineage"]["fields"]
    return {col: {(i["name"].rsplit("/", 1)[-1], i["field"], t["type"], t["subtype"])
                  for i in spec["inputFields"] for t in i["transformations"]}
            for col, spec in fields.items()}


def _keyed_like_the_schema(event: dict) -> dict[str, set[tuple[str, str, str, str]]]:
    columns = _columns(event)
    assert list(columns) == _schema_names(event)
    return columns


def test_a_column_computed_from_a_cte_is_named_as_written(completes):
    assert _keyed_like_the_schema(completes["cte_transform"]) == {
        "oid": {("orders", "id", "DIRECT", "IDENTITY")},
        "w": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_an_aggregate_over_a_cte_is_named_as_written(completes):
    assert _keyed_like_the_schema(completes["cte_aggregate"]) == {
        "oid": {("orders", "id", "DIRECT", "IDENTITY")},
        "total": {("orders", "amt", "DIRECT", "AGGREGATION")}}


@pytest.mark.parametrize("name", ["cte_chained", "cte_nested_with"])
def test_ctes_built_on_ctes_are_named_as_written(completes, name):
    assert _keyed_like_the_schema(completes[name]) == {
        "key": {("orders", "id", "DIRECT", "IDENTITY")},
        "score": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_a_cte_joined_with_itself_is_named_as_written(completes):
    assert _keyed_like_the_schema(completes["cte_twice"]) == {
        "left_id": {("orders", "id", "DIRECT", "IDENTITY")},
        "doubled": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_a_union_of_ctes_is_named_as_written_and_keeps_both_sides(completes):
    assert _keyed_like_the_schema(completes["cte_union"]) == {
        "key": {("orders", "id", "DIRECT", "IDENTITY"), ("limits", "id", "DIRECT", "IDENTITY")},
        "total": {("orders", "amt", "DIRECT", "AGGREGATION"), ("limits", "lim", "DIRECT", "AGGREGATION")}}


def test_a_new_column_then_star_from_a_cte_names_every_column(completes):
    assert _keyed_like_the_schema(completes["cte_star"]) == {
        "t1": {("orders", "amt", "DIRECT", "TRANSFORMATION")},
        "k": {("orders", "id", "DIRECT", "IDENTITY")},
        "t": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


@pytest.mark.parametrize("name", [*TABLE_WRITES, "t_save_as_table"])
def test_a_table_written_from_a_cte_is_keyed_by_its_columns(completes, name):
    event = completes[name]
    assert _schema_names(event) == ["tid", "score"]
    assert _keyed_like_the_schema(event) == {
        "tid": {("orders", "id", "DIRECT", "IDENTITY")},
        "score": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_without_sparks_schema_the_plan_names_the_query_not_the_cte(spark, completes):
    """When the written query's StructType is not at hand, the schema facet falls back to
    the plan's output expressions: under WithCTE those are its last child's."""
    from producer.spark.capture import CaptureSettings, analyse
    from producer.spark.jvm import ActionSnapshot
    from producer.spark.relations import Relation

    plan = spark.sql(FILE_WRITES["cte_transform"])._jdf.queryExecution().analyzed()
    snap = ActionSnapshot(func="save", command="InsertIntoHadoopFsRelationCommand", query_json=plan.toJSON(),
                          leaves=[Relation(paths=["/data/orders"])], output=Relation(paths=["/out/cte"]))
    output = analyse(snap, CaptureSettings()).outputs[0]
    assert [f["name"] for f in output["facets"]["schema"]["fields"]] == ["oid", "w"]
    assert {col: [i["field"] for i in spec["inputFields"]]
            for col, spec in output["facets"]["columnLineage"]["fields"].items()} == {"oid": ["id"], "w": ["amt"]}


def test_names_that_do_not_cover_every_traced_column_are_not_applied_by_position():
    """A name list of another length cannot be matched by position: the plan's own names
    stand rather than some columns getting their neighbours' lineage, for the columns the
    schema has (``a`` is no column of the written dataset: no field)."""
    from producer.spark.columns import ColumnLineageResult, facet_fields

    result = ColumnLineageResult(columns=[("a", {((0, "x"), "DIRECT", "IDENTITY", False)}),
                                          ("b", {((0, "y"), "DIRECT", "TRANSFORMATION", False)})])
    fields, _ = facet_fields(result, [("file", "/in")], ["b"])
    assert {col: spec["inputFields"][0]["field"] for col, spec in fields.items()} == {"b": "y"}
    fields, _ = facet_fields(result, [("file", "/in")], ["p", "q"])
    assert {col: spec["inputFields"][0]["field"] for col, spec in fields.items()} == {"p": "x", "q": "y"}
