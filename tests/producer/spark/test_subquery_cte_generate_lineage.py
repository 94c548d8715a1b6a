"""Inputs and column lineage through plan shapes that hide their tables: subqueries (IN,
EXISTS, scalar), common table expressions (Spark 4 keeps WithCTE / CTERelationRef in the
analysed plan) and generators (explode), on real PySpark with capture on."""

from __future__ import annotations

import pytest

from tests.producer.spark.support import completes_by_output, validated_capture

pytestmark = pytest.mark.spark

APP = "shapes"
DB = "shapes_db"


@pytest.fixture(scope="module")
def completes(spark):
    """Each statement's COMPLETE event by its output table."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DB}")
    spark.createDataFrame([(1, "a", 5.0), (2, "b", 7.0)], "id INT, v STRING, amt DOUBLE") \
        .write.mode("overwrite").saveAsTable(f"{DB}.orders")
    spark.createDataFrame([(1, "vip")], "id INT, tier STRING").write.mode("overwrite").saveAsTable(f"{DB}.customers")
    spark.createDataFrame([(1, 100.0)], "id INT, lim DOUBLE").write.mode("overwrite").saveAsTable(f"{DB}.limits")
    statements = {
        "o_in": f"SELECT id, v FROM {DB}.orders WHERE id IN (SELECT id FROM {DB}.customers WHERE tier = 'vip')",
        "o_exists": f"SELECT id, v FROM {DB}.orders o WHERE EXISTS "
                    f"(SELECT 1 FROM {DB}.customers c WHERE c.id = o.id)",
        "o_scalar": f"SELECT id, amt / (SELECT max(lim) FROM {DB}.limits) AS ratio FROM {DB}.orders",
        "o_nested": f"SELECT id FROM {DB}.orders WHERE id IN (SELECT id FROM {DB}.customers "
                    f"WHERE id IN (SELECT id FROM {DB}.limits))",
        "o_cte_twice": f"WITH c AS (SELECT id, amt FROM {DB}.orders WHERE amt > 1) "
                       "SELECT a.id, b.amt FROM c a JOIN c b ON a.id = b.id",
        "o_cte_once": f"WITH c AS (SELECT id, amt * 2 AS dbl FROM {DB}.orders) SELECT id, dbl FROM c",
        "o_explode": f"SELECT id, e FROM (SELECT id, array(amt, amt) AS arr FROM {DB}.orders) "
                     "LATERAL VIEW explode(arr) t AS e",
    }
    for table in statements:
        spark.sql(f"DROP TABLE IF EXISTS {DB}.{table}")
    def create_all():
        for table, query in statements.items():
            spark.sql(f"CREATE TABLE {DB}.{table} USING parquet AS {query}")

    return completes_by_output(validated_capture(spark, create_all, namespace=APP, app_name=APP))


def _inputs(event: dict) -> set[str]:
    return {d["name"].rsplit("/", 1)[-1] for d in event["inputs"]}


def _columns(event: dict) -> dict[str, set[tuple[str, str, str, str]]]:
    fields = event["outputs"][0]["facets"]["columnLineage"]["fields"]
    return {col: {(i["name"].rsplit("/", 1)[-1], i["field"], t["type"], t["subtype"])
                  for i in spec["inputFields"] for t in i["transformations"]}
            for col, spec in fields.items()}


def _dataset(event: dict) -> set[tuple[str, str, str]]:
    return {(i["name"].rsplit("/", 1)[-1], i["field"], t["subtype"])
            for i in event["outputs"][0]["facets"]["columnLineage"].get("dataset", [])
            for t in i["transformations"]}


def test_a_table_read_only_inside_an_in_subquery_is_an_input_and_filters_the_output(completes):
    event = completes["o_in"]
    assert _inputs(event) == {"orders", "customers"}
    schemas = {d["name"].rsplit("/", 1)[-1]: [f["name"] for f in d["facets"]["schema"]["fields"]]
               for d in event["inputs"]}
    assert "id" in schemas["customers"] and "tier" in schemas["customers"]  # the subquery's table too
    assert _columns(event) == {"id": {("orders", "id", "DIRECT", "IDENTITY")},
                               "v": {("orders", "v", "DIRECT", "IDENTITY")}}
    assert _dataset(event) == {("orders", "id", "FILTER"), ("customers", "id", "FILTER"),
                               ("customers", "tier", "FILTER")}


def test_a_table_read_only_inside_exists_is_an_input_with_its_correlation_as_filter(completes):
    event = completes["o_exists"]
    assert _inputs(event) == {"orders", "customers"}
    assert _dataset(event) == {("orders", "id", "FILTER"), ("customers", "id", "FILTER")}


def test_a_scalar_subquery_feeds_the_column_it_is_part_of(completes):
    event = completes["o_scalar"]
    assert _inputs(event) == {"orders", "limits"}
    assert _columns(event)["ratio"] == {("orders", "amt", "DIRECT", "TRANSFORMATION"),
                                        ("limits", "lim", "DIRECT", "AGGREGATION")}


def test_tables_of_nested_subqueries_are_inputs(completes):
    event = completes["o_nested"]
    assert _inputs(event) == {"orders", "customers", "limits"}
    assert ("limits", "id", "FILTER") in _dataset(event)


def test_a_cte_used_twice_keeps_its_column_lineage(completes):
    event = completes["o_cte_twice"]
    assert _inputs(event) == {"orders"}
    assert _columns(event) == {"id": {("orders", "id", "DIRECT", "IDENTITY")},
                               "amt": {("orders", "amt", "DIRECT", "IDENTITY")}}
    assert _dataset(event) == {("orders", "amt", "FILTER"), ("orders", "id", "JOIN")}


def test_a_cte_used_once_keeps_its_transformations(completes):
    event = completes["o_cte_once"]
    assert _columns(event) == {"id": {("orders", "id", "DIRECT", "IDENTITY")},
                               "dbl": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_an_exploded_column_derives_from_the_array_it_explodes(completes):
    event = completes["o_explode"]
    assert _columns(event) == {"id": {("orders", "id", "DIRECT", "IDENTITY")},
                               "e": {("orders", "amt", "DIRECT", "TRANSFORMATION")}}


def test_subquery_leaves_are_numbered_in_the_order_the_jvm_collects_them(spark, completes):
    """Inputs are matched to the plan's leaves by position: the order computed from the
    JSON must be Spark's (the plan's leaves, then each plan of ``subqueriesAll()``), here
    with subqueries in two operators and one nested inside another."""
    import orjson

    from producer.spark.columns import leaf_groups

    plan = spark.sql(
        f"SELECT o.id, (SELECT max(lim) FROM {DB}.limits) AS m FROM {DB}.orders o "
        f"JOIN {DB}.o_cte_once c ON o.id = c.id "
        f"WHERE o.id IN (SELECT id FROM {DB}.customers WHERE id IN (SELECT id FROM {DB}.o_in)) "
        f"AND EXISTS (SELECT 1 FROM {DB}.o_scalar s WHERE s.id = o.id)"
    )._jdf.queryExecution().analyzed()
    from_json = [[leaf["catalogTable"]["identifier"]["table"] for leaf in group]
                 for group in leaf_groups(orjson.loads(plan.toJSON()))]
    subqueries = plan.subqueriesAll()
    plans = [plan] + [subqueries.apply(j) for j in range(subqueries.length())]
    from_jvm = [[seq.apply(i).catalogTable().get().identifier().table() for i in range(seq.length())]
                for seq in (p.collectLeaves() for p in plans)]
    assert from_json == from_jvm
    assert [t for group in from_jvm for t in group] == ["orders", "o_cte_once", "limits", "customers",
                                                         "o_scalar", "o_in"]


def test_plan_leaves_include_the_subquery_tables_with_their_columns(spark, completes):
    """What capture needs to give a subquery's input its schema facet."""
    import orjson

    from producer.spark.columns import plan_leaves
    from producer.spark.plan import parse_plan

    plan = spark.sql(f"SELECT id FROM {DB}.orders WHERE id IN (SELECT id FROM {DB}.customers)")
    query = parse_plan(orjson.loads(plan._jdf.queryExecution().analyzed().toJSON()))
    assert [[e.name for e in leaf.exprs("output")] for leaf in plan_leaves(query)] == [
        ["id", "v", "amt"], ["id", "tier"]]


@pytest.fixture(scope="module")
def set_ops(spark, tmp_path_factory):
    """COMPLETE events of writes through INTERSECT / EXCEPT and Expand (ROLLUP, CUBE,
    GROUPING SETS, unpivot), by output directory."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("set_ops")
    spark.createDataFrame([(1, "x", 10, 11), (2, "y", 20, 21)], "id INT, name STRING, v INT, u INT") \
        .write.parquet(str(base / "A"))
    spark.createDataFrame([(1, "x", 5)], "id INT, name STRING, w INT").write.parquet(str(base / "B"))

    def a():
        return spark.read.parquet(str(base / "A"))

    def b():
        return spark.read.parquet(str(base / "B"))

    a().createOrReplaceTempView("set_ops_a")
    b().createOrReplaceTempView("set_ops_b")
    writes = {
        "intersect": lambda: a().select("id", "name").intersect(b().select("id", "name")),
        "except_all": lambda: a().select("id", "name").exceptAll(b().select("id", "name")),
        "subtract": lambda: a().select("id").subtract(b().select("id")).withColumn("d", F.col("id") * 2),
        "sql_except": lambda: spark.sql("SELECT id, name, v FROM set_ops_a EXCEPT SELECT id, name, w FROM set_ops_b"),
        "rollup": lambda: a().rollup("name").agg(F.sum("v").alias("s")),
        "cube": lambda: a().cube("name", "id").agg(F.max("v").alias("m")),
        "grouping_sets": lambda: spark.sql("SELECT name, id, sum(v) AS s FROM set_ops_a "
                                           "GROUP BY GROUPING SETS ((name), (id))"),
        "sql_unpivot": lambda: spark.sql("SELECT * FROM (SELECT id, v, u FROM set_ops_a) "
                                         "UNPIVOT (val FOR var IN (v, u))"),
        "melt": lambda: a().select("id", "v", F.col("id").alias("k")).melt("id", ["v", "k"], "var", "val"),
        "count": lambda: a().groupBy("name").agg(F.count("id").alias("c"), F.sum("v").alias("s")),
    }
    def write_all():
        for name, df in writes.items():
            df().write.mode("overwrite").parquet(str(base / name))

    return completes_by_output(validated_capture(spark, write_all, namespace=APP, app_name=APP))


@pytest.mark.parametrize("out, columns, filtered_by", [
    ("intersect", ["id", "name"], {("B", "id", "FILTER"), ("B", "name", "FILTER")}),
    ("except_all", ["id", "name"], {("B", "id", "FILTER"), ("B", "name", "FILTER")}),
    ("sql_except", ["id", "name", "v"], {("B", "id", "FILTER"), ("B", "name", "FILTER"), ("B", "w", "FILTER")}),
])
def test_intersect_and_except_take_their_columns_from_the_left_the_right_filters(set_ops, out, columns, filtered_by):
    """The rows of INTERSECT / EXCEPT are the left input's: every column is the left's (it
    was the right's, the last one traced with that name); the right only decides which rows
    stay, a whole-dataset INDIRECT dependency as a filter is."""
    event = set_ops[out]
    assert _inputs(event) == {"A", "B"}
    assert _columns(event) == {c: {("A", c, "DIRECT", "IDENTITY")} for c in columns}
    assert _dataset(event) == filtered_by


def test_a_column_computed_after_a_subtract_comes_from_the_left(set_ops):
    event = set_ops["subtract"]
    assert _columns(event) == {"id": {("A", "id", "DIRECT", "IDENTITY")},
                               "d": {("A", "id", "DIRECT", "TRANSFORMATION")}}
    assert _dataset(event) == {("B", "id", "FILTER")}


@pytest.mark.parametrize("out, expected, grouped_by", [
    ("rollup", {"name": {("A", "name", "DIRECT", "IDENTITY")}, "s": {("A", "v", "DIRECT", "AGGREGATION")}},
     {("A", "name", "GROUP_BY")}),
    ("cube", {"name": {("A", "name", "DIRECT", "IDENTITY")}, "id": {("A", "id", "DIRECT", "IDENTITY")},
              "m": {("A", "v", "DIRECT", "AGGREGATION")}},
     {("A", "name", "GROUP_BY"), ("A", "id", "GROUP_BY")}),
])
def test_rollup_and_cube_grouping_columns_keep_their_lineage(set_ops, out, expected, grouped_by):
    """The grouping columns go through an Expand: each derives from its position in every
    projection (it had no lineage at all, and no GROUP_BY)."""
    event = set_ops[out]
    assert _columns(event) == expected
    assert _dataset(event) == grouped_by


def test_grouping_sets_columns_keep_their_lineage(set_ops):
    columns = _columns(set_ops["grouping_sets"])
    assert {(ds, f) for ds, f, _, _ in columns["name"]} == {("A", "name")}
    assert {(ds, f) for ds, f, _, _ in columns["id"]} == {("A", "id")}
    assert columns["s"] == {("A", "v", "DIRECT", "AGGREGATION")}
    assert {("A", "name", "GROUP_BY"), ("A", "id", "GROUP_BY")} <= _dataset(set_ops["grouping_sets"])


def test_an_unpivot_value_column_derives_from_every_unpivoted_column(set_ops):
    """SQL UNPIVOT: ``val`` is ``v`` in one row and ``u`` in the other; ``var`` holds their
    names (literals): no column feeds it."""
    columns = _columns(set_ops["sql_unpivot"])
    assert {(ds, f) for ds, f, _, _ in columns["val"]} == {("A", "v"), ("A", "u")}
    assert {(ds, f) for ds, f, _, _ in columns["id"]} == {("A", "id")}
    assert "var" not in columns


def test_a_dataframe_melt_credits_no_column_by_position(set_ops):
    """A DataFrame unpivot's projections are Scala collections Spark's JSON leaves null:
    its new columns get no lineage rather than the lineage of whichever child column
    sat at their position (``var`` <- v, ``val`` <- id before)."""
    columns = _columns(set_ops["melt"])
    assert columns["id"] == {("A", "id", "DIRECT", "IDENTITY")}
    assert "var" not in columns
    assert all(("A", "id") != (ds, f) for ds, f, _, _ in columns.get("val", set()))


def _attr(name: str, expr_id: int) -> list[dict]:
    return [{"class": "org.apache.spark.sql.catalyst.expressions.AttributeReference", "num-children": 0,
             "name": name, "dataType": "integer", "exprId": {"id": expr_id}}]


def test_an_unknown_node_with_its_own_output_exposes_it_and_no_field_leaves_the_schema():
    """An operator the tracer does not know that lists its own output (here one column for
    its child's two): its column is its own, not the child's first by position; and a
    traced column the written schema lacks is never a field of the facet."""
    from producer.spark import columns
    from producer.spark.plan import parse_plan

    plan = parse_plan([
        {"class": "x.MapSomething", "num-children": 1, "output": [_attr("z", 9)], "child": 0},
        {"class": "x.LogicalRelation", "num-children": 0, "output": [_attr("a", 1), _attr("b", 2)]},
    ])
    result = columns.trace(plan, lambda i, leaf: 0)
    assert [name for name, _ in result.columns] == ["z"]
    assert result.columns[0][1] == set()
    traced = columns.ColumnLineageResult(columns=[
        ("id", {((0, "id"), "DIRECT", "IDENTITY", False)}), ("name", {((0, "name"), "DIRECT", "IDENTITY", False)}),
        ("id", {((1, "id"), "DIRECT", "IDENTITY", False)}), ("extra", {((1, "x"), "DIRECT", "IDENTITY", False)})])
    fields, _ = columns.facet_fields(traced, [("file", "/a"), ("file", "/b")], ["id", "name"])
    assert set(fields) == {"name"}   # "id" traced twice: which one is not known


def test_a_count_masks_the_column_it_counts(set_ops):
    """As the official integration's masking functions: a count reveals no value of ``id``."""
    fields = set_ops["count"]["outputs"][0]["facets"]["columnLineage"]["fields"]
    [counted] = fields["c"]["inputFields"]
    assert (counted["field"], counted["transformations"]) == (
        "id", [{"type": "DIRECT", "subtype": "AGGREGATION", "masking": True}])
    [summed] = fields["s"]["inputFields"]
    assert summed["transformations"] == [{"type": "DIRECT", "subtype": "AGGREGATION", "masking": False}]
