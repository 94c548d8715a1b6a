"""Job names equal to the official OpenLineage Spark integration's (openlineage-spark), so a
job keeps its name, and its history, whichever of the two reports it.

* The application job: ``spark.openlineage.appName``, else the Glue job's name when Glue
  generated ``spark.app.name``, else ``spark.app.name``, normalized as the official
  ``NameNormalizer`` does; its ``jobType`` has processingType NONE.
* An action's job: ``<app>.<executed plan's root node>.<the output's suffix>`` (the official
  ``JobNameBuilder``), with ``spark.openlineage.jobName.*`` honoured.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from producer.errors import ConfigError
from producer.spark import disable_lineage, enable_lineage, job_names
from producer.spark.jvm import ActionSnapshot
from producer.spark.relations import Relation
from tests.producer.spark.support import Recorder, drain


@pytest.mark.parametrize(("name", "normalized"), [
    # examples from the official NameNormalizer's behaviour
    ("s3load", "s3_load"),
    ("café_etl", "cafe_etl"),
    ("_private_", "_private_"),
    ("Execute InsertIntoHadoopFsRelationCommand", "execute_insert_into_hadoop_fs_relation_command"),
    ("AdaptiveSparkPlan", "adaptive_spark_plan"),
    ("AppendDataExecV1", "append_data_exec_v1"),
    ("CreateTableAsSelect", "create_table_as_select"),
    ("camelCaseExample", "camel_case_example"),
    ("someACRONYMInside", "some_acronym_inside"),
    ("OrdersETL", "orders_etl"),
    ("ETLJob", "etl_job"),
    ("2024report", "2024_report"),
    ("etl-v2.final", "etl_v2_final"),
    ("  My Spark App!! ", "my_spark_app"),
    ("Café", "caf"),  # Java's \w is ASCII: a trailing accented letter is trimmed before accents go
    ("orders_etl", "orders_etl"),
    ("!!!", ""),
])
def test_normalize_as_the_official_name_normalizer(name, normalized):
    assert job_names.normalize(name) == normalized


@pytest.mark.parametrize(("name", "suffix"), [
    ("/tmp/lake/silver/orders", "silver_orders"),
    ("lake/silver/orders/", "silver_orders"),
    ("bucket-key/orders", "bucket-key_orders"),
    ("a/", "a"),
    ("orders", "orders"),
    ("/orders", "/orders"),   # as the official trimPath: a slash only at 0 is "not a path"
    ("db.t", "db.t"),
])
def test_trim_path_as_the_official_one(name, suffix):
    assert job_names.trim_path(name) == suffix


def test_application_name_from_conf_glue_and_fallbacks():
    name = job_names.application_name
    assert name({"spark.app.name": "OrdersETL"}) == "orders_etl"
    assert name({"spark.app.name": "x", "spark.openlineage.appName": "My App"}) == "my_app"
    assert name({"spark.app.name": "x", "spark.openlineage.appName": "My App"}, "kw") == "kw", "the keyword wins"
    glue = {"spark.glue.GLUE_VERSION": "4.0", "spark.glue.JOB_NAME": "Send data - V2",
            "spark.glue.JOB_RUN_ID": "jr_27897ad7"}
    assert name({**glue, "spark.app.name": "nativespark-Send data - V2-jr_27897ad7"}) == "send_data_v2"
    assert name(glue) == "send_data_v2", "no spark.app.name on Glue: the job's name"
    assert name({**glue, "spark.app.name": "mine"}) == "mine", "a name the user gave wins on Glue"
    assert name({**glue, "spark.app.name": "mine", "spark.openlineage.appName": "ol"}) == "ol"
    assert name({"spark.app.name": "nativespark-a-b"}) == "nativespark_a_b", "not on Glue"
    assert name({}) == "unknown" and name({"spark.app.name": "  "}) == "unknown", "as the official fallback"
    assert name({"spark.app.name": "!!!"}) == "spark_application", "never an empty name"


def _snap(command: str, output: Relation | None, **kwargs) -> ActionSnapshot:
    return ActionSnapshot(func="command", command=command, output=output, **kwargs)


def test_suffix_per_command():
    suffix = job_names.suffix
    file_write = _snap("InsertIntoHadoopFsRelationCommand", Relation(paths=["file:/l/silver/orders"]))
    assert suffix(file_write, "/l/silver/orders") == "silver_orders"
    table_insert = _snap("InsertIntoHadoopFsRelationCommand", Relation(table="db.t", location="file:/wh/db.db/t"))
    assert suffix(table_insert, "/wh/db.db/t") == "db.db_t", "the table's location, as the official"
    hive_insert = _snap("InsertIntoHiveTable", Relation(table="db.t", location="file:/wh/db.db/t"))
    assert suffix(hive_insert, "/wh/db.db/t") == "db.db_t"
    ctas = _snap("CreateDataSourceTableAsSelectCommand", Relation(table="gold.daily", location="file:/wh/d"))
    assert suffix(ctas, "/wh/d") == "gold.daily", "tableIdentifierToSuffix"
    hive_ctas = _snap("CreateHiveTableAsSelectCommand", Relation(table="gold.daily", location="file:/wh/d"))
    assert suffix(hive_ctas, "/wh/d") == "gold.daily", "not found in the official source: our table rule"
    v2 = Relation(v2_name="db.t", v2_catalog="iceberg", location="s3://b/wh/db/t")
    for command in ("AppendData", "OverwriteByExpression", "CreateTableAsSelect", "ReplaceTableAsSelect",
                    "MergeIntoTable", "WriteDelta", "MergeIntoCommand"):
        assert suffix(_snap(command, v2), "wh/db/t") == "db.t", command
    jdbc_v2 = Relation(jdbc_url="jdbc:derby:memory:x", jdbc_table="APP.T")
    assert suffix(_snap("AppendData", jdbc_v2), "x.APP.T") == "APP.T"
    save = _snap("SaveIntoDataSourceCommand", Relation(paths=["file:/cwd/out/t"]), output_suffix="out_t")
    assert suffix(save, "/cwd/out/t") == "out_t", "computed from the options in the snapshot"
    assert suffix(_snap("SaveIntoDataSourceCommand", None), None) is None


class _ScalaOptions:
    """A Scala Map[String, String] as py4j shows it: get() -> Option, keys().mkString(sep)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = options

    def get(self, key: str):
        value = self._options.get(key)
        return SimpleNamespace(isDefined=lambda: value is not None, get=lambda: value)

    def keys(self):
        return SimpleNamespace(mkString=lambda sep: sep.join(self._options))


@pytest.mark.parametrize(("source", "path", "options", "expected"), [
    ("DeltaDataSource", "/lake/silver/orders", {"path": "/lake/silver/orders"}, "silver_orders"),
    ("DefaultSource", None, {"kustotable": "events", "table": "t"}, "events"),
    ("DefaultSource", None, {"sfurl": "x", "table": "orders"}, "orders"),
    ("SnowflakeSource", None, {"sfurl": "x", "dbtable": "ORDERS"}, "ORDERS"),
    ("DefaultSource", "/h/t", {"path": "/h/t", "hoodie.table.name": "trips"}, "trips"),
    ("DefaultSource", None, {"url": "x", "format": "y"}, None),
])
def test_a_save_suffix_is_the_first_table_option_as_the_official_visitor_finds_it(source, path, options, expected):
    from producer.spark.plain_reads import save_suffix

    assert save_suffix(source, path, _ScalaOptions(options), None) == expected


def test_a_v2_identifiers_quoting_is_not_part_of_its_suffix():
    v2 = Relation(v2_name="db.`my-t`", v2_catalog="iceberg", location="s3://b/wh/db/my-t")
    assert job_names.suffix(_snap("AppendData", v2), "wh/db/my-t") == "db.my-t"


def test_child_name_and_its_options():
    child = job_names.child_name
    assert child("app", "Execute InsertIntoHadoopFsRelationCommand", "silver_orders") == \
        "app.execute_insert_into_hadoop_fs_relation_command.silver_orders"
    assert child("app", "AppendData", "db.t") == "app.append_data.db_t", "dots in the suffix become _"
    assert child("app", None, "db.t") == "app.db_t", "no executed plan: no node part"
    assert child("app", "AppendData", None) == "app.append_data"
    assert child("app", "AppendData", "db.t", append_dataset_name=False) == "app.append_data"
    # The official builder replaces dots in the normalized node name, which has none.
    assert child("app", "AppendData", "db.t", replace_dot_with_underscore=True) == "app.append_data.db_t"


# -- with Spark -------------------------------------------------------------------------

def _capture(spark, monkeypatch, conf: dict[str, str] | None = None, app_name: str | None = "jn"):
    if conf:
        real = spark.sparkContext.getConf().getAll()
        monkeypatch.setattr(spark.sparkContext, "getConf",
                            lambda: SimpleNamespace(getAll=lambda: [*real, *conf.items()]))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=app_name)
    return recorder


def _names(recorder: Recorder, app: str = "jn") -> list[str]:
    return [e["job"]["name"] for e in recorder.events if e["eventType"] != "START" and e["job"]["name"] != app]


@pytest.mark.spark
def test_names_of_a_path_write_a_table_insert_a_ctas_a_jdbc_save_and_a_failed_write(spark, tmp_path, monkeypatch):
    spark._jvm.java.lang.System.setProperty("derby.stream.error.file", str(tmp_path / "derby.log"))
    url = f"jdbc:derby:memory:jn_{tmp_path.name[-8:]};create=true"
    recorder = _capture(spark, monkeypatch)
    try:
        spark.range(3).write.mode("overwrite").parquet(str(tmp_path / "lake" / "silver" / "orders"))
        spark.sql("CREATE DATABASE IF NOT EXISTS jn_gold")
        spark.range(3).write.mode("overwrite").saveAsTable("jn_gold.daily")
        spark.range(3).write.insertInto("jn_gold.daily")
        spark.range(3).write.jdbc(url, "APP.ORDERS", mode="overwrite",
                                  properties={"driver": "org.apache.derby.jdbc.EmbeddedDriver"})
        with pytest.raises(Exception):  # noqa: B017 - fails while running: planned, so named by its node
            spark.range(3).selectExpr("assert_true(id > 5) AS x").write.mode("overwrite").parquet(
                str(tmp_path / "lake" / "gold" / "failed"))
        drain(spark)
        location = spark.sql("DESCRIBE TABLE EXTENDED jn_gold.daily").where("col_name = 'Location'").first()[1]
    finally:
        disable_lineage(spark)
        spark.sql("DROP TABLE IF EXISTS jn_gold.daily")
        spark.sql("DROP DATABASE IF EXISTS jn_gold")
    table_suffix = "_".join(location.rstrip("/").split("/")[-2:])  # <warehouse>/jn_gold.db/daily
    assert table_suffix == "jn_gold.db_daily"
    assert _names(recorder) == [
        "jn.execute_insert_into_hadoop_fs_relation_command.silver_orders",
        "jn.execute_create_data_source_table_as_select_command.jn_gold_daily",   # tableIdentifierToSuffix
        "jn.execute_insert_into_hadoop_fs_relation_command.jn_gold_db_daily",    # trimPath of its location
        "jn.execute_save_into_data_source_command.APP_ORDERS",                   # the dbtable option
        "jn.execute_insert_into_hadoop_fs_relation_command.gold_failed",
    ]
    assert [e["eventType"] for e in recorder.events if e["job"]["name"].endswith("gold_failed")] == ["START", "FAIL"]
    app = [e for e in recorder.events if e["job"]["name"] == "jn"]
    assert app and all(e["job"]["facets"]["jobType"]["processingType"] == "NONE" for e in app)
    assert app[0]["job"]["facets"]["jobType"]["jobType"] == "APPLICATION"
    child = [e for e in recorder.events if e["job"]["name"] != "jn"]
    assert all(e["job"]["facets"]["jobType"]["processingType"] == "BATCH" for e in child)


@pytest.mark.spark
@pytest.mark.parametrize(("conf", "expected"), [
    ({"spark.openlineage.jobName.appendDatasetName": "false"}, "jn.execute_insert_into_hadoop_fs_relation_command"),
    ({"spark.openlineage.jobName.replaceDotWithUnderscore": "true"},
     "jn.execute_insert_into_hadoop_fs_relation_command.silver_orders"),
])
def test_job_name_options(spark, tmp_path, monkeypatch, conf, expected):
    recorder = _capture(spark, monkeypatch, conf)
    try:
        spark.range(3).write.mode("overwrite").parquet(str(tmp_path / "silver" / "orders.v2"))
        drain(spark)
    finally:
        disable_lineage(spark)
    # orders.v2 -> silver_orders_v2: the suffix's dot always becomes _ (the official builder)
    expected = expected + "_v2" if expected.endswith("silver_orders") else expected
    assert _names(recorder) == [expected]


@pytest.mark.spark
def test_application_name_from_the_spark_conf_on_glue(spark, tmp_path, monkeypatch):
    glue = {"spark.glue.GLUE_VERSION": "4.0", "spark.glue.JOB_NAME": "Nightly Orders",
            "spark.glue.JOB_RUN_ID": "jr_0123", "spark.app.name": "nativespark-Nightly Orders-jr_0123"}
    recorder = _capture(spark, monkeypatch, glue, app_name=None)
    try:
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "a" / "b"))
        drain(spark)
    finally:
        disable_lineage(spark)
    assert recorder.events[0]["job"]["name"] == "nightly_orders"
    assert _names(recorder, "nightly_orders") == ["nightly_orders.execute_insert_into_hadoop_fs_relation_command.a_b"]


@pytest.mark.spark
def test_a_bad_job_name_option_fails_clearly(spark, monkeypatch):
    with pytest.raises(ConfigError, match="jobName.appendDatasetName"):
        _capture(spark, monkeypatch, {"spark.openlineage.jobName.appendDatasetName": "nope"})
