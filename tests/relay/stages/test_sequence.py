"""RunSequencer: START first, one terminal, every event decided exactly once."""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from relay.events import LineageEvent, SourceRef
from relay.stages.decisions import AFTER_TERMINAL, HOLD_OVERFLOW, HOLD_TIMEOUT, DeadLetter, Drop, Forward
from relay.stages.decode import decode_record
from relay.stages.sequence import RunSequencer

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)


def run_id(n: int) -> str:
    return str(uuid.UUID(int=n))


def event(run: int, event_type: str | None, second: float = 0.0, *, partition: int = 0,
          tag: str = "") -> LineageEvent:
    """A RunEvent for run ``run`` with eventTime T0 + ``second``; ``tag`` makes otherwise
    equal events distinct."""
    doc = {
        "eventTime": (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z"),
        "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.20.0/integration/spark",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run_id(run), "facets": {}},
        "job": {"namespace": "spark", "name": f"job{run}", "facets": {"tag": {"v": tag}}},
    }
    if event_type is not None:
        doc["eventType"] = event_type
    result = decode_record(orjson.dumps(doc), max_bytes=1 << 20,
                           source=SourceRef("openlineage", partition, 0))
    assert isinstance(result, LineageEvent), result
    return result


def dataset_event() -> LineageEvent:
    doc = {
        "eventTime": "2024-05-01T10:00:00Z",
        "producer": "https://example.com/catalog",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent",
        "dataset": {"namespace": "s3://lake", "name": "orders"},
    }
    result = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(result, LineageEvent)
    return result


def sequencer(**overrides) -> RunSequencer:
    options = dict(hold_timeout_s=30.0, on_hold_timeout="forward", max_held_events=1000,
                   max_tracked_runs=1000, finished_ttl_s=3600.0, forward_other_after_terminal=False)
    options.update(overrides)
    return RunSequencer(**options)


def forwarded(decisions) -> list[LineageEvent]:
    assert all(isinstance(d, Forward) for d in decisions), decisions
    return [d.event for d in decisions]


# --- basic ordering -------------------------------------------------------------------


def test_events_without_a_run_are_forwarded_at_once():
    seq = sequencer()
    ds = dataset_event()
    assert seq.offer(ds, 0.0) == [Forward(ds)]
    assert seq.held_count == 0


def test_in_order_run_flows_straight_through():
    seq = sequencer()
    start, running, complete = (
        event(1, "START", 0), event(1, "RUNNING", 1), event(1, "COMPLETE", 2))
    for now, e in enumerate((start, running, complete)):
        assert seq.offer(e, float(now)) == [Forward(e)]
    assert seq.held_count == 0


def test_complete_before_start_is_released_after_start():
    seq = sequencer()
    start, complete = event(1, "START", 0), event(1, "COMPLETE", 5)
    assert seq.offer(complete, 0.0) == []
    assert (seq.held_count, seq.held_runs) == (1, 1)
    assert forwarded(seq.offer(start, 1.0)) == [start, complete]
    assert (seq.held_count, seq.held_runs) == (0, 0)


def test_running_and_complete_held_in_reverse_are_released_running_first():
    seq = sequencer()
    start, running, complete = (
        event(1, "START", 0), event(1, "RUNNING", 1), event(1, "COMPLETE", 2))
    assert seq.offer(complete, 0.0) == []
    assert seq.offer(running, 0.1) == []
    assert forwarded(seq.offer(start, 0.2)) == [start, running, complete]


def test_held_non_terminal_events_are_sorted_by_event_time_stably():
    seq = sequencer()
    late, early, early_twin, untyped = (
        event(1, "RUNNING", 9), event(1, "RUNNING", 3), event(1, "OTHER", 3), event(1, None, 5))
    for now, e in enumerate((late, early, early_twin, untyped)):
        assert seq.offer(e, float(now)) == []
    start = event(1, "START", 0)
    assert forwarded(seq.offer(start, 5.0)) == [start, early, early_twin, untyped, late]


def test_only_the_earliest_held_terminal_is_forwarded():
    seq = sequencer()
    fail, complete, start = event(1, "FAIL", 7), event(1, "COMPLETE", 4), event(1, "START", 0)
    seq.offer(fail, 0.0)
    seq.offer(complete, 1.0)
    assert seq.offer(start, 2.0) == [Forward(start), Forward(complete), Drop(fail, AFTER_TERMINAL)]


def test_everything_but_other_after_the_terminal_is_dropped():
    seq = sequencer(forward_other_after_terminal=False)
    seq.offer(event(1, "START", 0), 0.0)
    seq.offer(event(1, "COMPLETE", 9), 1.0)
    for late in (event(1, "RUNNING", 5), event(1, "START", 0, tag="again"),
                 event(1, "FAIL", 10), event(1, "OTHER", 11), event(1, None, 12)):
        assert seq.offer(late, 2.0) == [Drop(late, AFTER_TERMINAL)]


def test_second_start_and_untyped_or_other_events_before_the_terminal_are_forwarded():
    seq = sequencer()
    start, richer_start = event(1, "START", 0), event(1, "START", 0, tag="with facets")
    other, untyped, abort = event(1, "OTHER", 1), event(1, None, 2), event(1, "ABORT", 3)
    for now, e in enumerate((start, richer_start, other, untyped, abort)):
        assert seq.offer(e, float(now)) == [Forward(e)]


def test_runs_are_independent():
    seq = sequencer()
    held = event(1, "COMPLETE", 1)
    assert seq.offer(held, 0.0) == []
    b_start, b_complete = event(2, "START", 0), event(2, "COMPLETE", 1)
    assert seq.offer(b_start, 1.0) == [Forward(b_start)]
    assert seq.offer(b_complete, 2.0) == [Forward(b_complete)]
    assert seq.held_count == 1
    a_start = event(1, "START", 0)
    assert forwarded(seq.offer(a_start, 3.0)) == [a_start, held]


# --- hold timeout ---------------------------------------------------------------------


def test_timeout_forward_releases_in_order_and_then_drops_the_late_start():
    seq = sequencer(hold_timeout_s=30, on_hold_timeout="forward")
    complete, running = event(1, "COMPLETE", 2), event(1, "RUNNING", 1)
    seq.offer(complete, 100.0)
    seq.offer(running, 120.0)
    assert seq.expire(130.0) == []  # held exactly 30 s: not longer than the timeout
    assert forwarded(seq.expire(130.5)) == [running, complete]
    assert seq.held_count == 0
    late_start = event(1, "START", 0)
    assert seq.offer(late_start, 131.0) == [Drop(late_start, AFTER_TERMINAL)]


def test_timeout_forward_without_terminal_lets_later_events_flow():
    seq = sequencer(hold_timeout_s=10, on_hold_timeout="forward")
    running = event(1, "RUNNING", 1)
    seq.offer(running, 0.0)
    assert seq.expire(11.0) == [Forward(running)]
    complete = event(1, "COMPLETE", 2)
    assert seq.offer(complete, 12.0) == [Forward(complete)]


def test_timeout_dead_letter_names_run_and_seconds():
    seq = sequencer(hold_timeout_s=30, on_hold_timeout="dead_letter")
    complete, running = event(1, "COMPLETE", 2), event(1, "RUNNING", 1)
    seq.offer(complete, 0.0)
    seq.offer(running, 5.0)
    decisions = seq.expire(31.0)
    assert [type(d) for d in decisions] == [DeadLetter, DeadLetter]
    assert [d.event for d in decisions] == [complete, running]
    for decision in decisions:
        assert decision.reason == HOLD_TIMEOUT
        assert run_id(1) in decision.detail and "30" in decision.detail
    assert seq.held_count == 0
    # The run was never started: a later START goes through as a new beginning.
    start = event(1, "START", 0)
    assert seq.offer(start, 32.0) == [Forward(start)]


def test_timeout_releases_only_the_runs_that_waited_long_enough():
    seq = sequencer(hold_timeout_s=30, on_hold_timeout="dead_letter")
    old, young = event(1, "COMPLETE", 1), event(2, "COMPLETE", 1)
    seq.offer(old, 0.0)
    seq.offer(young, 20.0)
    assert [d.event for d in seq.expire(31.0)] == [old]
    assert seq.held_runs == 1
    assert [d.event for d in seq.expire(51.0)] == [young]


def test_reasons_are_the_documented_dead_letter_header_and_metric_label_values():
    # The README lists these literals: dlq list/redrive --reason and dashboards match on them.
    timed_out = sequencer(hold_timeout_s=10, on_hold_timeout="dead_letter")
    timed_out.offer(event(1, "COMPLETE", 1), 0.0)
    assert [d.reason for d in timed_out.expire(11.0)] == ["hold_timeout"]
    overflowed = sequencer(max_held_events=1, on_hold_timeout="dead_letter")
    overflowed.offer(event(1, "RUNNING", 1), 0.0)
    assert [d.reason for d in overflowed.offer(event(2, "RUNNING", 1), 1.0)] == ["hold_overflow"]
    finished = sequencer()
    finished.offer(event(1, "START", 0), 0.0)
    finished.offer(event(1, "COMPLETE", 2), 1.0)
    late = event(1, "RUNNING", 1)
    assert finished.offer(late, 2.0) == [Drop(late, "after_terminal")]


# --- bounds ---------------------------------------------------------------------------


def test_overflow_releases_the_earliest_hold_from_that_offer():
    seq = sequencer(max_held_events=3, on_hold_timeout="dead_letter")
    a1, a2, b1, b2 = (event(1, "RUNNING", 1), event(1, "COMPLETE", 2),
                      event(2, "RUNNING", 1), event(2, "COMPLETE", 2))
    assert seq.offer(a1, 0.0) == []
    assert seq.offer(b1, 1.0) == []
    assert seq.offer(a2, 2.0) == []
    decisions = seq.offer(b2, 3.0)
    assert [d.event for d in decisions] == [a1, a2]
    assert {d.reason for d in decisions} == {HOLD_OVERFLOW}
    assert "max_held_events=3" in decisions[0].detail and run_id(1) in decisions[0].detail
    assert (seq.held_count, seq.held_runs) == (2, 1)


def test_overflow_with_forward_policy_forwards_in_order():
    seq = sequencer(max_held_events=2, on_hold_timeout="forward")
    a_complete, a_running = event(1, "COMPLETE", 2), event(1, "RUNNING", 1)
    b_running = event(2, "RUNNING", 1)
    seq.offer(a_complete, 0.0)
    seq.offer(a_running, 1.0)
    assert forwarded(seq.offer(b_running, 2.0)) == [a_running, a_complete]
    assert seq.held_count == 1


def test_overflow_can_release_the_offered_events_own_run():
    seq = sequencer(max_held_events=1, on_hold_timeout="dead_letter")
    first, second = event(1, "RUNNING", 1), event(1, "COMPLETE", 2)
    assert seq.offer(first, 0.0) == []
    decisions = seq.offer(second, 1.0)
    assert [d.event for d in decisions] == [first, second]
    assert seq.held_count == 0


def test_tracked_runs_are_capped_and_never_evict_held_runs():
    seq = sequencer(max_tracked_runs=100, hold_timeout_s=1e9)
    held = event(0, "COMPLETE", 5)
    seq.offer(held, 0.0)
    for n in range(1, 5001):
        start, complete = event(n, "START", 0), event(n, "COMPLETE", 1)
        assert seq.offer(start, float(n)) == [Forward(start)]
        assert seq.offer(complete, float(n)) == [Forward(complete)]
        assert seq.tracked_runs <= 100
    assert seq.held_count == 1
    start = event(0, "START", 0)
    assert forwarded(seq.offer(start, 6000.0)) == [start, held]


def test_finished_runs_are_forgotten_after_finished_ttl():
    seq = sequencer(finished_ttl_s=60, hold_timeout_s=30, on_hold_timeout="dead_letter")
    seq.offer(event(1, "START", 0), 0.0)
    seq.offer(event(1, "COMPLETE", 1), 10.0)
    assert seq.expire(70.0) == []
    late = event(1, "OTHER", 2)
    assert seq.offer(late, 70.0) == [Drop(late, AFTER_TERMINAL)]
    assert seq.tracked_runs == 1
    seq.expire(70.5)
    assert seq.tracked_runs == 0
    # Forgotten: a late event is treated like one of a new run and held.
    later = event(1, "OTHER", 3)
    assert seq.offer(later, 71.0) == []
    assert seq.held_count == 1


# --- discard --------------------------------------------------------------------------


def test_discard_removes_held_events_without_deciding_them():
    seq = sequencer(on_hold_timeout="dead_letter", hold_timeout_s=30)
    a = event(1, "COMPLETE", 2, partition=0)
    b_running = event(2, "RUNNING", 1, partition=1)
    b_complete = event(2, "COMPLETE", 2, partition=1)
    for now, e in enumerate((a, b_running, b_complete)):
        seq.offer(e, float(now))
    removed = seq.discard(lambda e: e.source.partition == 0)
    assert removed == [a]
    assert (seq.held_count, seq.held_runs) == (2, 1)
    a_start = event(1, "START", 0, partition=0)
    assert seq.offer(a_start, 3.0) == [Forward(a_start)]
    b_start = event(2, "START", 0, partition=1)
    assert forwarded(seq.offer(b_start, 4.0)) == [b_start, b_running, b_complete]
    assert seq.expire(1000.0) == []


def test_partial_discard_restarts_the_hold_clock_at_the_oldest_remaining_event():
    seq = sequencer(on_hold_timeout="dead_letter", hold_timeout_s=30)
    first = event(1, "RUNNING", 1, partition=0)
    other_run = event(2, "RUNNING", 1, partition=1)
    second = event(1, "COMPLETE", 2, partition=1)
    seq.offer(first, 0.0)
    seq.offer(other_run, 10.0)
    seq.offer(second, 20.0)
    assert seq.discard(lambda e: e.source.partition == 0) == [first]
    # Run 2's hold (since 10 s) expires before run 1's (now since 20 s).
    assert [d.event for d in seq.expire(45.0)] == [other_run]
    assert [d.event for d in seq.expire(50.5)] == [second]


# --- rollback (forwarded, then taken back on revoke) ------------------------------------


def test_a_terminal_taken_back_reopens_the_run_so_its_reread_events_are_forwarded():
    """START delivered; RUNNING and COMPLETE forwarded but taken back from the delivery
    queue when the partition was lost. Read again, they must be forwarded, not dropped
    as after the terminal."""
    seq = sequencer()
    start, running, complete = event(1, "START", 0), event(1, "RUNNING", 1), event(1, "COMPLETE", 2)
    assert forwarded(seq.offer(start, 0.0) + seq.offer(running, 0.1) + seq.offer(complete, 0.2)) == \
        [start, running, complete]
    seq.rollback([running, complete])
    again_running, again_complete = event(1, "RUNNING", 1), event(1, "COMPLETE", 2)
    assert forwarded(seq.offer(again_running, 5.0) + seq.offer(again_complete, 5.1)) == \
        [again_running, again_complete]
    [late] = seq.offer(event(1, "COMPLETE", 3, tag="late"), 6.0)
    assert isinstance(late, Drop) and late.reason == AFTER_TERMINAL


def test_a_start_taken_back_makes_the_run_begin_afresh():
    """The run's START and COMPLETE were both taken back; the topic holds COMPLETE before
    START. Read again, COMPLETE is held until START comes, so START still goes first."""
    seq = sequencer()
    start, complete = event(1, "START", 0), event(1, "COMPLETE", 2)
    assert forwarded(seq.offer(complete, 0.0) + seq.offer(start, 0.1)) == [start, complete]
    seq.rollback([start, complete])
    again_complete, again_start = event(1, "COMPLETE", 2), event(1, "START", 0)
    assert seq.offer(again_complete, 5.0) == []
    assert forwarded(seq.offer(again_start, 5.1)) == [again_start, again_complete]


def test_rollback_of_events_of_unknown_runs_changes_nothing():
    seq = sequencer()
    start = event(1, "START", 0)
    seq.offer(start, 0.0)
    seq.rollback([event(2, "COMPLETE", 1), dataset_event(), event(1, "RUNNING", 1)])
    assert seq.tracked_runs == 1
    assert forwarded(seq.offer(event(1, "COMPLETE", 2), 1.0))
    assert seq.offer(event(1, "RUNNING", 3), 1.1)[0].reason == AFTER_TERMINAL


# --- construction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, word",
    [
        ({"hold_timeout_s": 0}, "hold_timeout_s"),
        ({"finished_ttl_s": -5}, "finished_ttl_s"),
        ({"max_held_events": 0}, "max_held_events"),
        ({"max_tracked_runs": 2.5}, "max_tracked_runs"),
        ({"on_hold_timeout": "drop"}, "on_hold_timeout"),
    ],
)
def test_constructor_rejects_bad_arguments(override, word):
    with pytest.raises(ValueError, match=word):
        sequencer(**override)


# --- exactly-once property ------------------------------------------------------------


def random_stream(rng: random.Random) -> list[LineageEvent]:
    """Several runs' events (some runs without START, some with two terminals or two
    STARTs) and run-less events, shuffled together."""
    events = []
    for run in range(rng.randint(1, 8)):
        types = ["RUNNING"] * rng.randint(0, 3) + ["OTHER"] * rng.randint(0, 1)
        types += [None] * rng.randint(0, 1)
        types += rng.sample(["COMPLETE", "FAIL", "ABORT"], rng.choice([0, 1, 1, 1, 2]))
        types += ["START"] * rng.choice([0, 1, 1, 1, 1, 2])
        for i, event_type in enumerate(types):
            events.append(event(run, event_type, second=rng.uniform(0, 100),
                                partition=rng.randint(0, 2), tag=str(i)))
    events += [dataset_event() for _ in range(rng.randint(0, 2))]
    rng.shuffle(events)
    return events


CONFIGS = {
    "roomy-forward": dict(hold_timeout_s=1e6, on_hold_timeout="forward"),
    "tight-forward": dict(hold_timeout_s=3.0, on_hold_timeout="forward", max_held_events=3),
    "tight-dead-letter": dict(hold_timeout_s=3.0, on_hold_timeout="dead_letter",
                              max_held_events=3),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_event_is_decided_exactly_once_in_run_order(config):
    options = CONFIGS[config]
    rng = random.Random(f"sequence-{config}")
    for _ in range(300):
        seq = sequencer(**options)
        stream = random_stream(rng)
        decisions, discarded = [], []
        now = 0.0
        for e in stream:
            now += rng.uniform(0, 2)
            decisions += seq.offer(e, now)
            if rng.random() < 0.2:
                decisions += seq.expire(now)
            if rng.random() < 0.03:
                revoked = rng.randint(0, 2)
                discarded += seq.discard(lambda ev: ev.source is not None
                                         and ev.source.partition == revoked)
        decisions += seq.expire(now + 2e6)
        assert seq.held_count == 0 and seq.held_runs == 0

        counts = Counter(id(d.event) for d in decisions) + Counter(id(e) for e in discarded)
        assert counts == Counter(id(e) for e in stream), "each event decided exactly once"

        per_run: dict[str, list] = defaultdict(list)
        for d in decisions:
            if d.event.run_id is None:
                assert isinstance(d, Forward)
            else:
                per_run[d.event.run_id].append(d)
        for run_decisions in per_run.values():
            sent = [d.event for d in run_decisions if isinstance(d, Forward)]
            terminals = [e for e in sent if e.is_terminal]
            assert len(terminals) <= 1, "at most one terminal per run"
            if terminals:
                assert sent[-1] is terminals[0], "nothing forwarded after the terminal"
            for d in run_decisions:
                if isinstance(d, Drop):
                    assert d.reason == AFTER_TERMINAL
                    assert terminals, "a drop only ever follows a forwarded terminal"
            if options["on_hold_timeout"] == "dead_letter" and sent:
                assert sent[0].event_type == "START", "START is forwarded first"
            if config == "roomy-forward":
                # Nothing timed out before the stream ended: every run that has a START
                # forwards it first, and nothing is dead-lettered.
                assert not any(isinstance(d, DeadLetter) for d in run_decisions)
                if any(e.event_type == "START" for e in stream
                       if e.run_id == run_decisions[0].event.run_id
                       and e not in discarded):
                    assert sent[0].event_type == "START"


# -- terminal grace and OTHER after the terminal (added with the relay wiring) -------------

def _grace_sequencer(grace: float, **kw) -> RunSequencer:
    return RunSequencer(hold_timeout_s=60, on_hold_timeout="forward", max_held_events=1000,
                        max_tracked_runs=1000, finished_ttl_s=600, terminal_grace_s=grace, **kw)


def _types(decisions) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.event.event_type) for d in decisions]


def test_early_terminal_waits_out_the_grace_so_stragglers_go_first():
    run = 7
    seq = _grace_sequencer(2.0)
    complete = event(run, "COMPLETE", second=9)
    start = event(run, "START", second=1)
    running = event(run, "RUNNING", second=5)
    assert seq.offer(complete, 0.0) == []
    assert _types(seq.offer(start, 1.0)) == [("Forward", "START")]
    assert _types(seq.offer(running, 1.5)) == [("Forward", "RUNNING")]
    assert seq.expire(2.9) == []
    assert seq.held_count == 1
    assert _types(seq.expire(3.0)) == [("Forward", "COMPLETE")]
    assert _types(seq.offer(event(run, "RUNNING", second=6), 3.1)) == [("Drop", "RUNNING")]


def test_a_terminal_after_start_is_not_delayed():
    run = 7
    seq = _grace_sequencer(2.0)
    seq.offer(event(run, "START", second=1), 0.0)
    assert _types(seq.offer(event(run, "COMPLETE", second=2), 0.1)) == [("Forward", "COMPLETE")]


def test_second_terminal_during_grace_keeps_the_earliest():
    run = 7
    seq = _grace_sequencer(2.0)
    seq.offer(event(run, "FAIL", second=8), 0.0)
    seq.offer(event(run, "START", second=1), 0.5)
    decided = seq.offer(event(run, "COMPLETE", second=7), 1.0)
    assert _types(decided) == [("Drop", "FAIL")]
    assert _types(seq.expire(10.0)) == [("Forward", "COMPLETE")]


def test_grace_terminal_can_be_discarded_on_revoke():
    run = 7
    seq = _grace_sequencer(2.0)
    complete = event(run, "COMPLETE", second=8)
    seq.offer(complete, 0.0)
    seq.offer(event(run, "START", second=1), 0.5)
    assert seq.discard(lambda e: e is complete) == [complete]
    assert seq.held_count == 0 and seq.expire(100.0) == []


def test_other_after_terminal_is_forwarded_unless_disabled():
    run = 7
    for allowed, expected in ((True, "Forward"), (False, "Drop")):
        seq = _grace_sequencer(0.0, forward_other_after_terminal=allowed)
        seq.offer(event(run, "START", second=1), 0.0)
        seq.offer(event(run, "COMPLETE", second=2), 0.0)
        assert _types(seq.offer(event(run, "OTHER", second=3), 0.0)) == [(expected, "OTHER")]


def _early_terminal_in_grace_then_newer_runs(seq: RunSequencer, terminal: LineageEvent) -> None:
    """``terminal`` (run 1) arrives before its START and waits out its 2 s grace, while
    three other runs start: more than max_tracked_runs=3 runs started within the grace."""
    assert seq.offer(terminal, 0.0) == []
    assert _types(seq.offer(event(1, "START", 0), 0.1)) == [("Forward", "START")]
    for run in (2, 3, 4):
        assert _types(seq.offer(event(run, "START", 0), 0.2)) == [("Forward", "START")]


def test_a_run_whose_terminal_waits_out_its_grace_is_not_forgotten_for_newer_runs():
    """Forgotten for runs started after it, run 1's later FAIL was held as a new run's,
    then forwarded at the hold timeout: two terminals for one run."""
    seq = sequencer(terminal_grace_s=2.0, max_tracked_runs=3)
    complete = event(1, "COMPLETE", 10)
    _early_terminal_in_grace_then_newer_runs(seq, complete)
    fail = event(1, "FAIL", 11)
    assert seq.offer(fail, 0.3) == [Drop(fail, AFTER_TERMINAL)]
    assert seq.expire(2.5) == [Forward(complete)]
    assert seq.expire(100.0) == [] and seq.held_count == 0
    # Once its terminal is sent, it is forgotten like any run: the bound holds again.
    seq.offer(event(5, "START", 0), 101.0)
    assert seq.tracked_runs == 3


def test_a_straggler_of_a_run_in_grace_still_goes_before_its_terminal_despite_newer_runs():
    """Forgotten, run 1's RUNNING (what the grace waits for) was held and forwarded at the
    hold timeout, after its COMPLETE."""
    seq = sequencer(terminal_grace_s=2.0, max_tracked_runs=3)
    complete = event(1, "COMPLETE", 10)
    _early_terminal_in_grace_then_newer_runs(seq, complete)
    running = event(1, "RUNNING", 5)
    assert seq.offer(running, 0.3) == [Forward(running)]
    assert seq.expire(2.5) == [Forward(complete)]
    assert seq.expire(100.0) == []


def test_a_copy_of_the_start_of_a_run_in_grace_leaves_its_terminal_to_be_decided():
    """Forgotten, run 1's FAIL was held; a copy of its START (a duplicate: pass_start)
    released it into the grace table over the COMPLETE waiting there, which was never
    decided: its offset, never settled, stopped its partition's commits for good."""
    seq = sequencer(terminal_grace_s=2.0, max_tracked_runs=3)
    complete = event(1, "COMPLETE", 10)
    _early_terminal_in_grace_then_newer_runs(seq, complete)
    fail = event(1, "FAIL", 11)
    decisions = seq.offer(fail, 0.3) + seq.pass_start(run_id(1), 0.4) + seq.expire(2.5) + seq.expire(100.0)
    assert decisions == [Drop(fail, AFTER_TERMINAL), Forward(complete)]
    assert seq.held_count == 0


def test_tracked_runs_exceed_the_cap_only_by_runs_in_grace():
    seq = sequencer(terminal_grace_s=2.0, max_tracked_runs=2)
    for run in range(10):
        seq.offer(event(run, "COMPLETE", 5), 0.0)
        seq.offer(event(run, "START", 0), 0.1)
    for run in range(10, 13):
        assert forwarded(seq.offer(event(run, "START", 0), 0.2))
    assert seq.held_count == 10 and seq.tracked_runs == 10 + 2
    assert len(forwarded(seq.expire(2.1))) == 10
    assert seq.tracked_runs == 2


def test_a_start_taken_back_sends_its_runs_terminal_in_grace_back_to_wait_for_it():
    """The run's START (partition 0) was forwarded, then taken back on revoke; its early
    COMPLETE (partition 1, not revoked) waits out its grace. Sent at the grace's end, it
    finished the run, and the START read again was dropped as after_terminal: never
    delivered, its offset committed."""
    seq = _grace_sequencer(2.0)
    complete, start = event(1, "COMPLETE", 10, partition=1), event(1, "START", 0, partition=0)
    assert seq.offer(complete, 0.0) == [] and seq.offer(start, 0.1) == [Forward(start)]
    seq.rollback([start])
    assert seq.discard(lambda e: e.source.partition == 0) == []
    assert seq.expire(5.0) == [] and seq.held_count == 1
    again = event(1, "START", 0, partition=0)
    assert seq.offer(again, 6.0) == [Forward(again)]
    assert seq.expire(7.9) == []
    assert seq.expire(8.0) == [Forward(complete)]


@pytest.mark.parametrize("max_tracked_runs", [2, 3, 1000])
def test_with_grace_and_few_tracked_runs_every_event_is_decided_once_and_each_run_life_ends_once(max_tracked_runs):
    """Early terminals waiting out their grace, runs forgotten for newer ones, copies of
    STARTs (pass_start), events taken back (rollback, discard). A run's life lasts from
    when the sequencer knows it until it forgets it (a forgotten run's late events are a
    new run's): in a life, one terminal at most and only OTHER after it."""
    rng = random.Random(f"grace-{max_tracked_runs}")
    for _ in range(200):
        seq = sequencer(terminal_grace_s=rng.choice([0.5, 2.0]), max_tracked_runs=max_tracked_runs,
                        hold_timeout_s=rng.choice([1.0, 5.0]), on_hold_timeout=rng.choice(["forward", "dead_letter"]),
                        finished_ttl_s=rng.choice([2.0, 1000.0]), forward_other_after_terminal=True)
        stream = random_stream(rng) + random_stream(rng)
        decided, discarded, under_way = Counter(), Counter(), []
        life: dict[str, list[str]] = {}
        now = 0.0

        def take(decisions):
            for d in decisions:
                decided[id(d.event)] += 1
                if isinstance(d, Forward) and d.event.run_id is not None:
                    sent = life.setdefault(d.event.run_id, [])
                    ended = any(t in ("COMPLETE", "FAIL", "ABORT") for t in sent)
                    assert not ended or d.event.event_type == "OTHER", f"{d.event.event_type} after {sent}"
                    sent.append(d.event.event_type)
                    under_way.append(d.event)
            for run in [r for r in life if r not in seq._runs and r not in seq._holds and r not in seq._grace]:
                del life[run]  # forgotten: its life ended

        for e in stream:
            now += rng.choice([0.0, 0.1, 0.3, 1.0])
            take(seq.offer(e, now))
            if e.run_id is not None and rng.random() < 0.1:
                take(seq.pass_start(e.run_id, now))  # a copy of its START, deduped
            if rng.random() < 0.3:
                take(seq.expire(now))
            if rng.random() < 0.05 and under_way:  # taken back before delivery
                back = under_way[rng.randrange(len(under_way)):]
                del under_way[-len(back):]
                seq.rollback(back)
                for b in back:
                    if b.event_type in life.get(b.run_id, ()):
                        life[b.run_id].remove(b.event_type)
                revoked = rng.randint(0, 2)
                discarded.update(id(x) for x in seq.discard(lambda ev: ev.source.partition == revoked))
                take([])
            elif rng.random() < 0.3:
                under_way.clear()  # delivered
        take(seq.expire(now + 1e4) + seq.expire(now + 2e4))
        assert seq.held_count == 0
        assert decided + discarded == Counter(id(e) for e in stream), "each event decided exactly once"


# -- admit: offer's common case without building decisions ------------------------------

ADMIT_CONFIGS = {
    **CONFIGS,
    "grace": dict(hold_timeout_s=30.0, on_hold_timeout="forward", terminal_grace_s=5.0),
    "few-tracked-runs": dict(hold_timeout_s=30.0, on_hold_timeout="forward", max_tracked_runs=2,
                             finished_ttl_s=4.0, forward_other_after_terminal=True),
}


def _state(seq: RunSequencer) -> tuple:
    return (list(seq._runs.items()), list(seq._finished.items()), seq._held_count,
            [(run, [id(e) for e in hold.events], list(hold.arrivals)) for run, hold in seq._holds.items()],
            [(run, id(terminal), until) for run, (terminal, until) in seq._grace.items()])


@pytest.mark.parametrize("config", list(ADMIT_CONFIGS))
def test_admit_takes_the_common_case_and_otherwise_changes_nothing(config):
    """The lane calls offer only when admit says no, so a no must leave the sequencer as it
    was (offer, which begins with admit, then decides from the same state)."""
    options = ADMIT_CONFIGS[config]
    rng = random.Random(f"admit-{config}")
    admitted = declined = 0
    for _ in range(300):
        seq = sequencer(**options)
        stream = random_stream(rng) + random_stream(rng)  # also runs seen before (tracked, finished)
        now = 0.0
        for e in stream:
            now += rng.uniform(0, 2)
            before = _state(seq)
            if seq.admit(e, now):
                admitted += 1
            else:
                declined += 1
                assert _state(seq) == before, f"admit declined {e.event_type} of run {e.run_id} but changed state"
                seq.offer(e, now)
            if rng.random() < 0.2:
                seq.expire(now)
    assert admitted > 1000 and declined > 100, (admitted, declined)


# --- priming (what came before the committed offset) -----------------------------------


def test_prime_teaches_a_run_s_progress_without_deciding_anything():
    seq = sequencer()
    seq.prime(event(1, "START"), 0.0)          # run 1 began before the committed offset
    seq.prime(event(2, "START"), 0.0)          # run 2 began and ended before it
    seq.prime(event(2, "COMPLETE", 5), 0.0)
    assert seq.held_count == 0
    assert forwarded(seq.offer(event(1, "RUNNING", 1), 1.0))  # not held for a START
    assert forwarded(seq.offer(event(1, "COMPLETE", 2), 1.0))
    late = event(2, "RUNNING", 3)
    assert seq.offer(late, 1.0) == [Drop(late, AFTER_TERMINAL)]
    fresh = event(3, "RUNNING", 1)             # a run it never saw: held as before
    assert seq.offer(fresh, 1.0) == [] and seq.held_count == 1


@pytest.mark.parametrize(("policy", "started"), [("forward", True), ("dead_letter", False)])
def test_prime_counts_a_run_without_its_start_as_started_only_when_holds_are_forwarded(policy, started):
    """Before the committed offset, a RUNNING whose START never came was forwarded at the
    hold timeout (``forward``: the run counts as started) or dead-lettered (not started)."""
    seq = sequencer(on_hold_timeout=policy)
    seq.prime(event(1, "RUNNING", 1), 0.0)
    decisions = seq.offer(event(1, "RUNNING", 2), 1.0)
    assert bool(decisions) is started and seq.held_count == (0 if started else 1)


@pytest.mark.parametrize("policy", ["forward", "dead_letter"])
def test_a_start_the_look_back_reads_releases_a_run_held_here(policy):
    """Cooperative-sticky assignment keeps the holds of partitions already owned: a
    COMPLETE held here (from partition 1) waited hold_timeout_s for a START that the
    look-back of newly assigned partition 0 proves delivered, and was dead-lettered (or
    sent late). It now goes out at the next expire, as learn_earlier releases a hold."""
    seq = sequencer(on_hold_timeout=policy)
    running, complete = event(1, "RUNNING", 3, partition=1), event(1, "COMPLETE", 9, partition=1)
    assert seq.offer(complete, 0.0) == [] and seq.offer(running, 0.0) == []
    seq.prime(event(1, "START", partition=0), 1.0)
    assert forwarded(seq.expire(2.0)) == [running, complete]
    assert seq.held_count == 0 and seq.expire(61.0) == []
    late = event(1, "RUNNING", 10, partition=1)
    assert seq.offer(late, 62.0) == [Drop(late, AFTER_TERMINAL)]


@pytest.mark.parametrize("policy", ["forward", "dead_letter"])
def test_a_running_the_look_back_reads_does_not_release_a_run_held_here(policy):
    """A RUNNING read back (sent at a hold timeout, say) proves neither the START delivered
    nor the run ended: with "forward", the next expire sent the held COMPLETE, and the
    START arriving a moment later was dropped as after_terminal. The hold now waits for it."""
    seq = sequencer(on_hold_timeout=policy, hold_timeout_s=30.0)
    complete = event(1, "COMPLETE", 10, partition=0)
    assert seq.offer(complete, 0.0) == []
    seq.prime(event(1, "RUNNING", 5, partition=1), 1.0)
    assert seq.expire(1.5) == [] and seq.held_count == 1
    start = event(1, "START", 0, partition=2)
    assert forwarded(seq.offer(start, 2.0)) == [start, complete]


def test_a_held_run_the_look_back_shows_ended_has_its_held_events_dropped():
    """The look-back read the run's START and terminal (partition 0): what is held of it
    here came after its terminal."""
    seq = sequencer(on_hold_timeout="dead_letter")
    late = event(1, "RUNNING", 12, partition=1)
    assert seq.offer(late, 0.0) == []
    seq.prime(event(1, "COMPLETE", 9, partition=0), 1.0)  # with dead_letter, ended only once its START is read
    assert seq.expire(2.0) == [] and seq.held_count == 1
    seq.prime(event(1, "START", partition=0), 1.0)
    assert seq.expire(2.0) == [Drop(late, AFTER_TERMINAL)] and seq.held_count == 0


def test_a_held_run_primed_then_started_live_is_decided_once():
    seq = sequencer()
    held = event(1, "COMPLETE", 5)
    assert seq.offer(held, 0.0) == []
    seq.prime(event(1, "START"), 0.0)
    start = event(1, "START", tag="live")  # offered before the next expire
    assert forwarded(seq.offer(start, 1.0)) == [start, held]
    assert seq.expire(2.0) == [] and seq.held_count == 0


@pytest.mark.parametrize("policy", ["forward", "dead_letter"])
def test_prime_a_terminal_before_its_start_in_the_topic_ends_the_run(policy):
    """A COMPLETE ahead of its START in the topic was held, then sent after it: the run
    ended, whatever the hold policy."""
    seq = sequencer(on_hold_timeout=policy)
    seq.prime(event(1, "COMPLETE", 5), 0.0)
    seq.prime(event(1, "START"), 0.0)
    late = event(1, "RUNNING", 3)
    assert seq.offer(late, 1.0) == [Drop(late, AFTER_TERMINAL)]


# --- runs found further back than the look-back (learn_earlier) -------------------------


def test_a_held_run_found_to_have_begun_earlier_is_released_in_order():
    seq = sequencer(terminal_grace_s=2.0)
    complete, running = event(1, "COMPLETE", 9), event(1, "RUNNING", 5)
    assert seq.offer(complete, 0.0) == [] and seq.offer(running, 0.1) == []
    assert [(r, since, first) for r, since, first in seq.held_since()] == [(run_id(1), 0.0, complete)]
    # Its START lay before the committed offset: no grace (nothing of the run is behind it).
    assert forwarded(seq.learn_earlier(run_id(1), finished=False, now=1.0)) == [running, complete]
    assert seq.held_count == 0 and seq.held_since() == []
    late = event(1, "RUNNING", 10)
    assert seq.offer(late, 1.0) == [Drop(late, AFTER_TERMINAL)]


def test_a_held_run_found_to_have_ended_earlier_drops_its_held_events_but_other():
    seq = sequencer(forward_other_after_terminal=True)
    running, other = event(1, "RUNNING", 5), event(1, "OTHER", 6)
    assert seq.offer(running, 0.0) == [] and seq.offer(other, 0.0) == []
    assert seq.learn_earlier(run_id(1), finished=True, now=1.0) == [Drop(running, AFTER_TERMINAL), Forward(other)]
    late = event(1, "COMPLETE", 7)
    assert seq.offer(late, 1.0) == [Drop(late, AFTER_TERMINAL)] and seq.held_count == 0


def test_a_run_found_earlier_whose_terminal_the_look_back_read_has_ended():
    """With ``dead_letter``, the look-back remembers a terminal of a run it did not know:
    the run found further back ended there, and its held events are late."""
    seq = sequencer(on_hold_timeout="dead_letter")
    seq.prime(event(1, "COMPLETE", 8), 0.0)
    late = event(1, "RUNNING", 9)
    assert seq.offer(late, 0.0) == []
    assert seq.learn_earlier(run_id(1), finished=False, now=1.0) == [Drop(late, AFTER_TERMINAL)]


def test_learning_about_a_run_not_held_changes_nothing():
    seq = sequencer()
    assert seq.learn_earlier(run_id(1), finished=True, now=0.0) == []
    assert seq.offer(event(1, "RUNNING", 1), 0.0) == []  # still unknown: held
    assert forwarded(seq.offer(event(2, "START"), 0.0))
    assert seq.learn_earlier(run_id(2), finished=True, now=0.0) == []
    assert forwarded(seq.offer(event(2, "RUNNING", 1), 0.0))  # open, as it was


# --- records `dlq redrive --to-topic` wrote back (redriven) -------------------------------


@pytest.mark.parametrize("policy", ["forward", "dead_letter"])
@pytest.mark.parametrize("event_type", ["COMPLETE", "RUNNING"])
def test_a_redriven_record_of_a_forgotten_run_is_forwarded_not_held_for_its_start(policy, event_type):
    """Its START was forwarded long before (the record was dead-lettered after it): held for
    it, the record was dead-lettered again as hold_timeout (or sent hold_timeout_s late)."""
    seq = sequencer(on_hold_timeout=policy)
    redriven = event(1, event_type, 5)
    assert seq.redriven(redriven, 0.0) == []
    assert forwarded(seq.offer(redriven, 0.0)) == [redriven]
    assert seq.held_count == 0 and seq.expire(100.0) == []


def test_a_redriven_terminal_is_not_dropped_by_a_run_search_finding_its_original():
    """The run search (learn_earlier) finds the run's START and the original COMPLETE the
    redriven record copies (finished): the copy was held, and then dropped as after_terminal."""
    seq = sequencer(on_hold_timeout="dead_letter")
    seq.prime(event(1, "COMPLETE", 5), 0.0)  # the original, read back by the look-back
    redriven = event(1, "COMPLETE", 5)
    assert seq.redriven(redriven, 1.0) == []
    assert forwarded(seq.offer(redriven, 1.0)) == [redriven]
    assert seq.learn_earlier(run_id(1), finished=True, now=2.0) == []


def test_a_redriven_terminal_releases_its_held_run_ahead_of_it():
    seq = sequencer(on_hold_timeout="dead_letter")
    running = event(1, "RUNNING", 3)
    assert seq.offer(running, 0.0) == []
    redriven = event(1, "COMPLETE", 5)
    assert forwarded(seq.redriven(redriven, 1.0)) == [running]
    assert forwarded(seq.offer(redriven, 1.0)) == [redriven] and seq.held_count == 0


def test_a_redriven_terminal_of_a_known_finished_run_opens_it_again_and_a_start_begins_it_again():
    seq = sequencer()
    start, complete = event(1, "START"), event(1, "COMPLETE", 5)
    assert forwarded(seq.offer(start, 0.0)) and forwarded(seq.offer(complete, 0.0))
    assert seq.redriven(complete, 1.0) == []
    assert forwarded(seq.offer(complete, 1.0)) == [complete]
    assert seq.redriven(start, 2.0) == []  # its run begins again: what follows waits for it
    assert forwarded(seq.offer(start, 2.0)) == [start]


@pytest.mark.parametrize("policy", ["forward", "dead_letter"])
def test_a_redriven_record_of_a_held_run_goes_ahead_of_its_held_terminal(policy):
    """redriven() released a held run as learn_earlier does: the held COMPLETE went out and
    ended the run, and the redriven RUNNING offered next was dropped as after_terminal. Now
    the held terminal waits (terminal_grace_s, the next expire at least) behind it."""
    seq = sequencer(on_hold_timeout=policy)
    complete = event(1, "COMPLETE", 10)
    assert seq.offer(complete, 0.0) == []
    redriven = event(1, "RUNNING", 5, tag="redriven")
    assert seq.redriven(redriven, 1.0) == []
    assert forwarded(seq.offer(redriven, 1.0)) == [redriven]
    assert forwarded(seq.expire(1.5)) == [complete] and seq.held_count == 0


def test_a_late_start_of_a_held_run_a_redriven_record_released_is_delivered_before_its_terminal():
    """The START had not gone out (still late): it comes within terminal_grace_s and is
    forwarded ahead of the held COMPLETE, not dropped as after_terminal."""
    seq = sequencer(on_hold_timeout="dead_letter", terminal_grace_s=2.0)
    complete = event(1, "COMPLETE", 10)
    assert seq.offer(complete, 0.0) == []
    redriven = event(1, "RUNNING", 5, tag="redriven")
    out = seq.redriven(redriven, 1.0) + seq.offer(redriven, 1.0)
    start = event(1, "START", 0)
    out += seq.offer(start, 2.0) + seq.expire(3.5)
    assert forwarded(out) == [redriven, start, complete]
