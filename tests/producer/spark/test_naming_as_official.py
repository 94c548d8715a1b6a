"""Names the official Spark integration and the naming spec give, where ours differed: Azure's
schemes without TLS, host names as written, a JDBC ``dbtable`` that is a FROM clause, SQL
Server's named instances, Trino's ``catalog.schema.table`` and the symlink of a table of
Spark's built-in catalog (the directory holding it, not always the warehouse)."""

from __future__ import annotations

import pytest

from producer.spark import capture
from producer.spark.capture import CaptureSettings
from producer.spark.naming import from_jdbc, from_path, is_jdbc_query, jdbc_datasets, table_symlink_namespace
from producer.spark.relations import Relation


@pytest.mark.parametrize("uri, expected", [
    # abfs/wasb are the same stores as abfss/wasbs: the spec names only the TLS schemes.
    ("abfs://cont@acct.dfs.core.windows.net/data/t", ("abfss://cont@acct.dfs.core.windows.net", "data/t")),
    ("abfss://cont@acct.dfs.core.windows.net/data/t", ("abfss://cont@acct.dfs.core.windows.net", "data/t")),
    ("wasb://cont@acct.blob.core.windows.net/data/t", ("wasbs://cont@acct.blob.core.windows.net", "data/t")),
    ("wasbs://cont@acct.blob.core.windows.net/data/t", ("wasbs://cont@acct.blob.core.windows.net", "data/t")),
    ("ABFS://cont@acct.dfs.core.windows.net:443/data/t", ("abfss://cont@acct.dfs.core.windows.net", "data/t")),
])
def test_azure_paths_without_tls_are_named_by_the_tls_scheme(uri, expected):
    assert from_path(uri) == expected


@pytest.mark.parametrize("uri, expected", [
    ("hdfs://MyCluster/data/t", ("hdfs://MyCluster", "/data/t")),          # an HA nameservice ID
    ("hdfs://NameNode.Corp:8020/data/t", ("hdfs://NameNode.Corp:8020", "/data/t")),
    ("s3a://MyBucket/x", ("s3://MyBucket", "x")),
    ("s3a://AKIAX:S3cretPw@MyBucket/x", ("s3://MyBucket", "x")),           # user info still dropped
    ("gs://MyBucket/x", ("gs://MyBucket", "x")),
    ("HDFS://MyCluster/x", ("hdfs://MyCluster", "/x")),                    # the scheme lower-cased
])
def test_a_file_system_host_is_kept_as_written(uri, expected):
    assert from_path(uri) == expected


def test_a_jdbc_host_and_a_metastore_host_are_kept_as_written():
    assert from_jdbc("jdbc:postgresql://DB.Example.COM/Sales", "public.orders") == (
        "postgres://DB.Example.COM:5432", "Sales.public.orders")
    assert from_jdbc("jdbc:mysql://etl:S3cretPw@Db1:3306,DB2/shop", "t") == ("mysql://Db1:3306,DB2:3306", "shop.t")
    assert from_jdbc("jdbc:postgresql://[::1]/shop", "t") == ("postgres://[::1]:5432", "shop.t")
    assert table_symlink_namespace("thrift://MetaStore.Corp:9083", "/wh") == "hive://MetaStore.Corp:9083"


DERBY = "jdbc:derby:memory:shop"


@pytest.mark.parametrize("dbtable, tables", [
    ("APP.ORDERS o", ["memory.APP.ORDERS"]),
    ("APP.ORDERS AS o", ["memory.APP.ORDERS"]),
    ("APP.ORDERS o JOIN APP.CUSTOMERS c ON o.CID = c.ID", ["memory.APP.ORDERS", "memory.APP.CUSTOMERS"]),
    ('APP.ORDERS o\n  LEFT JOIN "App"."Customers" c ON o."cid" = c."cust_id"',
     ["memory.APP.ORDERS", "memory.App.Customers"]),
])
def test_a_jdbc_dbtable_that_is_a_from_clause_is_read_as_a_query_of_its_tables(dbtable, tables):
    """Spark reads ``SELECT * FROM <dbtable>``: a dbtable holding whitespace is a FROM clause
    (as the official JdbcSparkUtils reads it), one dataset per table, not one dataset named
    by the whole text."""
    assert is_jdbc_query(dbtable)
    assert jdbc_datasets(DERBY, dbtable) == ([("derby://", t) for t in tables], None)
    if len(tables) == 1:
        assert from_jdbc(DERBY, dbtable) == ("derby://", tables[0])


@pytest.mark.parametrize("dbtable", ["APP.ORDERS", '"APP"."My Orders"', "[dbo].[My Orders]", "`my orders`", " t "])
def test_a_jdbc_dbtable_naming_one_table_is_no_query(dbtable):
    assert not is_jdbc_query(dbtable)
    assert jdbc_datasets(DERBY, dbtable) == ([("derby://", f"memory.{dbtable.strip()}")], None)


def test_a_from_clause_too_involved_to_read_names_no_table_and_says_why():
    datasets, why = jdbc_datasets(DERBY, "APP.ORDERS o JOIN (SELECT * FROM APP.C) c ON o.CID = c.ID")
    assert datasets == [] and "too complex" in why
    # Spark's own wrapping of a `query` read keeps working.
    assert jdbc_datasets(DERBY, "(SELECT * FROM APP.ORDERS) SPARK_GEN_SUBQ_0") == (
        [("derby://", "memory.APP.ORDERS")], None)


@pytest.mark.parametrize("url, namespace", [
    ("jdbc:sqlserver://sqlhost\\INST1;databaseName=sales", "sqlserver://sqlhost/INST1"),
    ("jdbc:sqlserver://sqlhost;instanceName=INST1;databaseName=sales", "sqlserver://sqlhost/INST1"),
    ("jdbc:sqlserver://sqlhost\\INST1:1444;databaseName=sales", "sqlserver://sqlhost:1444/INST1"),
    ("jdbc:sqlserver://sqlhost:1444;instanceName=INST1;databaseName=sales", "sqlserver://sqlhost:1444/INST1"),
    ("jdbc:sqlserver://sqlhost;instanceName=INST1;portNumber=1444;databaseName=sales",
     "sqlserver://sqlhost:1444/INST1"),
    ("jdbc:sqlserver://;serverName=sqlhost\\INST1;databaseName=sales;password=S3cretPw",
     "sqlserver://sqlhost/INST1"),
    # The default instance, as before.
    ("jdbc:sqlserver://sqlhost:1433;databaseName=sales;user=etl;password=S3cretPw", "sqlserver://sqlhost:1433"),
    ("jdbc:sqlserver://sqlhost;databaseName=sales", "sqlserver://sqlhost"),
])
def test_a_sql_server_named_instance_is_part_of_the_namespace(url, namespace):
    assert from_jdbc(url, "dbo.orders") == (namespace, "sales.dbo.orders")


@pytest.mark.parametrize("url, table, name", [
    ("jdbc:trino://trino.example.com:8080/hive/sales", "orders", "hive.sales.orders"),
    ("jdbc:trino://trino.example.com:8080/hive/sales?user=etl&password=S3cretPw", "orders", "hive.sales.orders"),
    ("jdbc:trino://trino.example.com:8080/hive", "sales.orders", "hive.sales.orders"),
    ("jdbc:trino://trino.example.com:8080", "hive.sales.orders", "hive.sales.orders"),
])
def test_a_trino_table_is_named_catalog_schema_table(url, table, name):
    assert from_jdbc(url, table) == ("trino://trino.example.com:8080", name)


@pytest.mark.parametrize("location, namespace", [
    ("file:/tmp/wh/mydb.db/t1", "file:/tmp/wh/mydb.db"),                 # a database's table
    ("file:/tmp/wh/t0", "file:/tmp/wh"),                                 # the default database's
    ("/data/ext/t2", "file:/data/ext"),                                  # an external table
    ("hdfs://NN:8020/user/hive/warehouse/db.db/t", "hdfs://NN:8020/user/hive/warehouse/db.db"),
    ("s3a://bucket/wh/db.db/t/", "s3://bucket/wh/db.db"),
    ("s3a://bucket/t", "s3://bucket"),
])
def test_a_built_in_catalog_table_is_named_in_the_directory_holding_it(location, namespace):
    assert table_symlink_namespace(None, "/tmp/wh", location) == namespace
    assert table_symlink_namespace("thrift://ms:9083", "/tmp/wh", location) == "hive://ms:9083"
    assert table_symlink_namespace(None, "/tmp/wh") == "file:/tmp/wh"   # no location known


def test_a_table_relation_symlink_names_the_directory_holding_the_table():
    settings = CaptureSettings(warehouse="/tmp/wh")
    [v1] = capture.dataset_refs(Relation(table="locdb.t3", location="file:/data/elsewhere/locdb/t3"), settings)
    assert (v1.namespace, v1.name, v1.symlink) == ("file", "/data/elsewhere/locdb/t3",
                                                   ("file:/data/elsewhere/locdb", "locdb.t3"))
    [v2] = capture.dataset_refs(Relation(v2_name="db.t", v2_catalog="spark_catalog",
                                         location="s3a://bucket/lake/db/t"), settings)
    assert (v2.namespace, v2.name, v2.symlink) == ("s3://bucket", "lake/db/t", ("s3://bucket/lake/db", "db.t"))
    hive = capture.dataset_refs(Relation(table="db.t", location="hdfs://nn/wh/db.db/t"),
                                CaptureSettings(warehouse="/wh", metastore_uris="thrift://ms:9083"))
    assert hive[0].symlink == ("hive://ms:9083", "db.t")
    [unknown] = capture.dataset_refs(Relation(table="db.t"), settings)
    assert (unknown.namespace, unknown.name) == ("file:/tmp/wh", "db.t")


@pytest.mark.spark
def test_a_from_clause_jdbc_read_and_warehouse_table_symlinks_in_spark(spark, tmp_path):
    """The wiring: a ``dbtable`` FROM clause read gives one input per table, with no schema
    facet and no column lineage credited to either; catalog tables (in a database, external,
    in a database created WITH LOCATION) are named in the directory holding them."""
    from tests.producer.spark.support import completes_by_output, validated_capture

    spark._jvm.java.lang.System.setProperty("derby.stream.error.file", str(tmp_path / "derby.log"))
    url = "jdbc:derby:memory:lineage_relay_from;create=true"
    spark.range(2).selectExpr("cast(id as int) id", "cast(id as int) cid").write.jdbc(url, "APP.ORDERS")
    spark.range(2).selectExpr("cast(id as int) cust_id", "cast(id as string) name").write.jdbc(url, "APP.CUSTOMERS")
    out = str(tmp_path / "from_clause")
    databases = ["lr_mydb", "lr_locdb"]
    try:
        spark.sql("CREATE DATABASE lr_mydb")
        spark.sql(f"CREATE DATABASE lr_locdb LOCATION '{tmp_path}/elsewhere/lr_locdb'")

        def act():
            (spark.read.format("jdbc").option("url", url)
             .option("dbtable", 'APP.ORDERS o JOIN APP.CUSTOMERS c ON o."cid" = c."cust_id"').load()
             .write.mode("overwrite").parquet(out))
            spark.sql("CREATE TABLE lr_mydb.t1 USING parquet AS SELECT 1 AS a")
            spark.sql(f"CREATE TABLE lr_mydb.t2 USING parquet LOCATION '{tmp_path}/ext/t2' AS SELECT 1 AS a")
            spark.sql("CREATE TABLE lr_locdb.t3 USING parquet AS SELECT 1 AS a")
        done = completes_by_output(validated_capture(spark, act, namespace="from", app_name="from"))
    finally:
        for db in databases:
            spark.sql(f"DROP DATABASE IF EXISTS {db} CASCADE")
        try:
            spark._jvm.java.sql.DriverManager.getConnection("jdbc:derby:memory:lineage_relay_from;drop=true")
        except Exception:  # noqa: BLE001 - Derby reports a dropped database by an exception
            pass
    read = done["from_clause"]
    assert [(d["namespace"], d["name"]) for d in read["inputs"]] == [
        ("derby://", "memory.APP.ORDERS"), ("derby://", "memory.APP.CUSTOMERS")]
    assert all("schema" not in d["facets"] for d in read["inputs"])
    lineage = read["outputs"][0]["facets"].get("columnLineage", {})
    assert not lineage.get("fields") and not lineage.get("dataset")

    warehouse = spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:").rstrip("/")
    expected = {"t1": (f"file:{warehouse}/lr_mydb.db", "lr_mydb.t1"),
                "t2": (f"file:{tmp_path}/ext", "lr_mydb.t2"),
                "t3": (f"file:{tmp_path}/elsewhere/lr_locdb", "lr_locdb.t3")}
    for table, (namespace, name) in expected.items():
        [link] = done[table]["outputs"][0]["facets"]["symlinks"]["identifiers"]
        assert (link["namespace"], link["name"]) == (namespace, name), table
