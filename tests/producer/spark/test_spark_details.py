"""The official integration's Spark facets on real PySpark: ``spark_applicationDetails`` on the
application's START and each action's, ``spark_jobDetails`` naming the Spark job an action ran
(with the description and group the job set), and the ``sql`` job facet of a ``spark.sql``
statement; what reading them costs in py4j calls."""

from __future__ import annotations

import functools

import pytest

from producer.spark import details, disable_lineage, enable_lineage, plain_reads
from tests.producer.spark.support import Recorder, drain
from tests.support.spec import validator

pytestmark = pytest.mark.spark

APP = "details_app"


@pytest.fixture
def cleared_job_properties(spark):
    """The job group and description are the test thread's; the shared session keeps none after."""
    yield spark.sparkContext
    for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
        spark.sparkContext.setLocalProperty(key, None)


def _children(recorder: Recorder, kind: str) -> list[dict]:
    return [e for e in recorder.events if e["job"]["name"] != APP and e["eventType"] == kind]


def test_the_application_details_are_sparks_on_every_start(spark, tmp_path):
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        spark.range(3).write.mode("overwrite").parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
    sc = spark.sparkContext
    starts = [e for e in recorder.events if e["eventType"] == "START"]
    assert [e["job"]["name"] == APP for e in starts] == [True, False], "the application's START, the action's"
    for start in starts:
        facet = start["run"]["facets"]["spark_applicationDetails"]
        assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
            "master": sc.master, "appName": sc.appName, "applicationId": sc.applicationId,
            "deployMode": "client", "driverHost": sc.getConf().get("spark.driver.host"),
            "userName": sc.sparkUser()}, "no uiWebUrl: the test session runs without the UI"
    assert all("spark_applicationDetails" not in e["run"]["facets"] for e in _children(recorder, "COMPLETE"))
    checker = validator()
    for event in recorder.events:
        checker.validate(event)


def test_an_actions_run_names_its_spark_job_with_the_group_and_description_the_job_set(
        spark, tmp_path, cleared_job_properties):
    sc = cleared_job_properties
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        sc.setJobGroup("nightly-etl", "orders rollup")
        spark.range(10).selectExpr("id % 3 AS k", "id").groupBy("k").count() \
            .write.mode("overwrite").parquet(str(tmp_path / "grouped"))
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setJobDescription("second write")
        spark.range(3).write.mode("overwrite").parquet(str(tmp_path / "plain"))
        drain(spark)
    finally:
        disable_lineage(spark)
    first, second = (e["run"]["facets"]["spark_jobDetails"] for e in _children(recorder, "COMPLETE"))
    assert first["jobId"] == min(sc.statusTracker().getJobIdsForGroup("nightly-etl"))
    assert (first["jobDescription"], first["jobGroup"]) == ("orders rollup", "nightly-etl")
    assert second["jobDescription"] == "second write" and "jobGroup" not in second
    assert second["jobId"] > max(sc.statusTracker().getJobIdsForGroup("nightly-etl"))
    starts = [e["run"]["facets"]["spark_jobDetails"] for e in _children(recorder, "START")]
    assert starts == [first, second], "START and COMPLETE name the same job"


def test_an_action_running_more_jobs_than_the_newest_read_still_names_its_first(
        spark, tmp_path, cleared_job_properties):
    # A union of 20 aggregations written once: a shuffle job per aggregation, then the write's
    # (21 jobs), more than the newest jobs read at once (details.NEWEST_JOBS).
    sc = cleared_job_properties
    parts = [spark.range(40).selectExpr(f"id % {i + 2} AS k").groupBy("k").count() for i in range(20)]
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        sc.setJobGroup("many-jobs", "one write, many jobs")
        functools.reduce(lambda a, b: a.union(b), parts).write.mode("overwrite").parquet(str(tmp_path / "many"))
        drain(spark)
    finally:
        disable_lineage(spark)
    jobs = sc.statusTracker().getJobIdsForGroup("many-jobs")
    assert len(jobs) > details.NEWEST_JOBS
    (facet,) = (e["run"]["facets"]["spark_jobDetails"] for e in _children(recorder, "COMPLETE"))
    assert (facet["jobId"], facet["jobDescription"], facet["jobGroup"]) == (
        min(jobs), "one write, many jobs", "many-jobs")


def test_a_spark_sql_statement_is_the_runs_sql_job_facet_and_a_dataframe_write_has_none(spark, tmp_path):
    spark.sql(f"CREATE TABLE details_t (id BIGINT) USING parquet LOCATION '{tmp_path / 'details_t'}'")
    statement = "INSERT INTO details_t SELECT id * 2 FROM range(4)"
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        spark.sql(statement)
        spark.range(2).write.mode("overwrite").parquet(str(tmp_path / "df"))
        drain(spark)
    finally:
        disable_lineage(spark)
        spark.sql("DROP TABLE details_t")
    by_name = {e["job"]["name"]: e["job"]["facets"] for e in _children(recorder, "COMPLETE")}
    sql_runs = [facets["sql"]["query"] for facets in by_name.values() if "sql" in facets]
    assert sql_runs == [statement], by_name.keys()
    assert all("sql" in e["job"]["facets"] for e in recorder.events
               if e["job"]["name"].endswith("details_t")), "on START too"


def test_credentials_in_a_statement_are_masked_in_its_sql_job_facet(spark, tmp_path):
    statement = (f"CREATE TABLE details_secret USING parquet LOCATION '{tmp_path / 'details_secret'}' "
                 "TBLPROPERTIES ('fs.s3a.secret.key'='S3cretValue', 'team'='data') AS SELECT 1 AS id")
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        spark.sql(statement)
        drain(spark)
    finally:
        disable_lineage(spark)
        spark.sql("DROP TABLE IF EXISTS details_secret")
    queries = [e["job"]["facets"]["sql"]["query"] for e in _children(recorder, "COMPLETE")
               if "sql" in e["job"]["facets"]]
    assert queries == [statement.replace("S3cretValue", "***")]
    assert not any("S3cretValue" in repr(e) for e in recorder.events)


def test_the_details_of_an_action_cost_one_py4j_call(spark, tmp_path, py4j_calls, monkeypatch):
    costs: dict[str, list[int]] = {"job": [], "sql": []}

    def counted(name, original):
        def wrapper(*args, **kwargs):
            before = len(py4j_calls)
            try:
                return original(*args, **kwargs)
            finally:
                costs[name].append(len(py4j_calls) - before)
        return wrapper
    monkeypatch.setattr(details.JobReader, "read", counted("job", details.JobReader.read))
    monkeypatch.setattr(plain_reads, "sql_text", counted("sql", plain_reads.sql_text))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        for i in range(3):
            spark.range(3).write.mode("overwrite").parquet(str(tmp_path / f"out{i}"))
        drain(spark)
    finally:
        disable_lineage(spark)
    assert all("spark_jobDetails" in e["run"]["facets"] for e in _children(recorder, "COMPLETE"))
    # The first read makes the JSON mapper and the store's views (kept); then one call each
    # (the queryId and the SQL text come with the action's other facts, producer.spark.batched_reads).
    assert costs["job"][1:] == [1, 1] and costs["sql"] == [], costs
