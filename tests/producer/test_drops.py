"""Every dropped event is counted and logged with its reason (rate-limited), no broker needed."""

from __future__ import annotations

import logging

import orjson
import pytest

from producer import LineageProducer, events
from producer.event_values import NotAnEvent, as_event
from producer.keys import message_key
from producer.sender import _should_log
from tests.producer.support import wait_for


def test_an_emit_after_close_is_counted_and_logged(tmp_path, caplog):
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path)
    producer.close(0)
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer.emit(events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name="j"))
    assert producer.stats.dropped == {"closed": 1}
    assert any("event=dropped reason=closed" in r.getMessage() for r in caplog.records)


def test_drop_logging_is_rate_limited_also_for_many_at_once():
    assert [c for c in range(1, 2001) if _should_log(c)] == [*range(1, 11), 1000, 2000]
    # lost_in_fatal_producer drops many at once: logged when the run reaches the first ten
    # or crosses a thousand, whatever its size.
    assert _should_log(500, 500) and _should_log(1005, 10) and _should_log(4000, 3000)
    assert not _should_log(990, 5) and not _should_log(1500, 400)


def test_a_value_that_is_not_an_event_is_dropped_never_queued(tmp_path, caplog):
    """emit() never raises: None, a number, a list, text that is not a JSON object are
    counted and logged as not_an_event and never reach the journal (the relay would only
    dead-letter them). A dict, JSON object text and an openlineage-python event are events."""
    caplog.set_level(logging.ERROR, "producer.kafka")
    event = events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name="j")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path)
    try:
        for bad in (None, 42, "not json", b"\xff\xfe", "[1, 2]", [event], object()):
            producer.emit(bad)
        assert producer.stats.dropped == {"not_an_event": 7} and producer.pending == 0
        producer.emit(event)
        producer.emit(orjson.dumps(event).decode())
        producer.emit(orjson.dumps(event))
        assert producer.stats.dropped == {"not_an_event": 7}
        # A record moving to the journal (the broker is unreachable) counts in both places for
        # a moment: pending errs high, never low.
        wait_for(lambda: producer.pending == 3, 10, "the three events pending")
    finally:
        producer.close(0)
    lines = [r.getMessage() for r in caplog.records if "reason=not_an_event" in r.getMessage()]
    assert len(lines) == 7 and "detail=NoneType is not an OpenLineage event" in lines[0]
    assert producer.stats.journaled == 3


def test_an_openlineage_python_event_object_is_an_event():
    pytest.importorskip("openlineage.client")
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    run_id = events.new_run_id()
    obj = RunEvent(eventType=RunState.START, eventTime="2024-01-01T00:00:00+00:00", run=Run(runId=run_id),
                   job=Job(namespace="ns", name="j"), producer="https://example.com/p")
    doc = as_event(obj)
    assert doc["run"]["runId"] == run_id and doc["eventType"] == "START" and message_key(doc) == "run:ns/j"
    with pytest.raises(NotAnEvent, match="^EventType is not an OpenLineage event"):
        as_event(RunState.START)
