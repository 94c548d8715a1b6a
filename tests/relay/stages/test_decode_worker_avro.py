"""DecodeWorker and Avro records: their answers carry a JSON body, bounded for the pipe.

An Avro record's answer carries its JSON re-encoding, which can be several times its size.
The parent refused any answer longer than 4x the values it answers as garbage: one such
record (a job name of control characters) killed the child, went again to a fresh child,
and again, until decoding stayed on the relay's thread for the rest of the process."""

from __future__ import annotations

import pickle
import random
from datetime import UTC, datetime

import orjson
import pytest

from producer.codec import avro
from relay.embedded.sample import spark_run
from relay.events import LineageEvent, Rejection
from relay.stages import decode
from relay.stages.decode import avro_body_bound, decode_fields, decode_record
from relay.stages.decode_pipe import compact, frame_bound
from relay.stages.decode_worker import DecodeWorker

RUN_ID = "0190b9a5-6c1e-7f3a-8b2c-1d2e3f4a5b6c"
MAX = 64 << 20


def event(**fields) -> dict:
    return {"eventType": "START", "eventTime": "2024-01-01T12:00:00Z", "producer": "p", "schemaURL": "s",
            "run": {"runId": RUN_ID}, "job": {"namespace": "n", "name": "j"}, **fields}


_EMPTY_DATASET = {"namespace": "", "name": "", "facets": {}, "inputFacets": {}, "outputFacets": {}}
#: The Avro records whose JSON is longest for their size (see decode.AVRO_JSON_GROWTH).
WORST = {
    "control-characters": event(job={"namespace": "n", "name": "\x01" * (2 << 20)}),
    "quotes": event(producer='"' * (1 << 20)),
    "empty-datasets": event(inputs=[_EMPTY_DATASET] * 50_000, outputs=[_EMPTY_DATASET] * 50_000),
    "empty-facet-names": event(run={"runId": RUN_ID, "facets": {"\x01" * i: {} for i in range(1, 400)}}),
}


@pytest.mark.parametrize("doc", WORST.values(), ids=WORST.keys())
def test_an_avro_records_json_stays_within_the_bound_the_pipe_allows(doc):
    value = avro.encode(doc)
    found = decode_fields(value, max_bytes=MAX)
    assert type(found) is tuple, found
    body = found[1]
    assert orjson.loads(body) == doc
    assert len(body) <= avro_body_bound(len(value))
    # The whole answer frame, as the child writes it, within what the parent reads.
    assert len(pickle.dumps([compact(found, value)], protocol=5)) <= frame_bound([value])


def test_control_characters_and_empty_datasets_grow_more_than_the_old_4x_bound():
    for name in ("control-characters", "empty-datasets"):
        value = avro.encode(WORST[name])
        assert len(decode_fields(value, max_bytes=MAX)[1]) > 5.9 * len(value), name


def test_an_avro_record_over_the_bound_is_refused_as_too_large(monkeypatch):
    """A future writer schema that grows more than AVRO_JSON_GROWTH: the record is refused
    with its sizes, never an answer the parent would take for garbage."""
    monkeypatch.setattr(decode, "AVRO_JSON_GROWTH", 1)
    value = avro.encode(WORST["control-characters"])
    rejection = decode_record(value, max_bytes=MAX)
    assert type(rejection) is Rejection and rejection.reason == "too_large"
    assert f"Avro record of {len(value)} bytes" in rejection.detail and "as JSON" in rejection.detail


@pytest.mark.parametrize("name", ["control-characters", "empty-datasets"])
def test_an_avro_record_that_grows_six_times_as_json_is_answered_by_the_child_which_stays(name, caplog):
    good = [orjson.dumps(e) for e in spark_run("spark-prod", "etl.orders", start=datetime(2024, 5, 1, tzinfo=UTC),
                                               rng=random.Random(3))]
    grown = avro.encode(WORST[name])
    batch = [good[0], grown, *good[1:], avro.encode(orjson.loads(good[0]))]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        pid = worker._proc.pid
        first = worker.decode(batch, timeout_s=120)
        second = worker.decode(batch, timeout_s=120)
        pids = {pid, worker._proc.pid}
        in_process, failures = worker.in_process, worker._failures
    finally:
        worker.close()
    for got in (first, second):
        assert all(type(r) is LineageEvent for r in got), [getattr(r, "detail", None) for r in got]
        assert orjson.loads(got[1].body) == WORST[name]
        assert [r.digest for r in got] == [decode_record(v, max_bytes=MAX).digest for v in batch]
    assert len(pids) == 1 and not in_process and failures == 0
    assert "decode_worker_failed" not in caplog.text


def test_an_avro_records_json_over_max_bytes_is_too_large_and_weighs_what_it_holds():
    """The size limit was checked on the Avro record only: its JSON (what collectors are sent)
    could be several times ``max_bytes``, and only the record counted in max_pending_bytes
    while the relay held both."""
    from relay.app import held_bytes

    doc = WORST["empty-datasets"]
    value = avro.encode(doc)
    json_size = len(orjson.dumps(doc))
    limit = (len(value) + json_size) // 2
    assert len(value) < limit < json_size
    found = decode_record(value, max_bytes=limit)
    assert isinstance(found, Rejection) and found.reason == decode.TOO_LARGE, found
    assert f"is {json_size} bytes as JSON, over the limit of {limit} bytes" in found.detail
    event = decode_record(value, max_bytes=MAX)
    assert isinstance(event, LineageEvent)
    assert held_bytes(value, event) == len(value) + len(event.body) == len(value) + json_size
    as_json = orjson.dumps(doc)
    assert held_bytes(as_json, decode_record(as_json, max_bytes=MAX)) == len(as_json)
    assert held_bytes(value, found) == len(value)
