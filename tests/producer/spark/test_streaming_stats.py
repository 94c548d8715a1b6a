"""A streaming run's row counts and source schemas: every micro-batch counted once, exactly or
not at all, the next read early enough that Spark's recent progress drops no batch, and an
ABORT counting the batches up to the application's end."""

from __future__ import annotations

from types import SimpleNamespace as NS

import orjson

from producer.spark.capture import CaptureSettings
from producer.spark.listener import SparkLineage
from producer.spark.streaming import PROGRESS_READ_INTERVAL_S, StreamingLineage
from producer.spark.streaming_listener import _QueryListener
from producer.spark.streaming_stats import RECENT_PROGRESS, RowCounts, read_new_progress, source_schemas
from tests.producer.spark.support import Recorder
from tests.support.spec import validator

RUN = "00000000-0000-4000-8000-0000000000aa"
SOURCE = "FileStreamSource[file:/landing/in]"


def _batch(batch, rows_in, rows_out=-1, sources=1):
    return {"runId": RUN, "batchId": batch, "timestamp": "2026-11-28T10:00:01.000Z",
            "sources": [{"description": SOURCE if i == 0 else f"FileStreamSource[file:/landing/in{i}]",
                         "numInputRows": rows_in} for i in range(sources)],
            "sink": {"description": "FileSink[file:/lake/out]", "numOutputRows": rows_out}}


def test_each_batch_counts_once_and_an_empty_progress_for_a_batch_to_come_takes_nothing_from_it():
    counts = RowCounts()
    counts.add([_batch(0, 5, 5), _batch(1, 0, 0)], True)   # Spark 3.4: an empty progress for batch 1 to come
    counts.add([_batch(1, 7, 7), _batch(2, 3, 3)], False)  # read again down to the last counted: batch 1 has run
    counts.add([_batch(2, 3, 3)], False)                   # nothing new
    assert (counts.rows_in, counts.rows_out, counts.last_batch, counts.lost) == ([15], 15, 2, None)


def test_a_sink_that_counts_nothing_has_no_output_count():
    counts = RowCounts()
    counts.add([_batch(0, 5), _batch(1, 2)], True)
    assert (counts.rows_in, counts.rows_out) == ([7], None)


def test_batches_dropped_from_sparks_buffer_before_a_read_give_the_counts_up():
    counts = RowCounts()
    counts.add([_batch(0, 5, 5)], True)
    counts.add([_batch(3, 1, 1), _batch(4, 1, 1)], True)  # read to its oldest entry, 1 and 2 gone
    assert counts.lost and "micro-batches 1-2" in counts.lost
    counts.add([_batch(5, 1, 1)], False)
    assert counts.rows_in == [5]   # never a short count reported as the total


def test_at_the_first_read_the_batch_that_triggered_it_must_still_be_in_sparks_buffer():
    counts = RowCounts()
    counts.add([_batch(3, 1, 1), _batch(4, 1, 1)], True, floor=1)   # triggered by batch 1's progress: 1-2 gone
    assert counts.lost and "micro-batches 1-2" in counts.lost and counts.rows_in == []
    kept = RowCounts()
    kept.add([_batch(0, 2, 2), _batch(1, 1, 1)], True, floor=1)   # older batches than the floor: counted too
    assert (kept.rows_in, kept.rows_out, kept.lost) == ([3], 3, None)
    empty = RowCounts()
    empty.add([], True, floor=0)   # spark.sql.streaming.numRecentProgressUpdates=0: Spark keeps none
    assert empty.lost and "no micro-batch from 0 on" in empty.lost


class _Query:
    """A query's recent progress as py4j shows it: each call on the array or an entry counted."""

    def __init__(self) -> None:
        self.posted: list[dict] = []
        self.calls: list[str] = []

    def recentProgress(self):  # noqa: N802 - Scala
        self.calls.append("recentProgress")
        entries = [NS(json=lambda p=p: self.calls.append("json") or orjson.dumps(p).decode())
                   for p in self.posted[-RECENT_PROGRESS:]]
        return entries

    def sink(self):
        return NS(toString=lambda: "FileSink[file:/lake/out]")

    def analyzedPlan(self):  # noqa: N802
        return NS(schema=lambda: NS(json=lambda: '{"type": "struct", "fields": []}'))

    def logicalPlan(self):  # noqa: N802
        leaf = {"class": "org.apache.spark.sql.execution.streaming.StreamingExecutionRelation", "num-children": 0,
                "output": [[{"name": "id", "dataType": "long", "exprId": {"id": 1}}]]}
        return NS(toJSON=lambda: orjson.dumps([{"class": "x.Project", "num-children": 1}, leaf]).decode())


def test_reading_newest_first_stops_at_the_last_batch_counted():
    query = _Query()
    query.posted = [_batch(b, 1) for b in range(10)]
    found, to_oldest = read_new_progress(query, 7)
    assert [p["batchId"] for p in found] == [7, 8, 9] and not to_oldest
    assert query.calls == ["recentProgress", "json", "json", "json"]


def test_a_source_used_twice_is_one_schema_and_unpaired_leaves_are_told():
    leaf = {"class": "a.StreamingExecutionRelation", "output": [[{"name": "id", "dataType": "long", "exprId": 1}]]}
    other = {"class": "b.StreamingDataSourceV2ScanRelation",
             "output": [[{"name": "key", "dataType": "binary", "exprId": 2}]]}
    schemas = source_schemas(orjson.dumps([{"class": "Union"}, leaf, leaf, other]).decode())
    assert schemas == [[{"name": "id", "type": "long"}], [{"name": "key", "type": "binary"}]]


def _capture(query):
    recorder, clock = Recorder(), NS(now=1000.0)
    spark = NS(sparkContext=NS(_jsc=None, _gateway=None),
               _jsparkSession=NS(streams=lambda: NS(get=lambda _id: NS(streamingQuery=lambda: query))))
    lineage = SparkLineage(spark, recorder, CaptureSettings(namespace="st", app_job_name="st"))
    streaming = lineage._streaming = StreamingLineage(lineage, clock=lambda: clock.now)
    listener = _QueryListener(streaming)
    listener.onQueryStarted(NS(runId=lambda: NS(toString=lambda: RUN), id=lambda: NS(toString=lambda: RUN),
                               name=lambda: None, timestamp=lambda: "2026-11-28T10:00:00.000Z"))
    return recorder, clock, listener


def _post(listener, query, rows=1):
    progress = _batch(len(query.posted), rows)
    query.posted.append(progress)
    _deliver(listener, progress)


def _deliver(listener, progress):
    """Spark's listener bus delivering a progress event (it may run behind the query)."""
    listener.onQueryProgress(NS(progress=lambda: NS(json=lambda: orjson.dumps(progress).decode())))


def _stop(listener):
    listener.onQueryTerminated(NS(runId=lambda: NS(toString=lambda: RUN),
                                  exception=lambda: NS(isDefined=lambda: False)))


def _reads(query):
    return query.calls.count("recentProgress")


def test_a_fast_query_is_read_before_sparks_buffer_could_drop_a_batch():
    """Four batches a second fill Spark's 100 in 25 s: read every 50 progresses, not every 30 s."""
    query = _Query()
    recorder, clock, listener = _capture(query)
    _post(listener, query)
    for _ in range(4 * 120):   # two minutes
        clock.now += 0.25
        _post(listener, query)
    _stop(listener)
    (terminal,) = [e for e in recorder.runs()[RUN] if e["eventType"] == "COMPLETE"]
    validator().validate(terminal)
    assert "extractionError" not in terminal["run"]["facets"]
    assert terminal["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == len(query.posted) == 481
    assert terminal["inputs"][0]["facets"]["schema"]["fields"] == [{"name": "id", "type": "long"}]
    assert _reads(query) == 11   # the first batch's, then every 50 progresses (9), and the end's


def test_a_slow_query_keeps_the_usual_interval_and_a_gap_is_told_not_counted():
    query = _Query()
    recorder, clock, listener = _capture(query)
    _post(listener, query)
    for _ in range(4):
        clock.now += PROGRESS_READ_INTERVAL_S / 2
        _post(listener, query)
    assert _reads(query) == 3   # at the first batch, then once an interval
    # A burst whose progress events never came (the listener bus's queue was full: Spark drops them).
    query.posted += [_batch(len(query.posted) + i, 1) for i in range(2 * RECENT_PROGRESS)]
    clock.now += PROGRESS_READ_INTERVAL_S
    _post(listener, query)
    _stop(listener)
    (terminal,) = [e for e in recorder.runs()[RUN] if e["eventType"] == "COMPLETE"]
    validator().validate(terminal)
    assert "inputFacets" not in terminal["inputs"][0]
    errors = [e["errorMessage"] for e in terminal["run"]["facets"]["extractionError"]["errors"]]
    assert any(e.startswith("no row counts: micro-batches 5-105 left Spark's recent progress") for e in errors), errors


def test_a_first_read_that_finds_the_batch_that_triggered_it_gone_gives_the_counts_up():
    """The listener bus ran 150 progresses behind the query: when batch 0's progress comes, batches
    0-49 have left Spark's recent progress; the 100 left are not the run's total."""
    query = _Query()
    recorder, clock, listener = _capture(query)
    query.posted = [_batch(b, 1) for b in range(150)]
    _deliver(listener, query.posted[0])
    _stop(listener)
    running, terminal = [e for e in recorder.runs()[RUN] if e["eventType"] in ("RUNNING", "COMPLETE")]
    for event in (running, terminal):
        validator().validate(event)
        assert "inputFacets" not in event["inputs"][0]
        errors = [e["errorMessage"] for e in event["run"]["facets"]["extractionError"]["errors"]]
        assert any(e.startswith("no row counts: micro-batches 0-49 left Spark's recent progress") for e in errors), \
            errors


def _end(listener):
    """The application ends with the query still running (``spark.stop()`` or exit)."""
    listener.owner._lineage.end()
    (abort,) = [e for e in listener.owner._lineage.sender.runs()[RUN] if e["eventType"] == "ABORT"]
    validator().validate(abort)
    return abort


def test_an_abort_counts_the_batches_since_the_last_read():
    query = _Query()
    recorder, clock, listener = _capture(query)
    _post(listener, query, rows=2)            # the first batch: read
    for _ in range(5):                        # within the interval: not read
        clock.now += 1
        _post(listener, query, rows=3)
    query.calls.clear()
    abort = _end(listener)
    assert abort["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 2 + 5 * 3
    assert "extractionError" not in abort["run"]["facets"]
    # Newest first down to the last batch counted: the array, then the 5 new progresses and batch 0 again.
    assert query.calls == ["recentProgress"] + ["json"] * 6
    assert [e["eventType"] for e in recorder.events][-2:] == ["ABORT", "COMPLETE"]


def test_an_abort_whose_read_fails_carries_no_counts_and_says_why():
    query = _Query()
    recorder, clock, listener = _capture(query)
    _post(listener, query, rows=2)
    clock.now += 1
    _post(listener, query, rows=3)

    def gone():
        raise RuntimeError("An error occurred while calling o131.recentProgress")
    query.recentProgress = gone
    abort = _end(listener)   # raises nothing into the job
    assert "inputFacets" not in abort["inputs"][0]   # not the last read's 2, short of the 5 read
    errors = [e["errorMessage"] for e in abort["run"]["facets"]["extractionError"]["errors"]]
    assert errors == ["no row counts: could not read the query's recent progress: "
                      "RuntimeError: An error occurred while calling o131.recentProgress"]
    assert [e["eventType"] for e in recorder.events][-2:] == ["ABORT", "COMPLETE"]


def test_an_abort_of_a_run_never_read_reads_nothing():
    query = _Query()
    recorder, clock, listener = _capture(query)
    listener.onQueryIdle(NS(runId=lambda: NS(toString=lambda: RUN)))   # its first read put off
    clock.now += 1
    _post(listener, query)
    _end(listener)
    assert query.calls == []
