"""Column lineage where one column reaches an output along several paths (raw and hashed,
a condition and a value), through opaque operators, DISTINCT / dropDuplicates and subqueries
in the SELECT list: on real PySpark with capture on, against what the official integration
(openlineage-spark) reports."""

from __future__ import annotations

import sys

import pytest

from tests.producer.spark.support import completes_by_output, validated_capture

pytestmark = pytest.mark.spark

APP = "paths"


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory):
    """COMPLETE events of one write per case, by output directory."""
    base = tmp_path_factory.mktemp("paths")
    spark.createDataFrame([(1, "a", 5.0, 10), (2, "b", 7.0, 20), (1, "c", 3.0, 10)],
                          "id INT, v STRING, amt DOUBLE, cid INT").write.parquet(str(base / "orders"))
    spark.createDataFrame([(10, "vip"), (20, "std")], "cid INT, tier STRING").write.parquet(str(base / "customers"))
    swap = base / "swap.py"   # a script TRANSFORM that swaps its two columns (Spark's default delimiter: \x01)
    swap.write_text(f"#!{sys.executable}\nimport sys\nfor line in sys.stdin:\n"
                    "    a, b = line.rstrip('\\n').split('\\x01', 1)\n    print(b + '\\x01' + a)\n")
    swap.chmod(0o755)

    def orders():
        return spark.read.parquet(str(base / "orders"))

    orders().createOrReplaceTempView("paths_orders")
    spark.read.parquet(str(base / "customers")).createOrReplaceTempView("paths_customers")
    sql = spark.sql
    writes = {
        "masked_and_raw": lambda: sql(
            "SELECT concat(v, md5(v)) AS c1, CASE WHEN id > 1 THEN sha2(v, 256) ELSE v END AS c2 FROM paths_orders"),
        "union_masked_raw": lambda: sql("SELECT md5(v) AS v FROM paths_orders UNION ALL SELECT v FROM paths_orders"),
        "script": lambda: sql(f"SELECT TRANSFORM(v, amt) USING '{swap}' AS (v string, amt string) FROM paths_orders"),
        "conditional": lambda: sql(
            "SELECT coalesce(v, 'z') AS a, nvl(amt, 0) AS b, CASE WHEN amt > 4 THEN v ELSE 'low' END AS c, "
            "if(amt > 4, v, NULL) AS d, coalesce(md5(v), 'none') AS e FROM paths_orders"),
        "full_outer": lambda: orders().join(spark.read.parquet(str(base / "customers")), "cid", "full_outer")
        .select("cid", "tier"),
        "distinct": lambda: orders().select("cid").distinct(),
        "sql_distinct": lambda: sql("SELECT DISTINCT cid, v FROM paths_orders"),
        "dedup_keys": lambda: orders().dropDuplicates(["cid"]),
        "sql_union": lambda: sql("SELECT v FROM paths_orders UNION SELECT tier FROM paths_customers"),
        "distinct_of_union": lambda: sql("SELECT DISTINCT * FROM "
                                         "(SELECT v FROM paths_orders UNION ALL SELECT tier FROM paths_customers) t"),
        "select_scalar": lambda: sql("SELECT id, (SELECT max(cid) FROM paths_customers WHERE tier = 'vip') AS mx "
                                     "FROM paths_orders"),
        "select_exists": lambda: sql("SELECT id, EXISTS (SELECT 1 FROM paths_customers c "
                                     "WHERE c.cid = o.cid AND c.tier = 'vip') AS e FROM paths_orders o"),
    }

    def write_all():
        for name, df in writes.items():
            df().write.mode("overwrite").parquet(str(base / name))

    events = completes_by_output(validated_capture(spark, write_all, namespace=APP, app_name=APP))
    return {"events": events, "base": base}


def _facet(written: dict, out: str) -> dict:
    return written["events"][out]["outputs"][0]["facets"]["columnLineage"]


def _column(written: dict, out: str, column: str) -> list[tuple[str, str, str, str, bool]] | None:
    spec = _facet(written, out)["fields"].get(column)
    if spec is None:
        return None
    return sorted((i["name"].rsplit("/", 1)[-1], i["field"], t["type"], t["subtype"], t["masking"])
                  for i in spec["inputFields"] for t in i["transformations"])


def _dataset(written: dict, out: str) -> list[tuple[str, str, str]]:
    return sorted((i["name"].rsplit("/", 1)[-1], i["field"], t["subtype"])
                  for i in _facet(written, out).get("dataset", []) for t in i["transformations"])


def test_a_column_read_both_raw_and_hashed_is_reported_both_ways(written):
    """Masking is one transformation's, not the column's: ``concat(v, md5(v))`` writes v's
    raw values too, so masking=true alone would tell a consumer no raw value of v is there."""
    assert _column(written, "masked_and_raw", "c1") == [
        ("orders", "v", "DIRECT", "TRANSFORMATION", False), ("orders", "v", "DIRECT", "TRANSFORMATION", True)]
    assert _column(written, "masked_and_raw", "c2") == [
        ("orders", "id", "INDIRECT", "CONDITIONAL", False), ("orders", "v", "DIRECT", "IDENTITY", False),
        ("orders", "v", "DIRECT", "TRANSFORMATION", True)]


def test_a_union_keeps_every_branch_s_transformation(spark, written):
    assert _column(written, "union_masked_raw", "v") == [
        ("orders", "v", "DIRECT", "IDENTITY", False), ("orders", "v", "DIRECT", "TRANSFORMATION", True)]
    rows = {r[0] for r in spark.read.parquet(str(written["base"] / "union_masked_raw")).collect()}
    assert {"a", "b", "c"} <= rows   # raw values were written


def test_an_opaque_operator_s_columns_get_no_lineage_by_position(spark, written):
    """The script swaps its columns: ``v`` holds amt's values. Which input feeds which
    output of a script, mapInPandas... is not known: no field (as the official integration)."""
    assert sorted(tuple(r) for r in spark.read.parquet(str(written["base"] / "script")).collect())[0] == ("3.0", "c")
    assert _column(written, "script", "v") is None
    assert _column(written, "script", "amt") is None


@pytest.mark.parametrize("column, expected", [
    ("a", [("orders", "v", "DIRECT", "IDENTITY", False), ("orders", "v", "INDIRECT", "CONDITIONAL", False)]),
    ("b", [("orders", "amt", "DIRECT", "IDENTITY", False), ("orders", "amt", "INDIRECT", "CONDITIONAL", False)]),
    ("c", [("orders", "amt", "INDIRECT", "CONDITIONAL", False), ("orders", "v", "DIRECT", "IDENTITY", False)]),
    ("d", [("orders", "amt", "INDIRECT", "CONDITIONAL", False), ("orders", "v", "DIRECT", "IDENTITY", False)]),
    ("e", [("orders", "v", "DIRECT", "TRANSFORMATION", True), ("orders", "v", "INDIRECT", "CONDITIONAL", True)]),
])
def test_coalesce_nvl_case_and_if_values_are_identities_and_their_choices_conditional(written, column, expected):
    """COALESCE / NVL: each argument is a value of the result and, by being null or not,
    picks it (INDIRECT CONDITIONAL); a CASE / IF branch value is the result as is."""
    assert _column(written, "conditional", column) == expected


def test_a_full_outer_join_using_key_is_the_coalesce_of_both_keys(written):
    assert _column(written, "full_outer", "cid") == [
        ("customers", "cid", "DIRECT", "IDENTITY", False), ("customers", "cid", "INDIRECT", "CONDITIONAL", False),
        ("orders", "cid", "DIRECT", "IDENTITY", False), ("orders", "cid", "INDIRECT", "CONDITIONAL", False)]


@pytest.mark.parametrize("out, grouped_by", [
    ("distinct", [("orders", "cid", "GROUP_BY")]),
    ("sql_distinct", [("orders", "cid", "GROUP_BY"), ("orders", "v", "GROUP_BY")]),
    ("dedup_keys", [("orders", "cid", "GROUP_BY")]),
    ("sql_union", []),
    ("distinct_of_union", []),
])
def test_distinct_and_drop_duplicates_group_by_their_keys(written, out, grouped_by):
    """As the official integration (Spark's optimizer makes them an Aggregate): grouped by
    their keys, except a DISTINCT over a UNION (SQL's UNION), which it leaves ungrouped."""
    assert _dataset(written, out) == grouped_by


def test_a_subquery_in_the_select_list_filters_its_column_not_the_output_rows(written):
    """Every orders row is written: the subquery's WHERE decides the value of ``mx`` only,
    an INDIRECT dependency of that column rather than a FILTER of the dataset."""
    assert _dataset(written, "select_scalar") == []
    assert _column(written, "select_scalar", "mx") == [
        ("customers", "cid", "DIRECT", "AGGREGATION", False), ("customers", "tier", "INDIRECT", "FILTER", False)]
    assert _dataset(written, "select_exists") == []
    assert _column(written, "select_exists", "e") == [
        ("customers", "cid", "INDIRECT", "FILTER", False), ("customers", "tier", "INDIRECT", "FILTER", False),
        ("orders", "cid", "INDIRECT", "FILTER", False)]


def _attr(name: str, expr_id: int) -> list[dict]:
    return [{"class": "org.apache.spark.sql.catalyst.expressions.AttributeReference", "num-children": 0,
             "name": name, "dataType": "integer", "exprId": {"id": expr_id}}]


def test_an_unknown_operator_with_as_many_new_columns_as_its_child_maps_none_by_position():
    from producer.spark import columns
    from producer.spark.plan import parse_plan

    plan = parse_plan([
        {"class": "x.MapInPandas", "num-children": 1, "output": [_attr("a", 8), _attr("z", 9)], "child": 0},
        {"class": "x.LogicalRelation", "num-children": 0, "output": [_attr("a", 1), _attr("b", 2)]},
    ])
    result = columns.trace(plan, lambda i, leaf: 0)
    assert result.columns == [("a", set()), ("z", set())]
