"""Whole driver processes: what happens at ``spark.stop()`` and at exit can only be seen from
outside the process (the shared test session is never stopped).

* A job configured only through ``spark.openlineage.*`` conf keys, with a parent run from
  the orchestrator, that dies on an uncaught exception: the application run ends in FAIL.
* The README's main command, ``lineage-relay demo``: broker + relay + the sample PySpark
  pipeline; the collector gets the pipeline's lineage and the graph page is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.support.kafka import read_topic
from tests.support.spec import validator

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[3]
_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from producer.spark import enable_lineage

    bootstrap, topic, out, journal = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[1]").appName("nightly_orders")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.openlineage.transport.type", "kafka")
             .config("spark.openlineage.transport.topicName", topic)
             .config("spark.openlineage.transport.properties.bootstrap.servers", bootstrap)
             .config("spark.openlineage.transport.journalDir", journal)
             .config("spark.openlineage.namespace", "etl")
             .config("spark.openlineage.parentJobNamespace", "airflow")
             .config("spark.openlineage.parentJobName", "nightly.load_orders")
             .config("spark.openlineage.parentRunId", "01890d2e-7b1a-7cc0-8a11-2f4a6c5d3e01")
             .getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")
    assert enable_lineage(spark) is not None
    spark.createDataFrame([(1, "a")], "id INT, v STRING").write.mode("overwrite").parquet(out)
    raise ValueError("the job's own bug")
""")


def _events(kafka, topic: str, expected: int) -> list[dict]:
    records = read_topic(kafka.bootstrap_servers, topic, expected=expected, timeout_s=30)
    return sorted((orjson.loads(r.value) for r in records), key=lambda e: e["eventTime"])


def test_conf_only_job_that_dies_on_an_exception_reports_fail_with_its_parent(kafka, tmp_path):
    topic = kafka.new_topic("driver")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.run([sys.executable, str(script), kafka.bootstrap_servers, topic, str(tmp_path / "out"),
                           str(tmp_path / "journal")], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env=_ENV)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "ValueError: the job's own bug" in proc.stderr, "the job's own error is untouched"

    events = _events(kafka, topic, 4)
    app = [e for e in events if e["job"]["name"] == "nightly_orders"]
    child = [e for e in events if e["job"]["name"] != "nightly_orders"]
    assert [e["eventType"] for e in app] == ["START", "FAIL"]
    assert [e["eventType"] for e in child] == ["START", "COMPLETE"]
    name = child[0]["job"]["name"]
    assert name.startswith("nightly_orders.execute_insert_into_hadoop_fs_relation_command.") \
        and name.endswith("_out"), name
    error = app[1]["run"]["facets"]["errorMessage"]
    assert error["programmingLanguage"] == "PYTHON" and "ValueError: the job's own bug" in error["message"]
    assert "Traceback" in error["stackTrace"]
    parent = app[0]["run"]["facets"]["parent"]
    assert parent["job"] == {"namespace": "airflow", "name": "nightly.load_orders"}
    assert parent["run"]["runId"] == "01890d2e-7b1a-7cc0-8a11-2f4a6c5d3e01"
    # the action's run hangs under the application run, rooted at the orchestrator's run
    child_parent = child[0]["run"]["facets"]["parent"]
    assert child_parent["run"]["runId"] == app[0]["run"]["runId"]
    assert child_parent["root"]["job"] == {"namespace": "airflow", "name": "nightly.load_orders"}
    assert all(e["job"]["namespace"] == "etl" for e in events)
    for e in events:
        validator().validate(e)


def test_the_readme_main_command_runs_the_pipeline_and_draws_its_lineage(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "relay", "demo"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=_ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "ran the sample PySpark pipeline" in out
    assert "demo/lineage_demo.execute_create_data_source_table_as_select_command.gold_daily_revenue" in out
    assert "START -> FAIL" in out, "the deliberately failing action is shown as FAIL"

    received = [json.loads(line) for line in (tmp_path / "demo-output" / "received.jsonl").read_text().splitlines()]
    by_run: dict[str, list[str]] = {}
    for e in received:
        validator().validate(e)
        by_run.setdefault(e["run"]["runId"], []).append(e["eventType"])
    assert len(by_run) == 7, "the application run and six actions"
    assert sorted(map(tuple, by_run.values())) == sorted(
        [("START", "COMPLETE")] * 6 + [("START", "FAIL")])
    app = [e for e in received if e["job"]["name"] == "lineage_demo"]
    assert [e["eventType"] for e in app] == ["START", "COMPLETE"], "spark.stop() ends the application run"

    page = (tmp_path / "demo-output" / "lineage.html").read_text()
    assert "gold.daily_revenue" in page and "total_revenue" in page
    ask = subprocess.run([sys.executable, "-m", "relay", "graph", "--upstream", "gold.daily_revenue.total_revenue"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=_ENV)
    assert ask.returncode == 0, ask.stderr
    assert "silver/orders.amount" in ask.stdout and "DIRECT/AGGREGATION" in ask.stdout
    assert "raw/orders.csv.amount_eur" in ask.stdout, "traced back to the landing files"
