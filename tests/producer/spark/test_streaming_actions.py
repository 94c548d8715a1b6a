"""Batch actions and streaming queries side by side: a micro-batch is its streaming run's,
never a batch run of its own, while what a ``foreachBatch`` function does is reported."""

from __future__ import annotations

import pytest

from tests.producer.spark.support import json_files, streaming_capture
from tests.support.relay import eventually
from tests.support.spec import validator

SCHEMA = "id BIGINT, v STRING"


@pytest.fixture
def read_only(spark):
    with streaming_capture(spark, read_only_actions=True) as got:
        yield got


def _landing(directory, files=3):
    return json_files(directory, files)


def _names(datasets):
    return [(d["namespace"], d["name"]) for d in datasets]


@pytest.mark.spark
def test_micro_batches_of_a_v2_sink_are_no_batch_runs_with_read_only_actions(spark, tmp_path, read_only, py4j_calls):
    """A V2 sink (memory, console, kafka, foreach) runs each micro-batch as ``nextBatch.collect()``,
    which reaches the QueryExecutionListener: with read-only actions on, one py4j call tells it
    from the job's own reads (it is an IncrementalExecution), before anything else is read."""
    recorder, lineage = read_only
    source = _landing(tmp_path / "landing")
    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
             .writeStream.format("memory").queryName("mem_ro").trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 3
    assert eventually(lambda: any(e["eventType"] == "COMPLETE" for e in recorder.runs().get(str(query.runId), [])), 60)
    lineage.drain()
    spark.sql("SELECT count(*) FROM mem_ro").collect()   # the job's own read of the sink: reported
    lineage.drain()

    batch = [e for e in recorder.events if e["run"]["runId"] not in (str(query.runId), lineage.app_run_id)]
    # The memory sink's view (created by start()) and the job's read: no run per micro-batch.
    assert {e["job"]["name"] for e in batch} == {"st.execute_create_view_command", "st.adaptive_spark_plan"}, \
        [(e["eventType"], e["job"]["name"], _names(e["inputs"])) for e in batch]
    assert not [e for e in batch if any("landing" in d["name"] for d in e["inputs"])]
    run = recorder.runs()[str(query.runId)]
    assert [e["eventType"] for e in run] == ["START", "RUNNING", "COMPLETE"]
    for event in recorder.events:
        validator().validate(event)
    assert _names(run[-1]["inputs"]) == [("file", str(source))]
    # The micro-batches cost one py4j call each on the listener bus (was a snapshot, ~50 each).
    assert 3 <= len([c for c in py4j_calls if "isInstance" in c]) <= 3 + 2   # + the job's view and read


@pytest.mark.spark
def test_the_writes_of_a_foreach_batch_function_are_still_reported_with_read_only_actions(spark, tmp_path, read_only):
    """What a ``foreachBatch`` function runs is an ordinary batch execution on the query's
    thread (not an IncrementalExecution): its writes stay reported."""
    recorder, lineage = read_only
    source, sink = _landing(tmp_path / "landing"), str(tmp_path / "lake" / "fb")

    def load(df, batch_id):
        df.write.mode("append").parquet(sink)

    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
             .writeStream.foreachBatch(load).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert eventually(lambda: any(e["eventType"] == "COMPLETE" for e in recorder.runs().get(str(query.runId), [])), 60)
    lineage.drain()
    writes = [e for e in recorder.events if e["eventType"] == "COMPLETE" and _names(e["outputs"]) == [("file", sink)]
              and e["run"]["runId"] != str(query.runId)]
    assert len(writes) == 3, [(e["eventType"], e["job"]["name"]) for e in recorder.events]
    for event in recorder.events:
        validator().validate(event)
    assert not [e for e in recorder.events if "write_to_data_source_v2" in e["job"]["name"]]


@pytest.fixture
def captured(spark):
    with streaming_capture(spark) as got:
        yield got


@pytest.mark.spark
def test_a_foreach_batch_write_is_a_child_of_its_streaming_run_which_names_what_it_wrote(spark, tmp_path, captured):
    """The write a ``foreachBatch`` function makes (in the query's own session) is the streaming
    run's child, with the run's inputs (its micro-batch is an RDD to it); what it wrote is an
    output of the streaming run from its next event on. A write in another session is not."""
    recorder, lineage = captured
    source = tmp_path / "landing"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1, "v": "x"}\n')
    sink, other = str(tmp_path / "lake" / "fb"), str(tmp_path / "lake" / "other")

    def load(df, batch_id):
        df.write.mode("append").parquet(sink)

    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.foreachBatch(load)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        lineage.drain()
        (source / "b.json").write_text('{"id": 2, "v": "y"}\n')
        query.processAllAvailable()
        lineage.drain()
        spark.range(1).write.mode("overwrite").parquet(other)   # the application's, while the query runs
    finally:
        query.stop()
    lineage.drain()
    run_id = str(query.runId)
    stream = recorder.runs()[run_id]
    assert [e["eventType"] for e in stream] == ["START", "RUNNING", "COMPLETE"]
    job = stream[0]["job"]["name"]
    assert job == "st.streaming.foreach_batch_sink"
    writes = [e for e in recorder.events if _names(e["outputs"]) == [("file", sink)] and e["run"]["runId"] != run_id]
    assert [e["eventType"] for e in writes] == ["START", "COMPLETE"] * 2
    for event in writes:
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == run_id and parent["job"] == {"namespace": "st", "name": job}
        assert parent["root"]["run"]["runId"] == lineage.app_run_id
    # The second batch's write comes once the run's inputs are known (read at its first progress).
    assert _names(writes[-1]["inputs"]) == [("file", str(source))]
    assert "inputFacets" not in writes[-1]["inputs"][0]
    assert _names(stream[-1]["outputs"]) == [("file", sink)]
    assert stream[-1]["outputs"][0]["facets"]["schema"]["fields"] == [{"name": "id", "type": "long"},
                                                                     {"name": "v", "type": "string"}]
    app_write = [e for e in recorder.events if _names(e["outputs"]) == [("file", other)]]
    assert app_write and all(e["run"]["facets"]["parent"]["run"]["runId"] == lineage.app_run_id for e in app_write)
    for event in recorder.events:
        validator().validate(event)


@pytest.mark.spark
def test_a_foreach_batch_write_that_cannot_be_read_is_still_a_child_of_its_streaming_run(
        spark, tmp_path, captured, monkeypatch):
    """A write that cannot be read becomes a run with an ``extractionError``; one a foreachBatch
    function made has its streaming run as parent, as when it can be read."""
    from producer.spark import jvm

    recorder, lineage = captured
    source = tmp_path / "landing"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1, "v": "x"}\n')
    sink = str(tmp_path / "lake" / "fb")

    def unreadable(*_args, **_kwargs):
        raise RuntimeError("cannot read this action")

    def load(df, batch_id):
        df.write.mode("append").parquet(sink)

    monkeypatch.setattr(jvm, "snapshot", unreadable)
    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.foreachBatch(load)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        lineage.drain()
    finally:
        query.stop()
    lineage.drain()
    unread = [e for e in recorder.events if "extractionError" in e["run"]["facets"]
              and e["run"]["runId"] != str(query.runId)]
    assert [e["eventType"] for e in unread] == ["START", "COMPLETE"], [e["job"]["name"] for e in recorder.events]
    for event in unread:
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == str(query.runId)
        assert parent["job"] == {"namespace": "st", "name": "st.streaming.foreach_batch_sink"}
        assert parent["root"]["run"]["runId"] == lineage.app_run_id
