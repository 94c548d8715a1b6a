"""RunMerger: OpenLineage's additive facet semantics for one run."""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from relay.embedded.sample import PRODUCER_URI, SCHEMA_URL, spark_run
from relay.events import LineageEvent, SourceRef
from relay.stages.decode import decode_record
from relay.stages.merge import RunMerger, consolidate, epoch_micros, merge_events, merge_running
from tests.support.spec import validator

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
RUN_ID = "0190b3c6-4b8e-7d3a-9c1e-5a2f0d9e8b71"
FACET_URL = "https://openlineage.io/spec/facets/1-0-0/Example.json#/$defs/Example"


def decoded(doc: dict) -> LineageEvent:
    event = decode_record(orjson.dumps(doc), max_bytes=1 << 22, source=SourceRef("openlineage", 0, 0))
    assert isinstance(event, LineageEvent), event
    return event


def facet(**fields) -> dict:
    return {"_producer": PRODUCER_URI, "_schemaURL": FACET_URL, **fields}


def run_event(event_type: str, second: float, *, run_facets=None, job_facets=None, inputs=(), outputs=(),
              producer: str = PRODUCER_URI) -> LineageEvent:
    return decoded({
        "eventTime": (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z"),
        "producer": producer,
        "schemaURL": SCHEMA_URL,
        "eventType": event_type,
        "run": {"runId": RUN_ID, "facets": run_facets or {}},
        "job": {"namespace": "spark-prod", "name": "orders_etl.daily", "facets": job_facets or {}},
        "inputs": list(inputs),
        "outputs": list(outputs),
    })


def dataset(name: str, *, facets=None, input_facets=None, output_facets=None) -> dict:
    doc = {"namespace": "s3://acme-warehouse", "name": name, "facets": facets or {}}
    if input_facets is not None:
        doc["inputFacets"] = input_facets
    if output_facets is not None:
        doc["outputFacets"] = output_facets
    return doc


def spark_events(*, fail: bool = False, seed: int = 7) -> list[LineageEvent]:
    docs = spark_run("spark-prod", "orders_etl.insert.orders_daily", start=T0, rng=random.Random(seed),
                     with_running=2, fail=fail, parent=("airflow-prod", "orders_dag.spark_orders", RUN_ID))
    return [decoded(doc) for doc in docs]


def by_name(datasets: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for d in datasets}


# --- facet precedence -------------------------------------------------------------------


def test_a_same_name_facet_is_replaced_by_the_later_event():
    merger = merge_events([
        run_event("START", 0, run_facets={"progress": facet(percent=0)}, job_facets={"owner": facet(team="a")}),
        run_event("RUNNING", 5, run_facets={"progress": facet(percent=50)}),
        run_event("COMPLETE", 9, job_facets={"owner": facet(team="b")}),
    ])
    event = merger.consolidated_event()
    assert event["run"]["facets"]["progress"]["percent"] == 50
    assert event["job"]["facets"]["owner"]["team"] == "b"


def test_an_older_event_arriving_late_does_not_roll_a_facet_back_but_fills_gaps():
    merger = RunMerger()
    merger.add_event(run_event("COMPLETE", 10, run_facets={"progress": facet(percent=100)}))
    merger.add_event(run_event("RUNNING", 5, run_facets={"progress": facet(percent=50), "extra": facet(n=1)},
                               inputs=[dataset("raw/orders", facets={"v": facet(n=5)})]))
    merger.add_event(run_event("START", 0, inputs=[dataset("raw/orders", facets={"v": facet(n=0)})]))
    event = merger.consolidated_event()
    assert event["run"]["facets"]["progress"]["percent"] == 100
    assert event["run"]["facets"]["extra"] == facet(n=1)
    assert event["inputs"][0]["facets"]["v"]["n"] == 5
    assert event["eventTime"] == "2024-05-01T02:00:10Z"
    assert merger.earliest_micros == epoch_micros(T0)


def test_equal_event_times_let_the_later_arrival_win():
    merger = merge_events([
        run_event("RUNNING", 3, run_facets={"progress": facet(percent=10)}),
        run_event("RUNNING", 3, run_facets={"progress": facet(percent=20)}),
    ])
    assert merger.running_event()["run"]["facets"]["progress"]["percent"] == 20


# --- datasets ---------------------------------------------------------------------------


def test_inputs_from_start_and_outputs_from_complete_are_both_in_the_consolidated_event():
    events = spark_events()
    start, complete = events[0], events[-1]
    assert start.doc["inputs"] and not start.doc["outputs"]
    event = consolidate(events)
    assert [d["name"] for d in event["inputs"]] == [d["name"] for d in start.doc["inputs"]]
    assert [d["name"] for d in event["outputs"]] == [d["name"] for d in complete.doc["outputs"]]
    output = event["outputs"][0]
    assert set(output["facets"]) == {"schema", "dataSource", "columnLineage"}
    assert "outputStatistics" in output["outputFacets"]
    # Run facets from START (spark_properties) and the terminal's own survive together.
    assert {"parent", "processing_engine", "spark_properties"} <= set(event["run"]["facets"])
    assert (event["eventType"], event["eventTime"]) == ("COMPLETE", complete.doc["eventTime"])
    validator().validate(event)


def test_input_facets_merge_per_dataset():
    merger = merge_events([
        run_event("START", 0, inputs=[
            dataset("raw/orders", facets={"schema": facet(n=1)}, input_facets={"stats": facet(rows=1)}),
            dataset("raw/customers", facets={"schema": facet(n=2)}),
        ]),
        run_event("RUNNING", 1, inputs=[
            dataset("raw/orders", facets={"owner": facet(team="x")}, input_facets={"stats": facet(rows=9)}),
        ]),
        run_event("COMPLETE", 2, inputs=[dataset("raw/customers", input_facets={"version": facet(v="7")})],
                  outputs=[dataset("out/a", output_facets={"stats": facet(rows=3)})]),
    ])
    event = merger.consolidated_event()
    inputs = by_name(event["inputs"])
    assert list(inputs) == ["raw/orders", "raw/customers"]
    assert set(inputs["raw/orders"]["facets"]) == {"schema", "owner"}
    assert inputs["raw/orders"]["inputFacets"] == {"stats": facet(rows=9)}
    assert inputs["raw/customers"]["facets"] == {"schema": facet(n=2)}
    assert inputs["raw/customers"]["inputFacets"] == {"version": facet(v="7")}
    assert event["outputs"] == [dataset("out/a", output_facets={"stats": facet(rows=3)})]


def test_a_dataset_read_and_written_is_kept_in_both_lists():
    both = dataset("tmp/x", facets={"schema": facet(n=1)})
    event = merge_events([run_event("COMPLETE", 0, inputs=[both], outputs=[both])]).consolidated_event()
    assert event["inputs"] == event["outputs"] == [both]


def test_malformed_parts_are_skipped():
    event = run_event("COMPLETE", 0, inputs=[dataset("ok")])
    event.doc["inputs"] += [{"name": "no-namespace"}, "not-a-dataset", {"namespace": "n", "name": "x", "facets": []}]
    result = merge_events([event]).consolidated_event()
    assert [d["name"] for d in result["inputs"]] == ["ok", "x"]
    assert result["inputs"][1]["facets"] == {}


# --- building ---------------------------------------------------------------------------


def test_the_terminal_with_the_latest_event_time_is_the_base():
    merger = merge_events([
        run_event("COMPLETE", 8, producer="https://example.com/first"),
        run_event("FAIL", 9, producer="https://example.com/second"),
        run_event("RUNNING", 12),
    ])
    event = merger.consolidated_event()
    assert (event["eventType"], event["eventTime"], event["producer"]) == (
        "FAIL", "2024-05-01T02:00:09Z", "https://example.com/second")


def test_terminals_with_equal_event_times_let_the_later_arrival_be_the_base():
    complete = run_event("COMPLETE", 8, producer="https://example.com/first")
    fail = run_event("FAIL", 8, producer="https://example.com/second")
    assert merge_events([complete, fail]).consolidated_event()["eventType"] == "FAIL"
    assert merge_events([fail, complete]).consolidated_event()["eventType"] == "COMPLETE"


def test_consolidating_without_a_terminal_is_an_error():
    with pytest.raises(ValueError, match="no COMPLETE/FAIL/ABORT"):
        merge_events([run_event("START", 0)]).consolidated_event()


def test_merge_running_gives_one_running_event_with_every_facet():
    running = [
        run_event("RUNNING", 2, run_facets={"a": facet(n=1)}),
        run_event("RUNNING", 4, run_facets={"b": facet(n=2)}, outputs=[dataset("out/a")]),
        run_event("RUNNING", 3, run_facets={"a": facet(n=3)}),
    ]
    event = merge_running(running)
    assert event["eventType"] == "RUNNING"
    assert event["eventTime"] == "2024-05-01T02:00:04Z"
    assert event["run"]["facets"] == {"a": facet(n=3), "b": facet(n=2)}
    assert event["outputs"] == [dataset("out/a")]
    validator().validate(event)


def test_start_event_uses_the_earliest_event_and_leaves_out_outputs():
    events = spark_events(fail=True)
    merger = merge_events(reversed(events[1:]))  # no START, newest first
    marker = {"_producer": "https://github.com/lineage-relay/lineage-relay", "_schemaURL": FACET_URL}
    event = merger.start_event(run_facets={"lineageRelay_x": marker}, omit_run_facets={"errorMessage"})
    assert event["eventType"] == "START"
    assert event["eventTime"] == events[1].doc["eventTime"]
    assert event["outputs"] == []
    assert [d["name"] for d in event["inputs"]] == [d["name"] for d in events[0].doc["inputs"]]
    assert "errorMessage" not in event["run"]["facets"] and "lineageRelay_x" in event["run"]["facets"]
    validator().validate(event)


def test_building_does_not_mutate_what_was_added():
    events = spark_events()
    before = copy.deepcopy([e.doc for e in events])
    merger = merge_events(events)
    merger.consolidated_event()["run"]["facets"].clear()
    assert [e.doc for e in events] == before
    assert merger.consolidated_event()["run"]["facets"]


# --- state and size ---------------------------------------------------------------------


def test_state_survives_json_and_behaves_identically():
    events = spark_events()
    original = merge_events(events[:2])
    restored = RunMerger.from_state(orjson.loads(orjson.dumps(original.to_state())))
    assert restored.size_bytes == original.size_bytes
    assert restored.running_event() == original.running_event()
    # Later adds, including an out-of-order one, land the same way in both.
    for event in (events[3], events[2], run_event("RUNNING", -5, run_facets={"parent": facet(n=0)})):
        original.add_event(event)
        restored.add_event(event)
    assert restored.consolidated_event() == original.consolidated_event()
    assert restored.start_event() == original.start_event()
    assert restored.size_bytes == original.size_bytes
    assert restored.event_count == original.event_count == 5
    assert orjson.loads(orjson.dumps(restored.to_state())) == orjson.loads(orjson.dumps(original.to_state()))


def test_a_state_of_another_version_is_refused():
    state = merge_events(spark_events()[:1]).to_state()
    with pytest.raises(ValueError, match="version"):
        RunMerger.from_state({**state, "v": 99})
    with pytest.raises(ValueError, match="malformed"):
        RunMerger.from_state({"v": state["v"]})


def test_size_tracks_content_and_stays_flat_when_facets_are_resent():
    events = spark_events()
    merger = RunMerger()
    merger.add_event(events[0])
    after_start = merger.size_bytes
    assert after_start > len(orjson.dumps(events[0].doc["inputs"]))
    for _ in range(50):  # the same START again: every facet is replaced, nothing grows
        merger.add_event(events[0])
    assert merger.size_bytes == after_start
    merger.add_event(events[-1])
    assert merger.size_bytes > after_start + len(orjson.dumps(events[-1].doc["outputs"])) // 2


def test_interned_text_stays_mortal_on_every_interpreter():
    """Facet text is shared between runs with sys.intern only where interned strings die
    with their last user; CPython 3.12.0-3.12.5 and free-threaded builds keep them for ever,
    so there a pool of its own, emptied at a size, shares them (a relay merging runs with
    new facets would otherwise grow without bound)."""
    from relay.stages.interning import TextPool, interning_is_mortal

    assert interning_is_mortal((3, 11, 9), "cpython", False)
    assert interning_is_mortal((3, 12, 6), "cpython", False) and interning_is_mortal((3, 13, 0), "cpython", False)
    assert not interning_is_mortal((3, 12, 0), "cpython", False)
    assert not interning_is_mortal((3, 12, 5), "cpython", False)
    assert not interning_is_mortal((3, 13, 1), "cpython", True)
    pool = TextPool(max_chars=100)
    first = pool("".join(["x"] * 40))
    assert pool("".join(["x"] * 40)) is first  # equal text, one copy
    second = pool("".join(["y"] * 40))
    assert pool("".join(["z"] * 40)) is not None  # over 100 chars held: the pool starts again
    assert pool("".join(["x"] * 40)) is not first and pool("".join(["y"] * 40)) is not second
    assert pool._chars <= 100
