"""What a long-lived session sees: one application run however often capture is switched off
and on, a statement that fails analysis costing no log line beyond the job's own, and an
external table's write statistics. Real PySpark (the shared session, or a driver process of
its own where the session must stop)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from producer.spark import disable_lineage, enable_lineage
from tests.producer.spark.support import Recorder, drain

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[3]

TOGGLING_JOB = textwrap.dedent("""
    import atexit, json
    from pyspark.sql import SparkSession
    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder

    recorder = Recorder()
    atexit.register(lambda: print("EVENTS " + json.dumps(
        [[e["eventType"], e["job"]["name"], e["run"]["runId"],
          e["run"]["facets"].get("parent", {}).get("run", {}).get("runId")] for e in recorder.events]), flush=True))
    spark = (SparkSession.builder.master("local[1]").appName("toggle_job").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")
    enable_lineage(spark, producer=recorder)
    for i in range(4):
        spark.range(3).write.mode("overwrite").parquet(f"out{i}")
        disable_lineage(spark)
        spark.range(3).write.mode("overwrite").parquet(f"off{i}")   # not captured
        enable_lineage(spark, producer=recorder)
    spark.range(3).write.mode("overwrite").parquet("last")
    {ending}
""")


@pytest.mark.parametrize("ending", ["spark.stop()", "disable_lineage(spark); spark.stop()",
                                    "disable_lineage(spark)  # and exit"])
def test_switching_capture_off_and_on_keeps_one_application_run_that_ends_once(tmp_path, ending):
    script = tmp_path / "job.py"
    script.write_text(TOGGLING_JOB.replace("{ending}", ending))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("EVENTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    events = json.loads(lines[-1][len("EVENTS "):])
    app = [(kind, run) for kind, job, run, _ in events if job == "toggle_job"]
    assert [kind for kind, _ in app] == ["START", "COMPLETE"], app
    assert app[0][1] == app[1][1]
    children = [(kind, parent) for kind, job, _, parent in events if job != "toggle_job"]
    assert len(children) == 2 * 5, "each captured write is START + COMPLETE; the writes with capture off none"
    assert {parent for _, parent in children} == {app[0][1]}
    assert events[-1][:2] == ["COMPLETE", "toggle_job"], "the application ends after its children"


def test_enabling_again_continues_the_application_run_in_the_shared_session(spark, tmp_path):
    first, second = Recorder(), Recorder()
    lineage = enable_lineage(spark, producer=first, namespace="ar", app_name="ar")
    try:
        disable_lineage(spark)
        again = enable_lineage(spark, producer=second, namespace="ar", app_name="ar")
        assert again is lineage
        spark.range(2).write.mode("overwrite").parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
    assert [e["eventType"] for e in first.events] == ["START"]
    assert [e["job"]["name"] for e in second.events if e["job"]["name"] == "ar"] == [], "no second START"
    parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in second.events}
    assert parents == {first.events[0]["run"]["runId"]}


class _BlockingListener:
    """A QueryExecutionListener (py4j) whose first callback holds Spark's listener bus until
    ``release`` is set (30 s at most): a slow listener of the job's own, a loaded driver."""

    class Java:
        implements = ["org.apache.spark.sql.util.QueryExecutionListener"]

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()

    def onSuccess(self, *_args) -> None:  # noqa: N802 - the Java interface's name
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(30)

    def onFailure(self, *_args) -> None:  # noqa: N802
        self.onSuccess()


def test_actions_run_while_capture_was_off_are_not_reported_once_it_is_on_again(spark, tmp_path):
    """The listener bus delivers an event to the listeners registered when it gets to it: a
    write made with capture off, still queued behind a slow listener when capture came back
    on, used to be reported (CI saw 12 events where 10 were due)."""
    from pyspark.java_gateway import ensure_callback_server_started

    from producer.spark.execution_listener import java_proxy, register_listener, unregister_listener

    recorder = Recorder()
    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    manager = spark._jsparkSession.listenerManager()
    blocker = _BlockingListener()
    holder = java_proxy(gateway, blocker)
    register_listener(manager, holder)
    try:
        enable_lineage(spark, producer=recorder, namespace="ar", app_name="ar")
        disable_lineage(spark)
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "held"))   # its callback holds the bus
        assert blocker.holding.wait(60), "the blocking listener was never called"
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "while_off"))
        # The bus is let go a moment after capture starts coming back on (a slow listener's end).
        threading.Timer(1.0, blocker.release.set).start()
        enable_lineage(spark, producer=recorder, namespace="ar", app_name="ar")
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "on_again"))
        drain(spark)
    finally:
        blocker.release.set()
        disable_lineage(spark)
        unregister_listener(manager, holder)
    outputs = {o["name"] for e in recorder.events for o in e.get("outputs", [])}
    assert str(tmp_path / "on_again") in outputs, outputs
    assert not {str(tmp_path / "held"), str(tmp_path / "while_off")} & outputs, "a write made with capture off"


def test_disabling_removes_the_listener_when_the_job_registered_a_py4j_listener_first(spark, caplog):
    """Spark's listener list compares the listener it removes with each registered one, and
    py4j asks the Python side for ``equals``: ours had none, so with a job's own py4j
    listener registered first, every disable_lineage left ours registered (one more per
    enable/disable cycle, each still called on every action) and logged py4j errors."""
    from pyspark.java_gateway import ensure_callback_server_started

    from producer.spark.execution_listener import java_proxy, register_listener, unregister_listener

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    manager = spark._jsparkSession.listenerManager()
    before = len(manager.listListeners())
    theirs = _BlockingListener()
    theirs.holding.set()   # never blocks
    holder = java_proxy(gateway, theirs)
    register_listener(manager, holder)
    try:
        for _ in range(3):
            enable_lineage(spark, producer=Recorder(), namespace="ar", app_name="ar")
            assert len(manager.listListeners()) == before + 2
            disable_lineage(spark)
            assert len(manager.listListeners()) == before + 1, "ours is still registered"
    finally:
        unregister_listener(manager, holder)
    assert len(manager.listListeners()) == before
    assert not [r for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.ERROR]


def test_an_action_whose_callback_finishes_after_the_application_ended_is_not_emitted_after_it(
        spark, tmp_path, monkeypatch):
    """The application's end drains the listener bus (up to a timeout), then emits its COMPLETE:
    a callback still reading its action then (a slow driver, a bus not drained in time) used to
    emit the action's run after the application's COMPLETE. It is dropped, and counted."""
    from producer.spark import capture
    from producer.spark.listener import SparkLineage
    from tests.support.relay import eventually

    recorder = Recorder()
    lineage = enable_lineage(spark, producer=recorder, namespace="ar", app_name="ar_late")
    late = str(tmp_path / "late")
    in_callback = threading.Event()
    analyse = capture.analyse

    def app_completed():
        return any(e["job"]["name"] == "ar_late" and e["eventType"] == "COMPLETE" for e in recorder.events)

    def slow_analyse(snap, settings):
        output = snap.output
        if output is not None and any(str(p).endswith("/late") for p in [output.location, *output.paths]):
            in_callback.set()
            assert eventually(app_completed, 30)   # the application ends meanwhile
        return analyse(snap, settings)

    monkeypatch.setattr(capture, "analyse", slow_analyse)
    monkeypatch.setattr(lineage, "drain", lambda timeout_ms=0: SparkLineage.drain(lineage, 200))
    spark.range(1).write.mode("overwrite").parquet(late)
    assert in_callback.wait(60), "the write's callback never came"
    lineage.end()
    drain(spark)   # the late callback has returned
    assert [(e["eventType"], e["job"]["name"]) for e in recorder.events][-1] == ("COMPLETE", "ar_late")
    assert not [e for e in recorder.events if any(o["name"] == late for o in e["outputs"])]
    assert lineage.late_actions == 1


def test_another_application_name_ends_the_paused_run_and_starts_a_new_one(spark):
    first, second = Recorder(), Recorder()
    enable_lineage(spark, producer=first, namespace="ar", app_name="ar_one")
    disable_lineage(spark)
    try:
        enable_lineage(spark, producer=second, namespace="ar", app_name="ar_two")
    finally:
        disable_lineage(spark)
    assert [(e["eventType"], e["job"]["name"]) for e in first.events] == [("START", "ar_one"),
                                                                         ("COMPLETE", "ar_one")]
    assert [(e["eventType"], e["job"]["name"]) for e in second.events] == [("START", "ar_two")]


def test_a_statement_that_fails_analysis_logs_only_the_jobs_own_error(spark, caplog):
    """PySpark logs each AnalysisException it converts at ERROR (SQLQueryContextLogger, which
    does not propagate: its handler writes to stderr); capture must not make a second one."""
    pyspark_errors = []

    class Collect(logging.Handler):
        def emit(self, record):
            pyspark_errors.append(record)
    handler = Collect(logging.ERROR)
    from pyspark.logger import PySparkLogger

    context_logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    context_logger.addHandler(handler)
    recorder = Recorder()
    try:
        with caplog.at_level(logging.DEBUG, logger="producer.spark"):
            for capture_on in (False, True):
                if capture_on:
                    enable_lineage(spark, producer=recorder, namespace="ar", app_name="ar")
                with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
                    spark.sql("INSERT INTO no_such_table SELECT 1")
                drain(spark)
    finally:
        disable_lineage(spark)
        context_logger.removeHandler(handler)
    assert len(pyspark_errors) == 2, "one per failing statement, the job's own: " + repr(
        [r.getMessage()[:80] for r in pyspark_errors])
    ours = [r for r in caplog.records if r.name.startswith("producer") and r.levelno >= logging.INFO]
    assert ours == [], [r.getMessage()[:200] for r in ours]
    assert [e for e in recorder.events if e["job"]["name"] != "ar"] == []


def test_an_external_table_written_by_save_as_table_has_its_output_statistics(spark, tmp_path):
    """The table's own run reports the rows its inner file write wrote, wherever the table
    lives: Hadoop spells the written path ``file:/a b``, the catalog ``file:///a%20b``."""
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="ar", app_name="ar")
    try:
        df = spark.range(5)
        df.write.mode("overwrite").saveAsTable("ar_managed")
        df.write.mode("overwrite").option("path", str(tmp_path / "ext")).saveAsTable("ar_external")
        df.write.mode("overwrite").option("path", str(tmp_path / "ext space")).saveAsTable("ar_external_space")
        drain(spark)
    finally:
        disable_lineage(spark)
        for table in ("ar_managed", "ar_external", "ar_external_space"):
            spark.sql(f"DROP TABLE IF EXISTS {table}")
    completes = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["job"]["name"] != "ar"]
    assert len(completes) == 3
    for event in completes:
        (output,) = event["outputs"]
        assert output.get("outputFacets", {}).get("outputStatistics", {}).get("rowCount") == 5, output["name"]
    # Named as a file write to the same place is (Hadoop's spelling), not the catalog's
    # percent-encoded URI: the table and a job reading its files meet on one dataset.
    named = {e["outputs"][0]["name"] for e in completes}
    assert str(tmp_path / "ext space") in named and str(tmp_path / "ext") in named, named
