"""Structured Streaming queries are runs of their own: START when a query starts, RUNNING once
its datasets are known, COMPLETE or FAIL when it stops, children of the application run,
with the datasets named as the batch capture names them."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from producer.spark import disable_lineage, enable_lineage
from producer.spark.streaming_names import datasets, job_name
from tests.producer.spark.support import Recorder, json_files, streaming_capture
from tests.support.relay import eventually
from tests.support.spec import validator

SCHEMA = "id BIGINT, v STRING"


@pytest.fixture
def captured(spark):
    with streaming_capture(spark) as got:
        yield got


def _json_files(directory, count=2):
    return json_files(directory, count)


def _run_events(recorder: Recorder, run_id: str, last: str) -> list[dict]:
    assert eventually(lambda: any(e["eventType"] == last for e in recorder.runs().get(run_id, [])), 60), \
        [(e["eventType"], e["job"]["name"]) for e in recorder.events]
    return recorder.runs()[run_id]


@pytest.mark.spark
def test_a_file_stream_to_parquet_is_one_run_from_start_to_complete(spark, tmp_path, captured, py4j_calls):
    recorder, lineage = captured
    source, sink = _json_files(tmp_path / "landing" / "orders"), tmp_path / "lake" / "orders"
    query = (spark.readStream.schema(SCHEMA).json(str(source)).selectExpr("id", "v AS V").writeStream.format("parquet")
             .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert spark.read.parquet(str(sink)).count() == 2

    run = _run_events(recorder, str(query.runId), "COMPLETE")
    assert [e["eventType"] for e in run] == ["START", "RUNNING", "COMPLETE"]
    for event in run:
        validator().validate(event)
        assert event["job"] == {"namespace": "st", "name": "st.streaming.lake_orders", "facets": event["job"]["facets"]}
        assert {k: v for k, v in event["job"]["facets"]["jobType"].items() if not k.startswith("_")} == {
            "processingType": "STREAMING", "integration": "SPARK", "jobType": "SQL_JOB"}
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == lineage.app_run_id and parent["job"] == {"namespace": "st", "name": "st"}
        assert "extractionError" not in event["run"]["facets"]
    start, running, complete = run
    assert [(d["namespace"], d["name"]) for d in start["outputs"]] == [("file", str(sink))]
    assert start["inputs"] == []  # not known before the first micro-batch
    for event in (running, complete):
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [("file", str(source))]
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [("file", str(sink))]
        assert event["inputs"][0]["facets"]["dataSource"]["uri"] == "file:///"
        # What the query writes (upper-cased by its projection: Spark's plan, not the source's schema).
        assert event["outputs"][0]["facets"]["schema"]["fields"] == [{"name": "id", "type": "long"},
                                                                    {"name": "V", "type": "string"}]
    assert "schema" not in start["outputs"][0]["facets"]   # read with the first progress, off the query's thread
    for event in (running, complete):
        # What the source reads (its own schema, not the projection's), and the rows its batch read.
        assert event["inputs"][0]["facets"]["schema"]["fields"] == [{"name": "id", "type": "long"},
                                                                   {"name": "v", "type": "string"}]
        assert event["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 2
        assert "outputFacets" not in event["outputs"][0]   # Spark's file sink counts no rows it writes (-1)
    # The whole run, measured: 11 py4j calls at its start; at its first read 2 for its progress, 3 for
    # its written schema, 2 for the schemas it reads, 4 for its recent progress (the array, its length,
    # an entry, its JSON); at its end 4, and 4 for its recent progress again.
    assert len(py4j_calls) <= 32, py4j_calls


@pytest.mark.spark
def test_the_rows_of_every_micro_batch_are_counted_once_across_reads(spark, tmp_path, captured):
    """Batches between two reads of the progress (30 s apart) are counted at the next read or the
    run's end, from the query's recent progress: the terminal has the rows of all of them."""
    recorder, _ = captured
    source = tmp_path / "landing" / "events"
    source.mkdir(parents=True)

    def land(name, rows):
        (source / f"{name}.json").write_text("".join(f'{{"id": {i}, "v": "{name}"}}\n' for i in range(rows)))

    for name, rows in (("a", 2), ("b", 3), ("c", 4)):
        land(name, rows)
    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
             .writeStream.format("parquet").option("path", str(tmp_path / "lake" / "events"))
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()   # three micro-batches, a file each
        land("d", 5)
        query.processAllAvailable()
    finally:
        query.stop()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sorted(batches[:3]) == [2, 3, 4] and batches[3:] == [5]

    run = _run_events(recorder, str(query.runId), "COMPLETE")
    assert [e["eventType"] for e in run] == ["START", "RUNNING", "COMPLETE"]
    for event in run:
        validator().validate(event)
    running, complete = run[1], run[2]
    # Read at the first batch's progress (the listener bus runs behind: the batches done by then).
    assert running["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] in (
        batches[0], batches[0] + batches[1], batches[0] + batches[1] + batches[2])
    assert complete["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 14
    assert "extractionError" not in complete["run"]["facets"]


@pytest.mark.spark
def test_a_query_that_fails_is_a_failed_run_with_the_error(spark, tmp_path, captured):
    recorder, _ = captured
    source = _json_files(tmp_path / "in", count=1)

    def load(batch, batch_id):
        raise ValueError("the warehouse refused batch")

    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.foreachBatch(load)
             .option("checkpointLocation", str(tmp_path / "ck")).queryName("loader").start())
    with pytest.raises(StreamingQueryException, match="the warehouse refused batch"):
        query.awaitTermination(120)

    run = _run_events(recorder, str(query.runId), "FAIL")
    assert [e["eventType"] for e in run] == ["START", "FAIL"]
    for event in run:
        validator().validate(event)
    assert run[0]["job"]["name"] == "st.streaming.loader"
    error = run[-1]["run"]["facets"]["errorMessage"]
    assert "the warehouse refused batch" in error["message"] and error["stackTrace"]


@pytest.mark.spark
def test_a_query_still_running_when_the_application_ends_is_aborted_before_the_application_completes(
        spark, tmp_path, captured):
    recorder, lineage = captured
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream.format("memory")
             .queryName("ticks").start())
    try:
        assert eventually(lambda: str(query.runId) in recorder.runs(), 60)
        lineage.end()
    finally:
        query.stop()
    types = [(e["eventType"], e["job"]["name"]) for e in recorder.events]
    assert types[-2:] == [("ABORT", "st.streaming.ticks"), ("COMPLETE", "st")], types
    validator().validate(recorder.events[-2])


@pytest.mark.spark
def test_an_abort_counts_every_micro_batch_up_to_the_applications_end(spark, tmp_path, captured):
    """The batches since the run's last read (the next one up to 30 s away) are read for its
    ABORT: it carries the rows the query read up to the application's end, not as of the last read."""
    recorder, lineage = captured
    source = tmp_path / "landing" / "clicks"
    source.mkdir(parents=True)

    def land(name, rows):
        (source / f"{name}.json").write_text("".join(f'{{"id": {i}, "v": "{name}"}}\n' for i in range(rows)))

    land("a", 2)
    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
             .writeStream.format("memory").queryName("clicks_to_abort").start())
    try:
        query.processAllAvailable()
        run_id = str(query.runId)
        _run_events(recorder, run_id, "RUNNING")   # the first read: batch 0's progress
        land("b", 3)
        land("c", 4)
        query.processAllAvailable()                # two more micro-batches, a file each, not read yet
        lineage.end()
    finally:
        query.stop()
    fed = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sorted(fed) == [2, 3, 4], fed
    run = recorder.runs()[run_id]
    assert [e["eventType"] for e in run] == ["START", "RUNNING", "ABORT"]
    for event in run:
        validator().validate(event)
    running, abort = run[1], run[2]
    assert [(d["namespace"], d["name"]) for d in abort["inputs"]] == [("file", str(source))]
    assert running["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 2
    assert abort["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 9
    assert "extractionError" not in abort["run"]["facets"]


@pytest.mark.spark
def test_disable_lineage_stops_streaming_runs_too(spark, tmp_path, captured):
    recorder, _ = captured
    disable_lineage(spark)
    source = _json_files(tmp_path / "in", count=1)
    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    assert recorder.runs().get(str(query.runId)) is None
    assert len(spark._jsparkSession.streams().listListeners()) == 0


@pytest.mark.spark
def test_disable_lineage_while_a_query_runs_aborts_its_run(spark, captured):
    recorder, _ = captured
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream.format("memory")
             .queryName("ticks_disabled").start())
    try:
        assert eventually(lambda: str(query.runId) in recorder.runs(), 60)
        disable_lineage(spark)
    finally:
        query.stop()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    run = recorder.runs()[str(query.runId)]
    assert [e["eventType"] for e in run] == ["START", "ABORT"]
    validator().validate(run[-1])


@pytest.mark.spark
def test_enabling_again_through_another_handle_of_the_session_reports_each_run_once(spark, tmp_path, captured):
    recorder, lineage = captured
    # As SparkSession.getActiveSession() does on a thread other than the session's: a new Python
    # object (and py4j handle) for the same JVM session.
    other = SparkSession(spark.sparkContext, spark._jvm.SparkSession.getDefaultSession().get())
    assert other is not spark and other._jsparkSession.equals(spark._jsparkSession)
    try:
        assert enable_lineage(other, producer=recorder, namespace="st", app_name="st") is lineage
        source = _json_files(tmp_path / "in", count=1)
        query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.format("parquet")
                 .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        run = _run_events(recorder, str(query.runId), "COMPLETE")
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
        assert [e["eventType"] for e in recorder.runs()[str(query.runId)]] == ["START", "RUNNING", "COMPLETE"], run
        assert len(spark._jsparkSession.streams().listListeners()) == 1
    finally:
        disable_lineage(other)


@pytest.mark.parametrize(("sources", "sink", "servers", "inputs", "outputs", "left_out"), [
    (["FileStreamSource[s3a://bucket/raw/*.json]"], "FileSink[hdfs://nn:8020/lake/t]", None,
     [("s3://bucket", "raw")], [("hdfs://nn:8020", "/lake/t")], []),
    (["KafkaV2[Subscribe[orders, refunds]]"], "DeltaSink[file:/lake/orders]", "SASL_SSL://b1:9092,b2:9092",
     [("kafka://b1:9092", "orders"), ("kafka://b1:9092", "refunds")], [("file", "/lake/orders")], []),
    (["KafkaV2[Assign[orders-0, orders-1]]"], "MemorySink", "b1:9092", [("kafka://b1:9092", "orders")], [], []),
    (["KafkaV2[SubscribePattern[ord.*]]", "RateStreamV2[rowsPerSecond=5, rampUpTimeSeconds=0"],
     "org.apache.spark.sql.execution.streaming.ConsoleTable$@5b411ef0", "b1:9092", [], [], ["SubscribePattern"]),
    (["KafkaV2[Subscribe[orders]]"], "org.apache.spark.sql.kafka010.KafkaSourceProvider$KafkaTable@1a2b", None,
     [], [], ["bootstrap servers"]),   # the sink's topic: read from the writer's options (test_streaming_kafka)
])
def test_datasets_are_named_from_the_descriptions_spark_gives(sources, sink, servers, inputs, outputs, left_out):
    found_in, found_out, errors = datasets(sources, sink, servers)
    assert [(r.namespace, r.name) for r in found_in] == inputs
    assert [(r.namespace, r.name) for r in found_out] == outputs
    assert len(errors) == len(left_out) and all(word in e for word, e in zip(left_out, errors))


def test_job_names_follow_the_sink_then_the_query_name():
    assert job_name("app", "FileSink[file:/data/lake/orders]", "q") == "app.streaming.lake_orders"
    assert job_name("app", "FileSink[s3a://b/lake/ordersRaw]", None) == "app.streaming.lake_ordersraw"  # as batch
    assert job_name("app", "ForeachBatchSink", "loader") == "app.streaming.loader"
    assert job_name("app", "org.apache.spark.sql.execution.streaming.ConsoleTable$@5b411ef0", None) == \
        "app.streaming.console_table"


@pytest.mark.spark
def test_a_stream_static_join_reads_the_static_side_too(spark, tmp_path, captured):
    """Data at rest joined into a stream (files, a catalog table) is an input of the streaming
    run, named as a batch read names it, with its schema; read once a run."""
    recorder, _ = captured
    source = _json_files(tmp_path / "landing" / "orders")
    dim = tmp_path / "ref" / "dim"
    spark.createDataFrame([(0, "a"), (1, "b")], "id BIGINT, dim STRING").write.parquet(str(dim))
    spark.createDataFrame([(0, "eu")], "id BIGINT, region STRING").write.mode("overwrite").saveAsTable("st_regions")
    try:
        sink = tmp_path / "lake" / "joined"
        query = (spark.readStream.schema(SCHEMA).json(str(source)).join(spark.read.parquet(str(dim)), "id")
                 .join(spark.table("st_regions"), "id", "left").writeStream.format("parquet")
                 .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        run = _run_events(recorder, str(query.runId), "COMPLETE")
    finally:
        spark.sql("DROP TABLE IF EXISTS st_regions")
    assert [e["eventType"] for e in run] == ["START", "RUNNING", "COMPLETE"]
    for event in run:
        validator().validate(event)
        assert "extractionError" not in event["run"]["facets"]
    warehouse = spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
    for event in run[1:]:
        inputs = {(d["namespace"], d["name"]): d for d in event["inputs"]}
        assert list(inputs) == [("file", str(source)), ("file", str(dim)),
                                ("file", f"{warehouse.rstrip('/')}/st_regions")], list(inputs)
        assert inputs[("file", str(dim))]["facets"]["schema"]["fields"] == [{"name": "id", "type": "long"},
                                                                           {"name": "dim", "type": "string"}]
        table = inputs[("file", f"{warehouse.rstrip('/')}/st_regions")]
        assert table["facets"]["symlinks"]["identifiers"][0]["name"] == "default.st_regions"
        assert "inputFacets" not in table   # rows are counted per source; a batch side has none
        assert inputs[("file", str(source))]["inputFacets"]["inputStatistics"]["rowCount"] == 2
