"""The session's py4j listeners outlive every capture: a streaming query's clone of the session
keeps calling the listener it copied when the query started, after capture stopped or the
application ended. py4j answered such a call "Object ID unknown" without reading the rest of
it; the lines left over desynchronised the listener thread's connection, and every later
action of the session was lost. Real PySpark (the shared session)."""

from __future__ import annotations

import logging

import pytest

from producer.spark import disable_lineage, enable_lineage
from producer.spark.execution_listener import QueryExecutionListener
from producer.spark.streaming_listener import _QueryListener
from tests.producer.spark.support import Recorder, drain

pytestmark = pytest.mark.spark

SCHEMA = "id BIGINT, v STRING"


def _foreach_batch_query(spark, tmp_path):
    """A file-fed foreachBatch query (its writes run in the query's clone of the session); each
    ``feed(name)`` lands one file and returns once its micro-batch (and write) is done."""
    source, sink = tmp_path / "landing", str(tmp_path / "lake" / "fb")
    source.mkdir()

    def load(df, batch_id):
        df.write.mode("append").parquet(sink)

    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream.foreachBatch(load)
             .option("checkpointLocation", str(tmp_path / "ck")).start())

    def feed(name):
        (source / f"{name}.json").write_text(f'{{"id": 1, "v": "{name}"}}\n')
        query.processAllAvailable()
        drain(spark)
    return query, feed, sink


def _written(recorder):
    return {o["name"] for e in recorder.events if e["eventType"] == "COMPLETE" for o in e["outputs"]}


def _py4j_errors(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("stop", ["disable_lineage", "application end"])
def test_actions_are_reported_after_capture_stopped_while_a_foreach_batch_query_wrote(spark, tmp_path, stop, caplog):
    """Capture stops (``disable_lineage``, or the application's end as atexit runs it) while a
    foreachBatch query writes; the query writes again; capture is enabled again: the session's
    actions are reported, while and after the query runs, and py4j logs no error."""
    first, again = Recorder(), Recorder()
    lineage = enable_lineage(spark, producer=first, namespace="sl", app_name="sl")
    query, feed, sink = _foreach_batch_query(spark, tmp_path)
    try:
        feed("a")
        assert sink in _written(first)
        if stop == "disable_lineage":
            disable_lineage(spark)
        else:
            lineage.end()
        feed("b")   # the clone calls the listener it copied, capture off
        enable_lineage(spark, producer=again, namespace="sl", app_name="sl")
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "while_running"))
        drain(spark)
        feed("c")
    finally:
        query.stop()
    try:
        spark.range(1).write.mode("overwrite").parquet(str(tmp_path / "after_stop"))
        drain(spark)
    finally:
        disable_lineage(spark)
    assert {str(tmp_path / "while_running"), str(tmp_path / "after_stop"), sink} <= _written(again)
    assert not _py4j_errors(caplog)


def test_a_session_keeps_one_listener_of_each_kind_however_often_capture_is_switched(spark):
    """Memory stays bounded: capture switched on and off, or a new application run, reuses the
    session's two py4j listener objects (kept in py4j's pool) instead of making two each time."""
    pool = spark.sparkContext._gateway.gateway_property.pool

    def ours():
        with pool.lock:
            return {id(v): v for v in pool.dict.values() if isinstance(v, (QueryExecutionListener, _QueryListener))}

    seen = []
    for name in ("sl", "sl", "sl_other", "sl_other"):
        enable_lineage(spark, producer=Recorder(), namespace="sl", app_name=name)
        seen.append(ours())
        disable_lineage(spark)
        assert ours() == seen[-1], "a listener left py4j's pool while the session runs"
    assert len(seen[0]) == 2 and all(s.keys() == seen[0].keys() for s in seen)
