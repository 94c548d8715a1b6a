"""What a streaming query's progress costs on Spark's listener bus: each run's progress is read
(two py4j calls and a JSON parse) at its first micro-batch and then at most once every
``PROGRESS_READ_INTERVAL_S`` (or ``READ_EVERY_PROGRESSES`` progresses: test_streaming_stats.py),
on that run's own schedule. A run that posts no progress (idle
from its start: Spark 3.5+ sends ``onQueryIdle`` instead) does not make every other query's
progress cost a read.

The fakes stand in for Spark's event objects and count each method called on them: each is one
py4j round trip on the real objects."""

from __future__ import annotations

from types import SimpleNamespace as NS

import orjson

from producer.spark.capture import CaptureSettings
from producer.spark.listener import SparkLineage
from producer.spark.streaming import PROGRESS_READ_INTERVAL_S, StreamingLineage
from producer.spark.streaming_listener import _QueryListener
from tests.producer.spark.support import Recorder

IDLE, BUSY = "00000000-0000-4000-8000-00000000001d", "00000000-0000-4000-8000-00000000000b"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Jvm:
    """Java objects whose every method call is counted, as py4j round trips are."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def obj(self, **methods):
        def counted(name, value):
            def call():
                self.calls.append(name)
                return value() if callable(value) else value
            return call
        return NS(**{name: counted(name, value) for name, value in methods.items()})

    def uuid(self, text):
        return self.obj(toString=text)


def _setup():
    jvm, clock, recorder = _Jvm(), _Clock(), Recorder()
    query = NS(sink=lambda: NS(toString=lambda: "FileSink[file:/lake/out]"),
               analyzedPlan=lambda: NS(collectLeaves=lambda: NS(iterator=lambda: NS(hasNext=lambda: False))),
               recentProgress=lambda: [])   # the row counts' reads: test_streaming_stats.py
    spark = NS(sparkContext=NS(_jsc=None, _gateway=None),
               _jsparkSession=NS(streams=lambda: NS(get=lambda _id: NS(streamingQuery=lambda: query))))
    lineage = SparkLineage(spark, recorder, CaptureSettings(namespace="st", app_job_name="st"))
    streaming = lineage._streaming = StreamingLineage(lineage, clock=clock)
    return jvm, clock, recorder, _QueryListener(streaming)


def _start(listener, jvm, run_id):
    listener.onQueryStarted(jvm.obj(runId=jvm.uuid(run_id), id=jvm.uuid(run_id), name=None,
                                    timestamp="2026-11-27T10:00:00.000Z"))


def _idle(listener, jvm, run_id):
    listener.onQueryIdle(jvm.obj(runId=jvm.uuid(run_id), id=jvm.uuid(run_id), timestamp="2026-11-27T10:00:00.000Z"))


def _progress(listener, jvm, run_id, source="in"):
    text = orjson.dumps({"runId": run_id, "timestamp": "2026-11-27T10:00:01.000Z",
                         "sources": [{"description": f"FileStreamSource[file:/landing/{source}]"}],
                         "sink": {"description": "FileSink[file:/lake/out]"}}).decode()
    jvm.calls.clear()
    listener.onQueryProgress(jvm.obj(progress=jvm.obj(json=text)))
    return len(jvm.calls)


def _running(recorder, run_id):
    return [[d["name"] for d in e["inputs"]] for e in recorder.runs()[run_id] if e["eventType"] == "RUNNING"]


def test_a_query_idle_from_its_start_costs_the_busy_queries_beside_it_nothing():
    jvm, clock, recorder, listener = _setup()
    _start(listener, jvm, IDLE)
    _start(listener, jvm, BUSY)
    _idle(listener, jvm, IDLE)  # Spark 3.5+: no progress while nothing arrives
    assert _progress(listener, jvm, BUSY) == 2  # the busy run's first micro-batch: read
    costs = []
    for step in range(1, 13):  # a progress every 5 s for a minute
        clock.now += 5
        if step % 2 == 0:
            _idle(listener, jvm, IDLE)  # again every noDataProgressEventInterval (10 s)
        costs.append(_progress(listener, jvm, BUSY))
    # Read again once its own interval has passed (30 s, 60 s), not at every progress.
    assert costs == [0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 2], costs
    assert _running(recorder, BUSY) == [["/landing/in"]]


def test_a_query_that_was_idle_is_read_once_data_arrives():
    jvm, clock, recorder, listener = _setup()
    _start(listener, jvm, IDLE)
    _idle(listener, jvm, IDLE)
    clock.now += PROGRESS_READ_INTERVAL_S  # its last idle notice is an interval old: data arrived since
    assert _progress(listener, jvm, IDLE) == 2
    assert _running(recorder, IDLE) == [["/landing/in"]]


def test_each_run_is_read_on_its_own_schedule():
    jvm, clock, recorder, listener = _setup()
    _start(listener, jvm, IDLE)  # here busy too: two busy runs, read at different times
    _start(listener, jvm, BUSY)
    _progress(listener, jvm, IDLE)
    clock.now += 20
    _progress(listener, jvm, BUSY)
    clock.now += PROGRESS_READ_INTERVAL_S - 20 + 1  # the first run is due, the second read 11 s ago
    _progress(listener, jvm, BUSY, source="other")
    assert _running(recorder, BUSY) == [["/landing/in"]]  # not read again before its own interval
    _progress(listener, jvm, IDLE, source="other")
    assert _running(recorder, IDLE) == [["/landing/in"], ["/landing/other"]]
    clock.now += 20
    assert _progress(listener, jvm, BUSY, source="other") == 2
    assert _running(recorder, BUSY) == [["/landing/in"], ["/landing/other"]]


def _terminate(listener, jvm, run_id):
    jvm.calls.clear()
    listener.onQueryTerminated(jvm.obj(runId=jvm.uuid(run_id), id=jvm.uuid(run_id),
                                       exception=jvm.obj(isDefined=False)))
    return [c for c in jvm.calls if c in ("lastProgress", "json")]


def _ended(recorder, run_id):
    (terminal,) = [e for e in recorder.runs()[run_id] if e["eventType"] in ("COMPLETE", "FAIL", "ABORT")]
    return [d["name"] for d in terminal["inputs"]], [d["name"] for d in terminal["outputs"]]


def test_a_query_idle_until_it_stops_names_its_datasets_in_its_terminal():
    """Never read (each idle notice put its read off), its last progress is read at its end."""
    jvm, clock, recorder, listener = _setup()
    _start(listener, jvm, IDLE)
    _idle(listener, jvm, IDLE)
    text = orjson.dumps({"runId": IDLE, "sources": [{"description": "FileStreamSource[file:/landing/late]"}],
                         "sink": {"description": "FileSink[file:/lake/out]"}}).decode()
    listener.owner._runs[IDLE].query = jvm.obj(lastProgress=jvm.obj(json=text))
    assert _terminate(listener, jvm, IDLE) == ["lastProgress", "json"]
    assert _ended(recorder, IDLE) == (["/landing/late"], ["/lake/out"])


def test_a_query_read_before_it_stops_costs_no_read_at_its_end():
    jvm, clock, recorder, listener = _setup()
    _start(listener, jvm, BUSY)
    _progress(listener, jvm, BUSY)
    listener.owner._runs[BUSY].query = jvm.obj(lastProgress=jvm.obj(json="{}"))
    assert _terminate(listener, jvm, BUSY) == []
    assert _ended(recorder, BUSY) == (["/landing/in"], ["/lake/out"])
