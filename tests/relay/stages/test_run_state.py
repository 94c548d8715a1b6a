"""RunRecord and built events: run state holds any event decode accepts, however deep."""

from __future__ import annotations

import orjson

from relay.events import LineageEvent
from relay.stages.decode import decode_record
from relay.stages.event_checks import MAX_DEPTH
from relay.stages.json_bytes import dumps
from relay.stages.merge import RunMerger
from relay.stages.run_state import WAITING, RunRecord, built_event

RUN_ID = "f69a6e9b-9bac-3c9a-9cf6-eacb70ecc9a9"
FACET = {"_producer": "https://example.com/producer", "_schemaURL": "https://example.com/Deep.json#/$defs/Deep"}
#: The most levels the relay wraps around an event in its changelog record (``held``: the
#: record, its state, the held list, an [at, doc] pair).
RECORD_LEVELS = 4


def deep_event(event_type: str, second: int, levels: int = MAX_DEPTH) -> dict:
    """A RunEvent nested ``levels`` deep: the event, run, facets, deep, value, then arrays."""
    value: object = {"leaf": f"at {second}"}
    for _ in range(levels - 6):
        value = [value]
    return {
        "eventTime": f"2024-05-01T10:15:{second:02d}Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "eventType": event_type,
        "run": {"runId": RUN_ID, "facets": {"deep": {**FACET, "value": value}}},
        "job": {"namespace": "spark-prod", "name": "etl", "facets": {"deepJob": {**FACET, "value": value}}},
        "inputs": [], "outputs": [],
        "deepTop": value,  # an extra top-level key: part of the event's base in a RunMerger
    }


def through_json(state: dict) -> dict:
    """The state as a changelog record's JSON, written and read back as the table does."""
    record = orjson.dumps({"v": 1, "state": state})
    return orjson.loads(record)["state"]


def test_a_run_holding_events_as_deep_as_decode_accepts_is_saved_and_restored() -> None:
    start, running = deep_event("START", 1), deep_event("RUNNING", 2)
    assert all(isinstance(decode_record(dumps(doc), max_bytes=1 << 22), LineageEvent) for doc in (start, running))
    run = RunRecord(RUN_ID, 0.0, WAITING)
    run.start_doc = start
    run.held = [[2_000_000, running]]
    run.merged = RunMerger()
    run.merged.add(running, 2_000_000)
    back = RunRecord.from_state(RUN_ID, through_json(run.to_state()), shift=0.0)
    assert dumps(back.start_doc) == dumps(start)
    assert [at for at, _ in back.held] == [2_000_000] and dumps(back.held[0][1]) == dumps(running)
    built = back.merged.running_event()
    assert dumps(built["deepTop"]) == dumps(running["deepTop"])
    assert dumps(built["run"]["facets"]["deep"]) == dumps(running["run"]["facets"]["deep"])
    assert dumps(built["job"]["facets"]["deepJob"]) == dumps(running["job"]["facets"]["deepJob"])


def test_the_record_nests_a_deepest_event_within_what_orjson_reads() -> None:
    # decode's limit leaves room for the levels the record adds around an event.
    run = RunRecord(RUN_ID, 0.0, WAITING)
    run.held = [[1, deep_event("RUNNING", 2)]]
    record = orjson.dumps({"v": 1, "state": run.to_state()})
    assert MAX_DEPTH + RECORD_LEVELS <= 1024
    assert orjson.loads(record)["state"]["held"][0][1]["eventType"] == "RUNNING"


def test_a_built_deep_event_has_the_digest_decode_gives_it() -> None:
    doc = deep_event("COMPLETE", 3)
    event = built_event(doc, now=5.0)
    assert isinstance(event, LineageEvent) and event.consumed_at == 5.0
    reordered = dumps(dict(reversed(list(doc.items()))))
    assert reordered != event.body
    assert event.digest == decode_record(reordered, max_bytes=1 << 22).digest


def test_a_built_event_is_marked_when_it_holds_an_integer_beyond_64_bits() -> None:
    # Valid or not (one an earlier version kept is sent as it is), as decode marks it.
    for event_type in ("COMPLETE", "DONE"):
        doc = deep_event(event_type, 4, levels=8)
        assert not built_event(doc, now=5.0).big_int
        doc["run"]["facets"]["deep"]["n"] = 2**64
        event = built_event(doc, now=5.0)
        assert event.big_int and event.doc["run"]["facets"]["deep"]["n"] == 2**64, event_type
