"""RunRouter: route rules naming dataset_namespace decide for a whole run."""

from __future__ import annotations

import uuid

import orjson

from relay.events import LineageEvent
from relay.stages.decisions import Drop, Forward
from relay.stages.decode import decode_record
from relay.stages.route import NOT_ROUTED, UNDECIDED, RouteConfig, Router
from relay.stages.run_route import HELD, RunRouter

WAREHOUSE = {"job_namespace": "spark-*", "dataset_namespace": "s3://warehouse*",
             "event_types": ["START", "COMPLETE", "FAIL"]}  # README's example


def event(event_type: str, run: str, *, outputs: tuple[str, ...] = (), inputs: tuple[str, ...] = (),
          job_namespace: str = "spark-prod", second: int = 0) -> LineageEvent:
    doc = {"eventType": event_type, "eventTime": f"2024-05-01T02:00:{second:02d}Z", "producer": "p",
           "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
           "run": {"runId": str(uuid.uuid5(uuid.NAMESPACE_OID, run))},
           "job": {"namespace": job_namespace, "name": f"app.{run}"},
           "inputs": [{"namespace": ns, "name": "t"} for ns in inputs],
           "outputs": [{"namespace": ns, "name": "t"} for ns in outputs]}
    decoded = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(decoded, LineageEvent), decoded
    decoded.doc = None  # as the relay leaves it once offered: held events are judged without it
    return decoded


def run_router(include=(WAREHOUSE,), exclude=(), *, hold_timeout_s: float = 60, max_held_events: int = 100,
               max_tracked_runs: int = 100, finished_ttl_s: float = 3600) -> RunRouter:
    router = Router(RouteConfig.model_validate({"include": list(include), "exclude": list(exclude)}))
    assert router.by_run
    return RunRouter(router, hold_timeout_s=hold_timeout_s, max_held_events=max_held_events,
                     max_tracked_runs=max_tracked_runs, finished_ttl_s=finished_ttl_s)


def decided(due) -> list[tuple[str, str, str | None]]:
    return [(type(d).__name__, d.event.event_type, getattr(d, "reason", None)) for d in due]


def test_a_start_naming_no_dataset_waits_and_goes_before_the_complete_that_names_one():
    r = run_router()
    start, complete = event("START", "a"), event("COMPLETE", "a", outputs=("s3://warehouse",), second=1)
    assert r.offer(start, 0.0) == (HELD, [])
    assert r.held_count == 1
    verdict, due = r.offer(complete, 1.0)
    assert verdict is None
    assert [type(d) for d in due] == [Forward] and due[0].event is start  # released first
    assert r.held_count == 0


def test_a_routed_run_stays_routed_after_its_terminal():
    r = run_router(include=[{"dataset_namespace": "s3://warehouse*"}])
    assert r.offer(event("START", "a"), 0.0)[0] == HELD
    assert r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=1), 1.0)[0] is None
    # An OTHER after the terminal (the spec allows it) goes too, though it names nothing.
    assert r.offer(event("OTHER", "a", second=2), 2.0) == (None, [])


def test_a_run_that_names_only_other_datasets_is_dropped_whole_at_its_terminal():
    r = run_router()
    start = event("START", "a", inputs=("s3://lake",))
    assert r.offer(start, 0.0) == (HELD, [])
    verdict, due = r.offer(event("COMPLETE", "a", outputs=("s3://lake-curated",), second=1), 1.0)
    assert verdict == NOT_ROUTED
    assert decided(due) == [("Drop", "START", NOT_ROUTED)] and due[0].event is start
    assert r.held_count == 0
    # Its hold ended: a straggler is not held again.
    assert r.offer(event("START", "a"), 2.0) == (NOT_ROUTED, [])


def test_other_job_namespaces_are_never_held_nor_remembered():
    r = run_router()
    assert r.offer(event("START", "a", job_namespace="airflow"), 0.0) == (NOT_ROUTED, [])
    assert r.offer(event("COMPLETE", "a", job_namespace="airflow", outputs=("s3://warehouse",)), 0.0) == \
        (NOT_ROUTED, [])
    assert r.held_count == 0 and r.tracked_runs == 0


def test_the_rules_other_fields_still_apply_per_event():
    r = run_router()
    start = event("START", "a")
    assert r.offer(start, 0.0) == (HELD, [])
    # A RUNNING is not in event_types, so it is not routed (and never held); but what it
    # names is the run's: it routes the START now, and the COMPLETE that names nothing.
    verdict, due = r.offer(event("RUNNING", "a", outputs=("s3://warehouse-2",), second=1), 1.0)
    assert verdict == NOT_ROUTED and [d.event for d in due] == [start]
    assert r.offer(event("COMPLETE", "a", second=2), 2.0) == (None, [])


def test_held_events_go_in_arrival_order_and_runs_do_not_wait_for_each_other():
    r = run_router(include=[{"dataset_namespace": "s3://warehouse*"}])
    a = [event("START", "a"), event("RUNNING", "a", second=1), event("RUNNING", "a", second=2)]
    for i, e in enumerate(a):
        assert r.offer(e, float(i))[0] == HELD
    # Another run is routed at once (its own START names the dataset), held ones untouched.
    assert r.offer(event("START", "b", outputs=("s3://warehouse",)), 3.0) == (None, [])
    assert r.held_count == 3
    verdict, due = r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=3), 4.0)
    assert verdict is None and [d.event for d in due] == a


def test_a_terminal_that_overtakes_its_start_routes_the_start_after_it():
    r = run_router()
    assert r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=1), 0.0) == (None, [])
    assert r.offer(event("START", "a"), 1.0) == (None, [])


def test_a_hold_ends_after_hold_timeout_s_and_the_run_is_not_held_again():
    r = run_router(hold_timeout_s=10)
    start = event("START", "a")
    assert r.offer(start, 0.0)[0] == HELD
    assert r.expire(10.0) == []
    due = r.expire(10.5)
    assert decided(due) == [("Drop", "START", NOT_ROUTED)] and r.held_count == 0
    assert r.offer(event("RUNNING", "a", second=1), 11.0) == (NOT_ROUTED, [])  # no new hold
    # What names the dataset later is still routed (its START is gone: see the README).
    assert r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=2), 12.0) == (None, [])


def test_held_events_are_bounded_oldest_hold_first():
    r = run_router(max_held_events=2)
    a, b, c = event("START", "a"), event("START", "b"), event("START", "c")
    assert r.offer(a, 0.0) == (HELD, [])
    assert r.offer(b, 1.0) == (HELD, [])
    verdict, due = r.offer(c, 2.0)
    assert verdict == HELD and [(type(d), d.event) for d in due] == [(Drop, a)]
    assert r.held_count == 2
    # Its own hold may be the one to go: it is then in due (decided at once).
    one = run_router(include=[{"dataset_namespace": "s3://warehouse*"}], max_held_events=1)
    one.offer(event("RUNNING", "x"), 0.0)
    d = event("START", "d")
    verdict, due = one.offer(event("RUNNING", "x", second=1), 1.0)
    assert verdict == HELD and len(due) == 2 and one.held_count == 0  # x's own hold was the oldest
    assert one.offer(d, 2.0) == (HELD, [])


def test_tracked_runs_are_bounded_and_a_forgotten_runs_held_events_are_dropped():
    r = run_router(max_tracked_runs=2)
    a = event("START", "a")
    r.offer(a, 0.0)
    r.offer(event("START", "b", outputs=("s3://warehouse",)), 1.0)
    verdict, due = r.offer(event("START", "c"), 2.0)
    assert verdict == HELD and [d.event for d in due] == [a] and r.tracked_runs == 2


def test_a_run_is_forgotten_finished_ttl_s_after_its_hold_ended():
    r = run_router(finished_ttl_s=100)
    r.offer(event("START", "a", outputs=("s3://warehouse",)), 0.0)
    r.offer(event("COMPLETE", "a", second=1), 1.0)
    assert r.tracked_runs == 1
    r.expire(100.0)
    assert r.tracked_runs == 1
    r.expire(101.5)
    assert r.tracked_runs == 0


def test_exclude_by_dataset_namespace_excludes_the_rest_of_the_run():
    r = run_router(include=(), exclude=[{"dataset_namespace": "s3://tmp*"}])
    assert r.offer(event("START", "a"), 0.0) == (None, [])  # already gone: nothing named tmp yet
    assert r.offer(event("RUNNING", "a", outputs=("s3://tmp",), second=1), 1.0) == (NOT_ROUTED, [])
    assert r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=2), 2.0) == (NOT_ROUTED, [])
    assert r.offer(event("START", "b"), 3.0) == (None, [])  # other runs are not affected


def test_an_exclusion_found_while_events_are_held_drops_them():
    r = run_router(exclude=[{"dataset_namespace": "s3://warehouse/tmp*"}])
    start = event("START", "a")
    assert r.offer(start, 0.0)[0] == HELD
    verdict, due = r.offer(event("COMPLETE", "a", outputs=("s3://warehouse", "s3://warehouse/tmp"), second=1), 1.0)
    assert verdict == NOT_ROUTED and decided(due) == [("Drop", "START", NOT_ROUTED)]


def test_events_without_a_run_are_judged_alone():
    r = run_router(include=[{"dataset_namespace": "s3://warehouse*"}])
    job = decode_record(orjson.dumps({"eventTime": "2024-05-01T02:00:00Z", "producer": "p",
                                      "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/JobEvent",
                                      "job": {"namespace": "n", "name": "j"}, "inputs": [], "outputs": []}),
                        max_bytes=1 << 20)
    assert r.offer(job, 0.0) == (NOT_ROUTED, [])
    assert r.held_count == 0


def test_discard_takes_held_events_back_undecided():
    r = run_router()
    a1, a2, b = event("START", "a"), event("START", "a", second=1), event("START", "b")
    for e in (a1, a2, b):
        r.offer(e, 0.0)
    assert r.discard(lambda e: e is a1 or e is b) == [a1, b]
    assert r.held_count == 1
    verdict, due = r.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=2), 1.0)
    assert [d.event for d in due] == [a2]
    assert r.expire(1000.0) == []  # b's hold is gone, not timed out


def test_prime_learns_what_the_run_named_before_the_committed_offset():
    r = run_router()
    assert r.prime(event("START", "a", outputs=("s3://warehouse",)), 0.0)
    # Read after the committed offset: routed by what the START named, not held.
    assert r.offer(event("COMPLETE", "a", second=1), 1.0) == (None, [])
    # An undecided START was held, and its offset committed only once decided: taken for
    # routed (its run's ordering learns it began). An undecided terminal was dropped.
    assert r.prime(event("START", "b"), 0.0)
    assert not r.prime(event("COMPLETE", "b", outputs=("s3://lake",), second=1), 0.0)
    assert r.offer(event("RUNNING", "b", second=2), 1.0) == (NOT_ROUTED, [])  # its hold had ended


def test_router_judges_by_what_the_run_named():
    router = Router(RouteConfig.model_validate({"include": [WAREHOUSE]}))
    start, running = event("START", "a"), event("RUNNING", "a")
    complete = event("COMPLETE", "a", outputs=("s3://warehouse",))
    touched = router.learn(complete, 0)
    assert touched and router.learn(start, 0) == 0
    assert router.judge(start, 0) == UNDECIDED and router.judge(start, touched) is None
    assert router.judge(running, touched) == NOT_ROUTED  # event_types still per event
    # accepts is per event (replay, redrive); may_route tells the run search what may have gone.
    assert router.accepts(start) == NOT_ROUTED
    assert router.may_route(start) and router.may_route(complete)
    assert not router.may_route(event("COMPLETE", "a", outputs=("s3://lake",)))
    assert not Router(RouteConfig.model_validate({"include": [{"job_namespace": "spark-*"}]})).by_run


def test_a_run_routed_after_its_hold_timed_out_is_remembered_until_finished_ttl_s_after_its_terminal():
    """Routed "from then on" (README): not forgotten finished_ttl_s after its hold ended
    while it still runs, which held its later events again and dropped its terminal."""
    r = run_router(include=[{"dataset_namespace": "s3://warehouse*"}], hold_timeout_s=60, finished_ttl_s=3600)
    assert r.offer(event("START", "a"), 0.0)[0] == HELD
    assert decided(r.expire(61.0)) == [("Drop", "START", NOT_ROUTED)]
    assert r.offer(event("RUNNING", "a", outputs=("s3://warehouse",), second=1), 120.0) == (None, [])
    assert r.expire(3700.0) == [] and r.tracked_runs == 1
    assert r.offer(event("RUNNING", "a", second=2), 3710.0) == (None, [])
    assert r.offer(event("COMPLETE", "a", second=3), 3720.0) == (None, [])
    r.expire(3720.0 + 3600)
    assert r.tracked_runs == 1
    r.expire(3720.0 + 3601)
    assert r.tracked_runs == 0
    # A run whose hold timed out and that never ends is forgotten by max_tracked_runs alone.
    bounded = run_router(include=[{"dataset_namespace": "s3://warehouse*"}], hold_timeout_s=10, max_tracked_runs=1,
                         finished_ttl_s=5)
    bounded.offer(event("START", "b"), 0.0)
    bounded.expire(100.0)
    assert bounded.tracked_runs == 1
    bounded.offer(event("START", "c"), 101.0)
    assert bounded.tracked_runs == 1 and bounded.offer(event("RUNNING", "b", second=1), 102.0)[0] == HELD
