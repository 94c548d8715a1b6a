"""JDBC reads through a query and catalog-table symlinks on a remote warehouse: the names a
user's lineage graph joins on, never a made-up dataset shared by unrelated jobs."""

from __future__ import annotations

import pytest

from producer.spark.naming import from_jdbc, jdbc_datasets, jdbc_query_tables, table_symlink_namespace

PG = "jdbc:postgresql://db:5432/sales"


@pytest.mark.parametrize("query, tables", [
    # What Spark passes for .option("query", ...): "(<query>) SPARK_GEN_SUBQ_<n>".
    ("(select * from orders where x = 1) SPARK_GEN_SUBQ_0", ["orders"]),
    ("(select * from customers) SPARK_GEN_SUBQ_1", ["customers"]),
    ("(SELECT o.id FROM sales.orders o JOIN \"Crm\".\"Customers\" AS c ON o.c = c.id) t",
     ["sales.orders", "Crm.Customers"]),
    ("select a from t1, t2 x, s.t3 as y;", ["t1", "t2", "s.t3"]),
    ("select extract(year from d), 'from x' from t left outer join u using (id) order by 1", ["t", "u"]),
    ("select 1", []),
])
def test_the_tables_of_a_simple_query_are_read_from_its_from_and_join_clauses(query, tables):
    assert jdbc_query_tables(query) == tables


@pytest.mark.parametrize("query", [
    "select * from (select * from t) x",                      # derived table
    "select * from t where id in (select id from u)",         # subquery
    "with c as (select * from t) select * from c",            # CTE
    "select * from t union all select * from u",              # set operation
    "select * from generate_series(1, 3)",                    # table function
    "select * from t -- from secret_table",                   # comment
    "select * from remote.t@dblink",                          # Oracle database link
])
def test_a_query_too_involved_to_read_safely_names_no_table(query):
    assert jdbc_query_tables(query) is None
    datasets, why = jdbc_datasets(PG, f"({query}) SPARK_GEN_SUBQ_0")
    assert datasets == [] and "no input dataset" in why


def test_queries_on_different_tables_are_different_datasets_not_one_db_query():
    first = from_jdbc(PG, "(select * from orders where x = 1) SPARK_GEN_SUBQ_0")
    second = from_jdbc(PG, "(select * from customers) SPARK_GEN_SUBQ_1")
    assert first == ("postgres://db:5432", "sales.orders")
    assert second == ("postgres://db:5432", "sales.customers")
    assert jdbc_datasets(PG, "(select * from a join b on a.i = b.i) SPARK_GEN_SUBQ_2") == (
        [("postgres://db:5432", "sales.a"), ("postgres://db:5432", "sales.b")], None)
    assert jdbc_datasets(PG, "public.orders") == ([("postgres://db:5432", "sales.public.orders")], None)


@pytest.mark.parametrize("warehouse, namespace", [
    ("hdfs://nn:8020/user/hive/warehouse", "hdfs://nn:8020/user/hive/warehouse"),
    ("s3a://bucket/warehouse/", "s3://bucket/warehouse"),
    ("file:/tmp/wh", "file:/tmp/wh"),
    ("/tmp/wh", "file:/tmp/wh"),
])
def test_the_warehouse_symlink_namespace_has_no_double_slash(warehouse, namespace):
    assert table_symlink_namespace(None, warehouse) == namespace
    assert table_symlink_namespace("thrift://ms:9083,thrift://ms2:9083", warehouse) == "hive://ms:9083"


def test_a_jdbc_query_is_read_as_the_tables_it_names_or_as_none_with_the_reason():
    """The reader's `query` option was one made-up dataset, `<db>.query`, linking every job
    that queried the database; now its tables, or no input and an extractionError."""
    from producer.spark import capture
    from producer.spark.capture import CaptureSettings
    from producer.spark.relations import Relation

    url = "jdbc:postgresql://etl:pw@db:5432/sales"
    errors: list[dict] = []
    refs = capture.dataset_refs(Relation(jdbc_url=url, jdbc_table="SELECT o.id FROM public.orders o "
                                                                   "JOIN public.customers c ON o.c = c.id"),
                                CaptureSettings(), errors)
    assert [(r.namespace, r.name) for r in refs] == [("postgres://db:5432", "sales.public.orders"),
                                                     ("postgres://db:5432", "sales.public.customers")]
    assert errors == []
    assert capture.dataset_refs(Relation(jdbc_url=url, jdbc_table="SELECT * FROM (SELECT 1) x"),
                                CaptureSettings(), errors) == []
    assert len(errors) == 1 and "too complex" in errors[0]["errorMessage"]


@pytest.mark.spark
def test_a_jdbc_query_read_invents_no_column_and_no_schema_for_its_table(spark, tmp_path):
    """A JDBC ``query`` read names the table it reads, but its columns are the query's
    result (``"id" * 2 AS dbl``): they were credited to the table as IDENTITY columns it
    does not have (``T1.dbl``), with a schema facet of them on the table. Now neither."""
    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain
    from tests.support.spec import validator

    # Derby writes its log where the JVM runs unless told (read when Derby boots).
    spark._jvm.java.lang.System.setProperty("derby.stream.error.file", str(tmp_path / "derby.log"))
    url = "jdbc:derby:memory:lineage_relay_jq;create=true"
    spark.createDataFrame([(1, "x")], "id INT, name STRING").write.mode("overwrite").jdbc(url, "APP.T1")
    out = str(tmp_path / "jq")
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="jq", app_name="jq")
    try:
        (spark.read.format("jdbc").option("url", url)
         .option("query", 'SELECT "id" * 2 AS dbl, upper("name") AS uname FROM APP.T1').load()
         .write.mode("overwrite").parquet(out))
        drain(spark)
    finally:
        disable_lineage(spark)
        try:
            spark._jvm.java.sql.DriverManager.getConnection("jdbc:derby:memory:lineage_relay_jq;drop=true")
        except Exception:  # noqa: BLE001 - Derby reports a dropped database by an exception
            pass
    [done] = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["outputs"]
              and e["outputs"][0]["name"] == out]
    assert [d["name"] for d in done["inputs"]] == ["memory.APP.T1"]   # derby:memory: "memory" as database
    assert "schema" not in done["inputs"][0]["facets"]
    lineage = done["outputs"][0]["facets"].get("columnLineage", {})
    assert not lineage.get("fields") and not lineage.get("dataset")
    for event in recorder.events:
        validator().validate(event)
