"""Capture must never change or break the job: injected failures inside capture leave the
job's result as it was and show up as an ``extractionError`` run facet."""

from __future__ import annotations

import logging

import pytest

from producer.spark import capture, columns, disable_lineage, enable_lineage, java_objects, jvm, plan_reads
from tests.producer.spark.support import Recorder, drain
from tests.support.relay import eventually
from tests.support.spec import validator

pytestmark = pytest.mark.spark

ROWS = [(1, "a", 10.0), (2, "b", 20.0), (3, "a", 5.5)]


def _write(spark, path: str) -> list[tuple]:
    """A small action that writes (aggregate + rename), then the job's own view of the result."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(ROWS, "id INT, key STRING, amount DOUBLE")
    df.groupBy("key").agg(F.sum("amount").alias("total")).write.mode("overwrite").parquet(path)
    return sorted(tuple(r) for r in spark.read.parquet(path).collect())


@pytest.fixture
def captured(spark):
    """Capture on for one test, off again afterwards (the session is shared)."""
    recorder = Recorder()
    lineage = enable_lineage(spark, producer=recorder, namespace="safety", app_name="safety")
    try:
        yield recorder, lineage
    finally:
        drain(spark)
        disable_lineage(spark)


def _terminal_runs(recorder: Recorder) -> list[dict]:
    return [e for e in recorder.events if e["eventType"] in ("COMPLETE", "FAIL") and e["job"]["name"] != "safety"]


def test_a_failing_column_lineage_analysis_leaves_the_result_and_reports_an_extraction_error(
        spark, tmp_path, monkeypatch, captured):
    baseline = _write(spark, str(tmp_path / "baseline"))  # capture on, nothing injected
    drain(spark)

    def broken_trace(*_args, **_kwargs):
        raise RuntimeError("injected column lineage failure")
    monkeypatch.setattr(columns, "trace", broken_trace)
    result = _write(spark, str(tmp_path / "injected"))
    drain(spark)

    recorder, lineage = captured
    assert result == baseline == [("a", 15.5), ("b", 20.0)]
    ok, broken = _terminal_runs(recorder)
    assert "extractionError" not in ok["run"]["facets"]
    assert "columnLineage" in ok["outputs"][0]["facets"]
    error = broken["run"]["facets"]["extractionError"]
    assert error["failedTasks"] == 1
    assert "injected column lineage failure" in error["errors"][0]["errorMessage"]
    # the rest of the lineage is still there
    assert broken["eventType"] == "COMPLETE"
    assert broken["outputs"][0]["name"].endswith("/injected")
    assert [f["name"] for f in broken["outputs"][0]["facets"]["schema"]["fields"]] == ["key", "total"]
    assert "columnLineage" not in broken["outputs"][0]["facets"]
    for event in recorder.events:
        validator().validate(event)


def test_an_unreadable_action_is_still_a_run_with_the_error_and_a_log_line(
        spark, tmp_path, monkeypatch, captured, caplog):
    def broken_snapshot(*_args, **_kwargs):
        raise RuntimeError("injected plan read failure")
    monkeypatch.setattr(jvm, "snapshot", broken_snapshot)
    with caplog.at_level(logging.WARNING, logger="producer.spark"):
        result = _write(spark, str(tmp_path / "out"))
        drain(spark)

    recorder, lineage = captured
    assert result == [("a", 15.5), ("b", 20.0)]
    assert lineage.capture_errors >= 1
    assert any("injected plan read failure" in r.getMessage() for r in caplog.records)
    runs = _terminal_runs(recorder)
    assert len(runs) == 1, "one run for the write; the read-back collect() writes nothing"
    error = runs[0]["run"]["facets"]["extractionError"]
    assert "injected plan read failure" in error["errors"][0]["errorMessage"]
    assert runs[0]["run"]["facets"]["parent"]["job"]["name"] == "safety"
    for event in recorder.events:
        validator().validate(event)


def test_an_analysis_crash_is_reported_not_raised(spark, tmp_path, monkeypatch, captured):
    def broken_analyse(*_args, **_kwargs):
        raise MemoryError("injected analysis crash")
    monkeypatch.setattr(capture, "analyse", broken_analyse)
    assert _write(spark, str(tmp_path / "out")) == [("a", 15.5), ("b", 20.0)]
    drain(spark)
    recorder, lineage = captured
    runs = _terminal_runs(recorder)
    assert len(runs) == 1
    assert "injected analysis crash" in runs[0]["run"]["facets"]["extractionError"]["errors"][0]["errorMessage"]


def _source(spark, tmp_path) -> str:
    source = str(tmp_path / "source")
    spark.createDataFrame(ROWS, "id INT, key STRING, amount DOUBLE").write.mode("overwrite").parquet(source)
    drain(spark)
    return source


def _isin_write(spark, tmp_path, source: str, values: int) -> None:
    """``source`` read, filtered by ``isin`` over ``values`` literals, written to files."""
    from pyspark.sql import functions as F

    out = str(tmp_path / "out")
    spark.read.parquet(source).where(F.col("id").isin(list(range(values)))).write.mode("overwrite").parquet(out)
    drain(spark)


def test_a_plan_estimated_above_the_limit_is_never_serialised_and_keeps_its_datasets(
        spark, tmp_path, monkeypatch, captured):
    """The plan's size is estimated in the JVM before its JSON is built: an ``isin`` over
    2,000 values (its JSON half a megabyte, built in quadratic time) above a small
    maxPlanBytes is skipped without the JSON ever being built, and the write still has its
    input and output (only column lineage and schemas are skipped, as documented)."""
    recorder, lineage = captured
    source = _source(spark, tmp_path)
    lineage.max_plan_bytes = 50_000
    built = []

    def no_json_tools(gateway):
        built.append(gateway)
        raise AssertionError("the JSON of a plan estimated above the limit must not be built")
    monkeypatch.setattr(plan_reads, "_json_tools", no_json_tools)
    _isin_write(spark, tmp_path, source, 2000)

    assert built == []
    (run,) = [r for r in _terminal_runs(recorder) if r["outputs"] and r["outputs"][0]["name"].endswith("/out")]
    assert run["eventType"] == "COMPLETE"
    assert [i["name"] for i in run["inputs"]] == [source.rstrip("/")]
    assert run["outputs"][0]["name"].endswith("/out")
    assert "columnLineage" not in run["outputs"][0]["facets"]
    message = run["run"]["facets"]["extractionError"]["errors"][0]["errorMessage"]
    assert "above the analysis limit" in message and "column lineage and schemas skipped" in message
    for event in recorder.events:
        validator().validate(event)


def test_a_plan_whose_json_fails_keeps_its_datasets_and_reports_the_error(spark, tmp_path, monkeypatch, captured):
    """Spark's JSON writer failing (an OutOfMemoryError in the driver, say) costs column
    lineage only: the write is still reported with its input and output, the error named."""
    def out_of_memory(*_args, **_kwargs):
        raise RuntimeError("injected java.lang.OutOfMemoryError: Java heap space")
    source = _source(spark, tmp_path)
    monkeypatch.setattr(plan_reads, "plan_json", out_of_memory)
    _isin_write(spark, tmp_path, source, 3)

    recorder, lineage = captured
    (run,) = [r for r in _terminal_runs(recorder) if r["outputs"] and r["outputs"][0]["name"].endswith("/out")]
    assert run["eventType"] == "COMPLETE"
    assert [i["name"] for i in run["inputs"]] == [source.rstrip("/")]
    assert run["outputs"][0]["name"].endswith("/out")
    message = run["run"]["facets"]["extractionError"]["errors"][0]["errorMessage"]
    assert "plan JSON could not be built" in message and "OutOfMemoryError" in message
    for event in recorder.events:
        validator().validate(event)


def test_a_sender_that_raises_never_reaches_the_job(spark, tmp_path):
    class Exploding:
        config = None
        calls = 0

        def emit(self, event: dict) -> None:
            Exploding.calls += 1
            if event["job"]["name"] != "boom":  # let the application START through
                raise ConnectionError("injected sender failure")

    enable_lineage(spark, producer=Exploding(), namespace="safety", app_name="boom")
    try:
        assert _write(spark, str(tmp_path / "out")) == [("a", 15.5), ("b", 20.0)]
        drain(spark)
        assert Exploding.calls >= 2, "the action's START was attempted"
    finally:
        disable_lineage(spark)


def test_one_setting_disables_capture(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    recorder = Recorder()
    assert enable_lineage(spark, producer=recorder) is None
    _write(spark, str(tmp_path / "out"))
    drain(spark)
    assert recorder.events == []


def test_disable_stops_capture_and_enable_disable_cycles_do_not_pile_up_listeners(spark, tmp_path):
    """A job (or a notebook) may switch capture off and on again: once off, nothing more is
    captured, and each new capture sees each action once (a listener left registered
    would keep analysing every action, slowing the job more with each cycle)."""
    recorders = []
    for cycle in range(3):
        recorder = Recorder()
        recorders.append(recorder)
        enable_lineage(spark, producer=recorder, namespace="safety", app_name=f"cycle{cycle}")
        try:
            _write(spark, str(tmp_path / f"out{cycle}"))
            drain(spark)
        finally:
            disable_lineage(spark)
    seen = [len(r.events) for r in recorders]
    _write(spark, str(tmp_path / "after"))  # capture off
    drain(spark)
    assert [len(r.events) for r in recorders] == seen, "a disabled capture still received events"
    for cycle, recorder in enumerate(recorders):
        # an application run of another name ends when the next one starts: not an action's run
        actions = [e for e in _terminal_runs(recorder) if e["job"]["name"] != f"cycle{cycle}"]
        assert len(actions) == 1, [e["eventType"] for e in recorder.events]


def test_capture_releases_its_java_objects_together_and_leaves_none_behind(spark, tmp_path, monkeypatch):
    """py4j deletes each Java object Python drops with one round trip of its own; capture
    makes dozens per action, so it releases them in one call instead. Nothing may stay in
    py4j's table on the JVM's side (a leak that grows with every action), and the job's own
    objects are released by py4j as before."""
    import gc

    gateway = spark.sparkContext._gateway
    bindings = gateway.java_gateway_server.getGateway().getBindings()
    client_class = type(gateway._gateway_client)
    deletes: list[tuple[str, str]] = []
    real = client_class.garbage_collect_object

    def counting(self, target_id, *args, **kwargs):
        import threading

        deletes.append((threading.current_thread().name, target_id))
        return real(self, target_id, *args, **kwargs)

    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="safety", app_name="release")
    try:
        _write(spark, str(tmp_path / "warm"))
        drain(spark)
        gc.collect()
        before = bindings.size()
        monkeypatch.setattr(client_class, "garbage_collect_object", counting)
        for i in range(5):
            _write(spark, str(tmp_path / f"out{i}"))
            drain(spark)
            gc.collect()
        # py4j sends the job's deletes from a background thread: wait for them to land.

        def settled() -> bool:
            gc.collect()
            return bindings.size() - before <= 4

        eventually(settled, 20)
        after = bindings.size()
    finally:
        disable_lineage(spark)
    assert len(_terminal_runs(recorder)) == 6  # capture ran (warm-up + 5)
    # The table holds what it held, give or take the last release's own two objects.
    assert after - before <= 4, (before, after)
    # Of the deletes py4j sent meanwhile, none was for an object capture made: those went
    # in one call per action. (The job's own objects are still deleted one by one.)
    captured_ids = set(java_objects._BINDINGS[id(gateway)][1].leftover)
    assert not captured_ids & {target for _, target in deletes}
