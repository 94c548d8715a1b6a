"""Writes to catalog tables: DataSourceV2 catalogs (a JDBC catalog over an embedded Derby
database, which Spark ships) and ``saveAsTable``'s save modes.

* A V2 table is one stable dataset whichever way it is written or read (``writeTo``,
  ``INSERT``, CTAS), named from its catalog, never from a Java object's hash; a CTAS is
  one run; every event is valid against the OpenLineage schemas.
* MERGE/UPDATE/DELETE are reported (as FAIL runs here: the JDBC catalog refuses them).
* ``lifecycleStateChange`` follows the save mode: CREATE, OVERWRITE, nothing for an append.
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from producer.spark import capture, disable_lineage, enable_lineage
from producer.spark.capture import CaptureSettings
from producer.spark.relations import Relation
from tests.producer.spark.support import Recorder, drain
from tests.support.spec import validator

pytestmark = pytest.mark.spark

_DB = itertools.count()


@pytest.fixture
def jdbc_catalog(spark, tmp_path_factory):
    """A JDBC catalog over a fresh in-memory Derby database (its URL carries a password)."""
    # Derby writes derby.log into the working directory unless told otherwise.
    spark._jvm.java.lang.System.setProperty("derby.stream.error.file",
                                            str(tmp_path_factory.mktemp("derby") / "derby.log"))
    name = f"dby{next(_DB)}"
    db = f"v2_{uuid.uuid4().hex[:8]}"
    spark.conf.set(f"spark.sql.catalog.{name}",
                   "org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog")
    spark.conf.set(f"spark.sql.catalog.{name}.url", f"jdbc:derby:memory:{db};create=true;user=app;password=S3CRET")
    spark.conf.set(f"spark.sql.catalog.{name}.driver", "org.apache.derby.jdbc.EmbeddedDriver")
    return name


@pytest.fixture
def captured(spark):
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="tw", app_name="tw")
    try:
        yield recorder
    finally:
        drain(spark)
        disable_lineage(spark)


def _runs(recorder: Recorder, since: int = 0) -> list[list[dict]]:
    by_run: dict[str, list[dict]] = {}
    for e in recorder.events[since:]:
        if e["job"]["name"] != "tw":
            by_run.setdefault(e["run"]["runId"], []).append(e)
    return list(by_run.values())


def _step(spark, recorder: Recorder, action) -> list[list[dict]]:
    since = len(recorder.events)
    action()
    drain(spark)
    return _runs(recorder, since)


def test_a_v2_table_is_one_stable_valid_dataset_and_a_ctas_is_one_run(spark, tmp_path, jdbc_catalog, captured):
    src = str(tmp_path / "src")
    spark.createDataFrame([(1, "a")], "id INT, v STRING").write.mode("overwrite").parquet(src)
    drain(spark)
    table = f"{jdbc_catalog}.APP.T1"

    ctas = _step(spark, captured, lambda: spark.sql(f"CREATE TABLE {table} AS SELECT * FROM parquet.`{src}`"))
    append = _step(spark, captured, lambda: spark.read.parquet(src).writeTo(table).append())
    insert = _step(spark, captured, lambda: spark.sql(f"INSERT INTO {table} SELECT * FROM parquet.`{src}`"))
    read = _step(spark, captured, lambda: spark.table(table).write.mode("overwrite").parquet(str(tmp_path / "out")))

    assert len(ctas) == 1, [r[0]["job"]["name"] for r in ctas]
    assert [e["eventType"] for e in ctas[0]] == ["START", "COMPLETE"]
    for run in ctas + append + insert + read:
        for e in run:
            validator().validate(e)
    written = {(d["namespace"], d["name"]) for run in ctas + append + insert for d in run[-1]["outputs"]}
    read_from = {(d["namespace"], d["name"]) for d in read[0][-1]["inputs"]}
    assert len(written) == 1 and written == read_from, (written, read_from)
    namespace, name = written.pop()
    assert name.endswith("APP.T1") and "@" not in name and "Resolved" not in name
    assert "S3CRET" not in namespace + name
    # As the official integration: the executed plan's root node, the identifier's parts.
    assert ctas[0][-1]["job"]["name"] == "tw.create_table_as_select.APP_T1"
    assert append[0][-1]["job"]["name"] == "tw.append_data_exec_v1.APP_T1"  # a V1-writable table: AppendDataExecV1
    assert insert[0][-1]["job"]["name"] == "tw.append_data_exec_v1.APP_T1"
    assert ctas[0][-1]["outputs"][0]["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "CREATE"


def test_merge_update_and_delete_on_a_v2_table_are_reported_not_dropped(spark, tmp_path, jdbc_catalog, captured):
    target, source = f"{jdbc_catalog}.APP.T", f"{jdbc_catalog}.APP.S"
    spark.createDataFrame([(1, "a")], "id INT, v STRING").writeTo(target).create()
    spark.createDataFrame([(1, "b")], "id INT, v STRING").writeTo(source).create()
    drain(spark)
    statements = {
        "merge_into_table": f"MERGE INTO {target} t USING {source} s ON t.id = s.id "
                            "WHEN MATCHED THEN UPDATE SET v = s.v",
        "update_table": f"UPDATE {target} SET v = 'z' WHERE id = 1",
        "delete_from_table": f"DELETE FROM {target} WHERE id = 1",
    }
    for command, sql in statements.items():
        def run(sql=sql):
            with pytest.raises(Exception):  # noqa: B017 - the JDBC catalog supports none of them
                spark.sql(sql)
        runs = _step(spark, captured, run)
        assert len(runs) == 1, command
        start, end = runs[0]
        assert end["eventType"] == "FAIL" and "errorMessage" in end["run"]["facets"]
        # Not planned (refused): no node part, as the official integration; the target's identifier.
        assert end["job"]["name"] == "tw.APP_T", end["job"]["name"]
        assert [d["name"].rsplit(".", 2)[-2:] for d in end["outputs"]] == [["APP", "T"]]
        if command == "merge_into_table":
            assert [d["name"].rsplit(".", 2)[-2:] for d in end["inputs"]] == [["APP", "S"]]
        for e in (start, end):
            validator().validate(e)


def test_a_v2_table_is_named_by_its_location_else_by_catalog_and_identifier():
    settings = CaptureSettings(warehouse="/wh")
    [by_location] = capture.dataset_refs(
        Relation(v2_name="db.t", v2_catalog="iceberg", location="s3a://bucket/wh/db/t"), settings)
    assert (by_location.namespace, by_location.name) == ("s3://bucket", "wh/db/t")
    assert by_location.symlink == ("spark-catalog://iceberg", "db.t")
    [by_name] = capture.dataset_refs(Relation(v2_name="db.t", v2_catalog="my_cat"), settings)
    assert (by_name.namespace, by_name.name) == ("spark-catalog://my_cat", "db.t")
    [session] = capture.dataset_refs(Relation(v2_name="db.t", v2_catalog="spark_catalog"), settings)
    assert (session.namespace, session.name) == ("file:/wh", "db.t"), "as a V1 table of that catalog"


@pytest.mark.parametrize("namespace, uri", [
    ("file", "file:///"), ("spark_catalog", "spark-catalog:///"), ("s3://bucket", "s3://bucket"),
    ("spark-catalog://my cat", "spark-catalog://my%20cat"),
])
def test_the_data_source_uri_is_always_a_valid_uri(namespace, uri):
    facets = capture.dataset_facets(capture.DatasetRef(namespace, "t"), None)
    assert facets["dataSource"]["uri"] == uri
    assert facets["dataSource"]["name"] == namespace


def test_save_as_table_reports_the_lifecycle_change_its_save_mode_makes(spark, captured):
    from pyspark.sql import functions as F

    df = spark.range(3).select(F.col("id").cast("int").alias("id"))
    table = f"tw_{uuid.uuid4().hex[:8]}"
    lifecycle = {}
    for label, write in [("new", lambda: df.write.saveAsTable(table)),
                         ("append", lambda: df.write.mode("append").saveAsTable(table)),
                         ("overwrite", lambda: df.write.mode("overwrite").saveAsTable(table))]:
        runs = _step(spark, captured, write)
        [output] = [d for run in runs for d in run[-1]["outputs"] if d["name"].endswith("/" + table)]
        lifecycle[label] = output["facets"].get("lifecycleStateChange", {}).get("lifecycleStateChange")
    spark.sql(f"DROP TABLE {table}")
    assert lifecycle == {"new": "CREATE", "append": None, "overwrite": "OVERWRITE"}


def test_a_metastore_uri_names_no_table_of_an_in_memory_catalog(spark, tmp_path):
    """``hive.metastore.uris`` in the Hadoop configuration (a cluster's hive-site.xml) while
    the session's catalog is in-memory: the table is not the metastore's, its symlink names
    the warehouse (it was ``hive://metastore.prod:9083``), as the official integration's
    ``PathUtils.extractMetastoreUri`` decides by ``spark.sql.catalogImplementation``."""
    from tests.producer.spark.support import Recorder, drain
    from tests.support.spec import validator

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("hive.metastore.uris", "thrift://metastore.prod:9083")
    recorder = Recorder()
    try:
        enable_lineage(spark, producer=recorder, namespace="hms", app_name="hms")
        try:
            spark.createDataFrame([(1,)], "id INT").write.mode("overwrite").saveAsTable("hms_in_memory_t")
            drain(spark)
        finally:
            disable_lineage(spark)
    finally:
        hadoop.unset("hive.metastore.uris")
        spark.sql("DROP TABLE IF EXISTS hms_in_memory_t")
    [done] = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["outputs"]]
    [link] = done["outputs"][0]["facets"]["symlinks"]["identifiers"]
    warehouse = spark.conf.get("spark.sql.warehouse.dir")
    assert not link["namespace"].startswith("hive://")
    assert link["namespace"].rstrip("/").endswith(warehouse.rstrip("/").split(":", 1)[-1])
    assert link["name"].endswith("hms_in_memory_t")
    for event in recorder.events:
        validator().validate(event)
    # A Hive catalog's tables are the metastore's.
    from producer.spark import _metastore_uris

    assert _metastore_uris(spark, {"spark.sql.catalogImplementation": "in-memory",
                                   "hive.metastore.uris": "thrift://ms:9083"}) is None
    assert _metastore_uris(spark, {"spark.sql.catalogImplementation": "hive",
                                   "hive.metastore.uris": "thrift://ms:9083"}) == "thrift://ms:9083"
