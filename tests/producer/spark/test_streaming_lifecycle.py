"""A streaming run's events keep their order when its callbacks meet the application's end or
``disable_lineage``: START first, one terminal, nothing after it, and every streaming run's
terminal before the application's COMPLETE.

Spark's callbacks arrive on two threads (``onQueryStarted`` on the query's, the others on the
listener bus) while the application ends on the driver's main thread. The fakes below stand in
for Spark's event objects; one of their py4j calls ends the application, which puts the main
thread's work exactly where a real py4j round trip leaves room for it."""

from __future__ import annotations

import threading
from types import SimpleNamespace as NS

import orjson

from producer.spark.capture import CaptureSettings
from producer.spark.listener import SparkLineage
from producer.spark.streaming import StreamingLineage
from tests.producer.spark.support import Recorder
from tests.support.spec import validator

RUN, QUERY = "6b2f1c1e-0000-4000-8000-000000000001", "6b2f1c1e-0000-4000-8000-0000000000aa"


def _uuid(text):
    return NS(toString=lambda: text)


def _option(value):
    return NS(isDefined=lambda: value is not None, get=lambda: value)


class _Spark:
    """Just enough of a SparkSession for the streaming capture: ``streams().get(id)`` returns
    the query, and ``on_lookup`` runs during that call (as the main thread could)."""

    def __init__(self, query):
        self.on_lookup = None
        self.sparkContext = NS(_jsc=None, _gateway=None)
        self._jsparkSession = NS(streams=lambda: NS(get=self._get, removeListener=lambda _: None))
        self._query = query

    def _get(self, _id):
        if self.on_lookup is not None:
            self.on_lookup()
        return NS(streamingQuery=lambda: self._query)


def _capture(on_plan=None):
    def analyzed_plan():
        if on_plan is not None:
            on_plan()
        return NS(collectLeaves=lambda: NS(iterator=lambda: NS(hasNext=lambda: False)))

    query = NS(sink=lambda: NS(toString=lambda: "FileSink[file:/lake/orders]"), analyzedPlan=analyzed_plan)
    recorder = Recorder()
    spark = _Spark(query)
    lineage = SparkLineage(spark, recorder, CaptureSettings(namespace="st", app_job_name="st"))
    streaming = lineage._streaming = StreamingLineage(lineage)
    return lineage, streaming, spark, recorder


def _started(streaming):
    streaming.on_started(NS(runId=lambda: _uuid(RUN), id=lambda: _uuid(QUERY), name=lambda: None,
                            timestamp=lambda: "2026-11-27T10:00:00.000Z"))


def _progress(streaming, **fields):
    progress = {"runId": RUN, "timestamp": "2026-11-27T10:00:01.000Z", **fields,
                "sources": [{"description": "FileStreamSource[file:/landing/orders]"},
                            {"description": "KafkaV2[Subscribe[orders]]"}],
                "sink": {"description": "FileSink[file:/lake/orders]"}}
    streaming.on_progress(NS(progress=lambda: NS(json=lambda: orjson.dumps(progress).decode())))


def _terminated(streaming, exception=None):
    streaming.on_terminated(NS(runId=lambda: _uuid(RUN), exception=exception or (lambda: _option(None))))


def _order(recorder):
    return [(e["eventType"], e["job"]["name"]) for e in recorder.events]


def test_a_progress_read_when_the_application_ends_reports_nothing_after_the_abort():
    ending = []
    lineage, streaming, _, recorder = _capture(on_plan=lambda: ending and lineage.end())
    _started(streaming)
    ending.append(True)
    _progress(streaming)  # reads the Kafka servers from the plan: the application ends meanwhile
    assert _order(recorder) == [("START", "st.streaming.lake_orders"), ("ABORT", "st.streaming.lake_orders"),
                                ("COMPLETE", "st")]
    for event in recorder.events:
        validator().validate(event)


def test_a_query_stopping_when_the_application_ends_has_one_terminal_before_the_application_completes():
    lineage, streaming, _, recorder = _capture()
    _started(streaming)

    def exception():  # the callback's py4j call: the application ends meanwhile
        lineage.end()
        return _option(None)
    _terminated(streaming, exception)
    order = _order(recorder)
    assert order[-1] == ("COMPLETE", "st"), order
    assert [t for t, job in order if job != "st"] in (["START", "ABORT"], ["START", "COMPLETE"]), order


def test_a_query_starting_when_the_application_ends_is_not_reported_after_it():
    lineage, streaming, spark, recorder = _capture()
    spark.on_lookup = lineage.end  # the query reads its sink while the application ends
    _started(streaming)
    _progress(streaming)
    _terminated(streaming)
    assert _order(recorder) == [("COMPLETE", "st")]


def test_stopping_capture_while_a_query_runs_aborts_its_run():
    lineage, streaming, _, recorder = _capture()
    _started(streaming)
    lineage.stop_capture()  # what disable_lineage does
    _terminated(streaming)
    assert _order(recorder) == [("START", "st.streaming.lake_orders"), ("ABORT", "st.streaming.lake_orders")]


def test_the_application_ending_while_capture_stops_waits_for_the_abort_being_read():
    """``disable_lineage`` on one thread takes the open run and reads its progress for the ABORT
    (outside the lock); the application ending on another meanwhile finds no run open, but its
    COMPLETE waits for that ABORT."""
    lineage, streaming, spark, recorder = _capture()
    armed, reading, release = threading.Event(), threading.Event(), threading.Event()

    def recent_progress():   # once armed, the ABORT's py4j read, held until the application is ending
        if armed.is_set():
            reading.set()
            assert release.wait(30)
        return [NS(json=lambda: orjson.dumps({"batchId": 0, "sources": [], "sink": {}}).decode())]
    spark._query.recentProgress = recent_progress
    _started(streaming)
    _progress(streaming, batchId=0)   # read
    armed.set()
    stopping = threading.Thread(target=streaming.abort_open)   # what disable_lineage's detach does
    ending = threading.Thread(target=lineage.end)
    stopping.start()
    assert reading.wait(30)
    ending.start()
    ending.join(0.5)
    assert ending.is_alive(), "the application's COMPLETE did not wait for the ABORT being read"
    release.set()
    for thread in (stopping, ending):
        thread.join(30)
        assert not thread.is_alive()
    assert _order(recorder) == [("START", "st.streaming.lake_orders"), ("RUNNING", "st.streaming.lake_orders"),
                                ("ABORT", "st.streaming.lake_orders"), ("COMPLETE", "st")]
    for event in recorder.events:
        validator().validate(event)
