"""RunConsolidator: consolidated and coalesce delivery, START first, parent first, bounds."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from relay.embedded.sample import PRODUCER_URI, SCHEMA_URL, spark_run
from relay.events import LineageEvent, SourceRef
from relay.stages.consolidate import (
    AFTER_TERMINAL,
    MAX_OPEN_RUNS,
    RUN_TTL,
    Drop,
    Expired,
    Forward,
    Release,
    RunConsolidator,
)
from relay.stages.decode import decode_record
from relay.stages.start_gate import SYNTHESIZED_START_FACET
from tests.support.spec import validator

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
FACET_URL = "https://openlineage.io/spec/facets/1-0-0/Example.json#/$defs/Example"
AIRFLOW = "airflow-prod"
_offsets = iter(range(1 << 30))


def run_id(n: int) -> str:
    return str(uuid.UUID(int=n, version=4))


def decoded(doc: dict) -> LineageEvent:
    event = decode_record(orjson.dumps(doc), max_bytes=1 << 22, source=SourceRef("openlineage", 0, next(_offsets)))
    assert isinstance(event, LineageEvent), event
    return event


def spark(n: int, *, running: int = 2, fail: bool = False, parent: tuple | None = None) -> list[LineageEvent]:
    """START, ``running`` RUNNINGs, then COMPLETE (or FAIL) of Spark run ``n``."""
    docs = spark_run("spark-prod", f"orders_etl.insert.t{n}_daily", run_id=run_id(n), start=T0,
                     rng=random.Random(n), with_running=running, fail=fail, parent=parent)
    return [decoded(doc) for doc in docs]


def airflow(n: int, event_type: str, second: float = 0.0) -> LineageEvent:
    """An event of an Airflow task run, the parent of Spark runs."""
    return decoded({
        "eventTime": (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z"),
        "producer": "https://github.com/apache/airflow/tree/providers-openlineage/1.8.0",
        "schemaURL": SCHEMA_URL, "eventType": event_type,
        "run": {"runId": run_id(n), "facets": {}},
        "job": {"namespace": AIRFLOW, "name": f"orders_dag.task{n}", "facets": {}},
        "inputs": [], "outputs": [],
    })


def parent_of(n: int) -> tuple[str, str, str]:
    return (AIRFLOW, f"orders_dag.task{n}", run_id(n))


def with_facets(event: LineageEvent, **run_facets) -> LineageEvent:
    doc = orjson.loads(event.body)
    doc["run"]["facets"].update(
        {name: {"_producer": PRODUCER_URI, "_schemaURL": FACET_URL, **value} for name, value in run_facets.items()})
    return decoded(doc)


def consolidator(mode: str = "consolidated", **overrides) -> RunConsolidator:
    options = dict(settle_s=2.0, coalesce_window_s=10.0, missing_start_timeout_s=30.0, parent_hold_s=5.0,
                   max_open_runs=100, run_ttl_s=3600.0, max_finished_runs=100, finished_ttl_s=600.0)
    options.update(overrides)
    return RunConsolidator(mode=mode, **options)


class Collector:
    """Feeds a consolidator and checks, on every call, that each offered event is answered
    exactly once (Forward as itself, Release or Drop) and that built events are valid."""

    def __init__(self, consolidator: RunConsolidator) -> None:
        self.c = consolidator
        self.sent: list[LineageEvent] = []
        self.actions: list = []

    def offer(self, event: LineageEvent, now: float) -> list:
        actions = self.c.offer(event, now)
        answers = [a for a in actions if isinstance(a, Release) or
                   (isinstance(a, (Forward, Drop)) and a.event.source is not None)]
        assert [a.event for a in answers] == [event], actions
        return self._record(actions)

    def tick(self, now: float) -> list:
        return self._record(self.c.tick(now))

    def _record(self, actions: list) -> list:
        for action in actions:
            if isinstance(action, Forward):
                if action.event.source is None:  # built by the consolidator
                    assert action.event.ticket is None
                    validator().validate(action.event.doc)
                self.sent.append(action.event)
        self.actions += actions
        return actions

    def types(self, run: int | None = None) -> list[str]:
        return [e.event_type for e in self.sent if run is None or e.run_id == run_id(run)]


# --- passthrough ------------------------------------------------------------------------


def test_passthrough_forwards_everything_at_once():
    c = Collector(consolidator("passthrough"))
    for event in spark(1):
        assert c.offer(event, 0.0) == [Forward(event)]
    assert c.tick(1e9) == [] and c.c.open_runs == 0


# --- consolidated -----------------------------------------------------------------------


def test_consolidated_sends_start_and_one_terminal_with_the_union():
    events = spark(1, running=3)
    c = Collector(consolidator())
    assert c.offer(events[0], 0.0) == [Forward(events[0])]
    for event in events[1:]:
        assert c.offer(event, 1.0) == [Release(event)]
    assert c.tick(2.9) == []  # settle window not over
    [terminal] = [a.event for a in c.tick(3.0)]
    assert c.types() == ["START", "COMPLETE"]
    doc = terminal.doc
    assert doc["eventTime"] == events[-1].doc["eventTime"] and doc["producer"] == events[-1].doc["producer"]
    assert doc["inputs"] == events[0].doc["inputs"]  # inputs only the START named
    assert doc["outputs"] == events[-1].doc["outputs"]
    assert "spark_properties" in doc["run"]["facets"]
    assert c.c.open_runs == 0 and c.c.state_bytes == 0


def test_settle_window_absorbs_a_second_complete_and_late_facets():
    events = spark(1, running=0)
    start, complete = events
    second = orjson.loads(complete.body)
    second["eventTime"] = (T0 + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    second["outputs"][0]["name"] = "warehouse/second_output"
    c = Collector(consolidator())
    c.offer(start, 0.0)
    c.offer(complete, 10.0)
    c.offer(decoded(second), 11.0)
    c.offer(with_facets(decoded({**orjson.loads(complete.body), "eventType": "OTHER"}), late={"n": 1}), 11.5)
    c.tick(12.0)
    assert c.types() == ["START", "COMPLETE"]
    terminal = c.sent[-1].doc
    assert [d["name"] for d in terminal["outputs"]] == [complete.doc["outputs"][0]["name"], "warehouse/second_output"]
    assert terminal["eventTime"] == second["eventTime"]
    assert terminal["run"]["facets"]["late"]["n"] == 1


def test_events_of_a_finished_run_are_dropped_and_do_not_reopen_it():
    events = spark(1)
    c = Collector(consolidator())
    for event in events:
        c.offer(event, 0.0)
    c.tick(5.0)
    late = events[1]
    assert c.offer(late, 6.0) == [Drop(late, AFTER_TERMINAL)]
    assert c.tick(1000.0) == [] and c.types() == ["START", "COMPLETE"]


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_an_other_after_the_terminal_is_dropped_in_consolidated_mode_and_forwarded_in_coalesce(mode):
    start, _, complete = spark(1, running=1)
    c = Collector(consolidator(mode, settle_s=1.0))
    c.offer(start, 0.0)
    c.offer(complete, 1.0)
    c.tick(2.0)
    assert c.c.finished(run_id(1))
    other = at(complete, 5.0, "OTHER")
    expected = [Drop(other, "after_terminal")] if mode == "consolidated" else [Forward(other)]
    assert c.offer(other, 5.0) == expected


def test_a_terminal_that_overtakes_its_start_still_goes_after_it():
    start, running, complete = spark(1, running=1)
    c = Collector(consolidator())
    c.offer(complete, 0.0)
    c.tick(5.0)  # settled, but START not decided yet
    assert c.sent == []
    c.offer(running, 6.0)
    assert c.offer(start, 7.0)[0] == Forward(start)
    assert c.types() == ["START", "COMPLETE"]
    assert c.sent[-1].doc["inputs"] == start.doc["inputs"]


def test_many_interleaved_runs_give_exactly_start_and_one_terminal_each():
    runs = {n: spark(n, running=n % 4, fail=n % 5 == 0) for n in range(1, 21)}
    stream = sorted((e for events in runs.values() for e in events), key=lambda e: (e.event_time, e.run_id))
    c = Collector(consolidator())
    for i, event in enumerate(stream):
        c.offer(event, i * 0.1)
        c.tick(i * 0.1)
    c.tick(1000.0)
    for n, events in runs.items():
        assert c.types(n) == ["START", events[-1].event_type]
        assert c.sent[[e.run_id for e in c.sent].index(run_id(n))] is events[0]
    assert c.c.open_runs == 0


# --- coalesce ---------------------------------------------------------------------------


def test_coalesce_merges_runnings_within_the_window():
    start, *running, complete = spark(1, running=3)
    tagged = [with_facets(event, progress={"step": i}) for i, event in enumerate(running)]
    c = Collector(consolidator("coalesce", coalesce_window_s=10.0))
    assert c.offer(start, 0.0) == [Forward(start)]
    for i, event in enumerate(tagged):
        assert c.offer(event, 1.0 + i) == [Release(event)]
    assert c.tick(10.9) == []
    [merged] = c.tick(11.0)
    assert merged.event.event_type == "RUNNING"
    assert merged.event.doc["run"]["facets"]["progress"] == {**tagged[-1].doc["run"]["facets"]["progress"]}
    assert merged.event.doc["eventTime"] == running[-1].doc["eventTime"]
    assert c.offer(complete, 12.0) == [Forward(complete)]
    assert c.types() == ["START", "RUNNING", "COMPLETE"]


def test_coalesce_emits_the_pending_running_just_before_the_terminal():
    start, r1, r2, complete = spark(1, running=2)
    c = Collector(consolidator("coalesce"))
    c.offer(start, 0.0)
    c.offer(r1, 1.0)
    c.offer(r2, 2.0)
    actions = c.offer(complete, 3.0)
    assert [type(a) for a in actions] == [Forward, Forward] and actions[1] == Forward(complete)
    assert c.types() == ["START", "RUNNING", "COMPLETE"]
    assert c.offer(r1, 4.0) == [Drop(r1, AFTER_TERMINAL)]  # nothing but OTHER after the terminal
    other = decoded({**orjson.loads(r1.body), "eventType": "OTHER"})
    assert c.offer(other, 4.5) == [Forward(other)]
    assert c.c.open_runs == 0


def at(event: LineageEvent, second: float, event_type: str | None = None) -> LineageEvent:
    """``event`` with eventTime ``T0 + second`` (and another ``eventType``)."""
    doc = orjson.loads(event.body)
    doc["eventTime"] = (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")
    if event_type is not None:
        doc["eventType"] = event_type
    return decoded(doc)


@pytest.mark.parametrize("decided", ["real", "synthesized", "expired"])
def test_coalesce_replays_held_events_with_nothing_but_other_after_the_first_terminal(decided):
    start, running, complete = spark(1, running=1)
    held = [at(complete, 10), at(running, 12), at(complete, 11), at(running, 13, "OTHER")]
    c = Collector(consolidator("coalesce", missing_start_timeout_s=500.0 if decided == "expired" else 30.0,
                               run_ttl_s=60.0))
    for i, event in enumerate(held):
        assert c.offer(event, float(i)) == [Release(event)]  # before their run's START
    if decided == "real":
        c.offer(start, 5.0)
    else:
        c.tick(30.0 if decided == "synthesized" else 100.0)
    assert c.types() == ["START", "COMPLETE", "OTHER"]
    assert c.sent[1].doc == held[0].doc and c.sent[2].doc == held[3].doc
    drops = [a for a in c.actions if isinstance(a, Drop)]
    assert [(d.reason, d.event.doc) for d in drops] == [(AFTER_TERMINAL, held[2].doc), (AFTER_TERMINAL, held[1].doc)]
    for drop in drops:
        drop.event.ticket.release()  # what a lane does with a Drop; the capture settled the real one
    assert c.c.open_runs == 0 and c.c.runs_expired == (decided == "expired")


@pytest.mark.parametrize("decided", ["real", "synthesized", "skipped"])
def test_coalesce_merges_a_start_after_the_runs_start_into_the_running(decided):
    start, running, complete = spark(1, running=1)
    late_start = with_facets(start, lateStart={"n": 1})
    c = Collector(consolidator("coalesce", missing_start_timeout_s=30.0,
                               on_missing_start="forward" if decided == "skipped" else "synthesize"))
    if decided == "real":
        c.offer(start, 0.0)
    else:
        c.offer(running, 0.0)
        c.tick(30.0)  # START synthesized, or the run goes on without one
    if decided == "skipped":  # the run's only START: it goes on as itself
        assert c.offer(start, 31.0) == [Forward(start)]
    assert c.offer(late_start, 32.0) == [Release(late_start)]
    c.offer(complete, 33.0)
    assert c.types() == ["START", "RUNNING", "COMPLETE"]
    assert c.sent[1].doc["run"]["facets"]["lateStart"]["n"] == 1  # its facets still went on


def test_coalesce_a_second_start_held_before_the_start_decision_goes_into_the_running_not_out_as_a_start():
    start = spark(1, running=0, parent=parent_of(9))[0]  # its parent never appears
    again = with_facets(at(start, 1.0), retried={"attempt": 2})
    c = Collector(consolidator("coalesce", parent_hold_s=5.0, coalesce_window_s=10.0))
    assert c.offer(start, 0.0) == [Release(start)]
    assert c.offer(again, 1.0) == [Release(again)]
    c.tick(5.0)
    assert c.types() == ["START"] and c.sent[0].doc == start.doc
    c.tick(15.0)
    assert c.types() == ["START", "RUNNING"]
    assert c.sent[1].doc["run"]["facets"]["retried"]["attempt"] == 2


# --- missing START ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_missing_start_is_synthesized_from_the_earliest_information(mode):
    start, running, fail = spark(1, running=1, fail=True)
    c = Collector(consolidator(mode, missing_start_timeout_s=30.0))
    c.offer(fail, 0.0)
    c.offer(running, 1.0)
    assert c.tick(29.9) == []
    c.tick(30.0)
    assert c.types() == (["START", "FAIL"] if mode == "consolidated" else ["START", "RUNNING", "FAIL"])
    synthesized = c.sent[0].doc
    assert synthesized["eventTime"] == running.doc["eventTime"]  # the earliest seen, not the first to arrive
    assert synthesized["job"]["name"] == start.doc["job"]["name"]
    assert synthesized["inputs"] == start.doc["inputs"] and synthesized["outputs"] == []
    facets = synthesized["run"]["facets"]
    assert "errorMessage" not in facets and "processing_engine" in facets
    marker = facets[SYNTHESIZED_START_FACET]
    assert marker["_producer"] == "https://github.com/lineage-relay/lineage-relay"
    assert marker["_schemaURL"].endswith("SynthesizedStartRunFacet.json#/$defs/SynthesizedStartRunFacet")
    assert c.c.starts_synthesized == 1
    assert c.offer(start, 40.0) in ([Drop(start, AFTER_TERMINAL)], [Forward(start)])  # run already finished


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_missing_start_forward_policy_sends_the_run_without_a_start(mode):
    _, running, complete = spark(1, running=1)
    c = Collector(consolidator(mode, on_missing_start="forward"))
    c.offer(running, 0.0)
    c.offer(complete, 1.0)
    c.tick(30.0)
    assert c.types() == (["COMPLETE"] if mode == "consolidated" else ["RUNNING", "COMPLETE"])
    assert c.c.starts_synthesized == 0
    if mode == "coalesce":  # held events go out as they came in
        assert [e.doc for e in c.sent] == [running.doc, complete.doc]


# --- parent first -----------------------------------------------------------------------


def test_a_child_start_waits_for_its_parents_start():
    child = spark(2, running=0, parent=parent_of(1))
    c = Collector(consolidator())
    assert c.offer(child[0], 0.0) == [Release(child[0])]  # parent not seen yet
    c.offer(child[1], 0.5)
    c.tick(3.0)
    assert c.sent == []
    actions = c.offer(parent_start := airflow(1, "START"), 4.0)
    assert [a.event.run_id for a in actions] == [run_id(1), run_id(2), run_id(2)]
    assert actions[0] == Forward(parent_start)
    assert [e.event_type for e in c.sent] == ["START", "START", "COMPLETE"]
    assert c.sent[1].doc == child[0].doc


def test_a_child_waits_for_a_seen_parent_until_its_start_is_synthesized():
    child = spark(2, running=0, parent=parent_of(1))
    c = Collector(consolidator(parent_hold_s=5.0, missing_start_timeout_s=30.0))
    c.offer(airflow(1, "RUNNING"), 0.0)  # the parent is known, its START is not
    c.offer(child[0], 1.0)
    c.tick(10.0)  # longer than parent_hold_s: the parent was seen, so the child keeps waiting
    assert c.sent == []
    c.tick(30.0)
    assert [(e.run_id, e.event_type) for e in c.sent][:2] == [(run_id(1), "START"), (run_id(2), "START")]
    assert SYNTHESIZED_START_FACET in c.sent[0].doc["run"]["facets"]


def test_a_parent_that_never_appears_delays_the_child_only_by_parent_hold_s():
    child = spark(2, running=0, parent=parent_of(1))
    c = Collector(consolidator(parent_hold_s=5.0))
    c.offer(child[0], 0.0)
    assert c.tick(4.9) == []
    c.tick(5.0)
    assert c.types() == ["START"] and c.sent[0].doc == child[0].doc


def test_a_child_of_a_running_parent_starts_at_once():
    c = Collector(consolidator())
    c.offer(airflow(1, "START"), 0.0)
    child = spark(2, running=0, parent=parent_of(1))
    assert c.offer(child[0], 1.0) == [Forward(child[0])]


# --- bounds and expiry ------------------------------------------------------------------


def test_max_open_runs_expires_the_least_recently_active_run_and_flushes_it():
    c = Collector(consolidator(max_open_runs=2))
    runs = {n: spark(n, running=1) for n in (1, 2, 3)}
    c.offer(runs[1][0], 0.0)
    c.offer(runs[1][1], 0.5)  # folded in, not yet sent
    c.offer(runs[2][0], 1.0)
    actions = c.offer(runs[3][0], 2.0)
    expired = [a for a in actions if isinstance(a, Expired)]
    assert [(e.run_id, e.reason) for e in expired] == [(run_id(1), MAX_OPEN_RUNS)]
    assert c.c.runs_expired == 1 and c.c.open_runs == 2
    assert c.types(1) == ["START", "RUNNING"]  # what was folded in is not lost
    # The expired run's COMPLETE still arrives after it, without a second START.
    c.offer(runs[1][2], 3.0)
    c.tick(10.0)
    assert c.types(1) == ["START", "RUNNING", "COMPLETE"]


def test_an_idle_run_expires_after_run_ttl_s_with_a_start_first():
    _, running, _ = spark(1, running=1)
    c = Collector(consolidator(run_ttl_s=20.0, missing_start_timeout_s=60.0))
    c.offer(running, 0.0)
    actions = c.tick(20.0)
    assert isinstance(actions[0], Expired) and actions[0].reason == RUN_TTL
    assert c.types() == ["START", "RUNNING"] and c.c.runs_expired == 1
    assert c.sent[0].doc["run"]["facets"][SYNTHESIZED_START_FACET]["reason"] == RUN_TTL


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_a_run_that_said_nothing_since_its_start_expires_without_an_empty_running(mode):
    start = spark(1)[0]
    c = Collector(consolidator(mode, run_ttl_s=20.0))
    assert c.offer(start, 0.0) == [Forward(start)]
    actions = c.tick(20.0)
    assert [type(a) for a in actions] == [Expired] and actions[0].reason == RUN_TTL
    assert c.types() == ["START"]


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_an_expiring_run_sends_its_real_start_held_for_its_parent_under_the_forward_policy(mode):
    start = spark(1, running=0, parent=parent_of(9))[0]  # its parent never appears
    c = Collector(consolidator(mode, on_missing_start="forward", parent_hold_s=100.0, run_ttl_s=10.0))
    assert c.offer(start, 0.0) == [Release(start)]
    actions = c.tick(10.0)
    assert isinstance(actions[0], Expired) and actions[0].reason == RUN_TTL
    assert c.types() == ["START"] and c.sent[0].doc == start.doc
    assert c.c.starts_synthesized == 0


def test_memory_stays_flat_over_many_finished_runs():
    c = Collector(consolidator(max_finished_runs=10, finished_ttl_s=60.0))
    for n in range(1, 101):
        for event in spark(n, running=1):
            c.offer(event, float(n))
        c.tick(n + 3.0)
    assert c.c.open_runs == 0 and c.c.finished_runs == 10
    c.tick(1000.0)
    assert c.c.finished_runs == 0


# --- persistence ------------------------------------------------------------------------


def test_state_round_trip_through_json_gives_identical_behaviour():
    runs = [spark(1, running=3), spark(2, running=2, parent=parent_of(9)), spark(3, running=2, fail=True)]
    # Out of order on purpose: run 3's FAIL before its START, run 2's START before its parent's.
    stream = [runs[0][1], runs[1][1], runs[2][1], runs[2][-1], runs[0][2], runs[1][2], runs[2][2],
              runs[2][0], runs[0][0], runs[0][3], runs[1][0], airflow(9, "START"), runs[0][-1], runs[1][-1]]
    run_ids = [run_id(n) for n in (1, 2, 3, 9)]

    def replay(mode: str, restart_at: int | None) -> list[tuple]:
        c = consolidator(mode, settle_s=1.0, coalesce_window_s=1.5, parent_hold_s=2.0)
        out = []
        for i, event in enumerate(stream):
            if i == restart_at:
                states = {rid: orjson.dumps(c.to_state(rid)) for rid in run_ids}
                c = consolidator(mode, settle_s=1.0, coalesce_window_s=1.5, parent_hold_s=2.0)
                for rid, blob in states.items():
                    if blob != b"null":
                        c.restore(rid, orjson.loads(blob))
            out += c.offer(event, i * 0.7) + c.tick(i * 0.7 + 0.3)
        out += c.tick(100.0)
        return [(type(a).__name__, orjson.loads(a.event.body) if hasattr(a, "event") else a) for a in out]

    for mode in ("consolidated", "coalesce"):
        expected = replay(mode, None)
        for restart_at in range(len(stream)):
            assert replay(mode, restart_at) == expected, (mode, restart_at)
        sent = [(doc["run"]["runId"], doc["eventType"]) for kind, doc in expected if kind == "Forward"]
        starts = [rid for rid, event_type in sent if event_type == "START"]
        assert starts == [run_id(3), run_id(1), run_id(9), run_id(2)]  # run 2 waited for its parent 9
        assert len([rid for rid, event_type in sent if event_type in ("COMPLETE", "FAIL")]) == 3


def test_restore_with_now_shifts_the_runs_timers():
    start, running, _ = spark(1, running=1)
    c = consolidator("coalesce", coalesce_window_s=10.0)
    c.offer(start, 1000.0)
    c.offer(running, 1000.0)
    state = orjson.loads(orjson.dumps(c.to_state(run_id(1))))
    fresh = consolidator("coalesce", coalesce_window_s=10.0)
    fresh.restore(run_id(1), state, now=5.0)  # a new process whose clock starts near zero
    assert fresh.tick(14.9) == []
    assert [a.event.event_type for a in fresh.tick(15.0)] == ["RUNNING"]


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_a_restored_finished_run_still_drops_its_late_events(mode):
    events = spark(1, running=1)
    c = consolidator(mode)
    for event in events:
        c.offer(event, 0.0)
    c.tick(5.0)
    state = orjson.loads(orjson.dumps(c.to_state(run_id(1))))
    assert state["closed"] == "finished"
    fresh = Collector(consolidator(mode, finished_ttl_s=60.0))
    fresh.c.restore(run_id(1), state, now=100.0)
    assert fresh.offer(events[0], 101.0) == [Drop(events[0], AFTER_TERMINAL)]  # no second START
    fresh.tick(159.0)
    assert fresh.c.to_state(run_id(1)) is not None
    fresh.tick(161.0)  # remembered for finished_ttl_s from the restore
    assert fresh.c.to_state(run_id(1)) is None and fresh.sent == []


def test_restore_refuses_a_state_from_another_mode():
    c = consolidator("consolidated")
    c.offer(spark(1)[0], 0.0)
    with pytest.raises(ValueError, match="mode"):
        consolidator("coalesce").restore(run_id(1), orjson.loads(orjson.dumps(c.to_state(run_id(1)))))
    assert c.to_state(run_id(2)) is None


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="settle_s"):
        consolidator(settle_s=-1)
    with pytest.raises(ValueError, match="max_open_runs"):
        consolidator(max_open_runs=0)
    with pytest.raises(ValueError, match="mode"):
        consolidator("batch")


# --- invariants over random traffic -------------------------------------------------------


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_keeps_the_invariants(mode, seed):
    """Shuffled runs with parents (some missing, one cycle), duplicates, tight bounds:
    every event is answered once, a run sends at most one START and one terminal and
    nothing but OTHER after it, and in the end nothing is left open."""
    rng = random.Random(seed)
    events: list[LineageEvent] = []
    for n in range(1, 25):
        parent = parent_of(rng.choice([n - 1, 100 + n])) if n > 1 and rng.random() < 0.5 else None
        events += spark(n, running=rng.randint(0, 3), fail=rng.random() < 0.2, parent=parent)
        if parent is not None and parent[2] == run_id(n - 1):
            events.append(airflow(n - 1, "OTHER"))  # the parent run id shows up as a run of its own
    cycle_a, cycle_b = spark(200, running=0, parent=parent_of(201)), spark(201, running=0, parent=parent_of(200))
    events += cycle_a + cycle_b
    events += rng.sample(events, 10)  # redeliveries
    rng.shuffle(events)
    policy = rng.choice(["synthesize", "forward"])
    c = Collector(consolidator(mode, max_open_runs=8, run_ttl_s=15.0, missing_start_timeout_s=6.0,
                               parent_hold_s=2.0, settle_s=1.0, coalesce_window_s=3.0, on_missing_start=policy))
    now = 0.0
    for event in events:
        now += rng.random()
        c.offer(event, now)
        c.tick(now)
    c.tick(now + 1000.0)
    assert c.c.open_runs == 0 and not c.c._gate.waiting
    by_run: dict[str, list[str]] = {}
    for event in c.sent:
        by_run.setdefault(event.run_id, []).append(event.event_type)
    assert len(by_run) >= 26
    for types in by_run.values():
        if policy == "synthesize":
            assert types[0] == "START", types
        assert types.count("START") <= 1, types
        terminals = [i for i, t in enumerate(types) if t in ("COMPLETE", "FAIL", "ABORT")]
        assert len(terminals) <= 1, types
        if terminals:
            assert set(types[terminals[0] + 1:]) <= {"OTHER"}, types
        if mode == "consolidated":
            assert types.count("RUNNING") <= 1 + c.c.runs_expired
    expired = [a for a in c.actions if isinstance(a, Expired)]
    assert len(expired) == c.c.runs_expired
