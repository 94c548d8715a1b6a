"""StartGate, through the run consolidator: when a run's START may go, parent first."""

from __future__ import annotations

import pytest

from relay.stages.consolidate import Forward, Release
from tests.relay.stages.test_consolidate import Collector, airflow, consolidator, parent_of, run_id, spark


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_a_child_of_a_finished_parent_starts_at_once(mode):
    c = Collector(consolidator(mode, parent_hold_s=5.0, settle_s=1.0))
    c.offer(airflow(9, "START"), 0.0)
    c.offer(airflow(9, "COMPLETE", 1.0), 1.0)
    c.tick(2.0)
    assert c.c.finished(run_id(9))
    child_start = spark(1, running=0, parent=parent_of(9))[0]
    assert c.offer(child_start, 3.0) == [Forward(child_start)]


def test_a_run_naming_itself_as_parent_does_not_wait_for_itself():
    start = spark(1, running=0, parent=parent_of(1))[0]
    assert start.parent_run_id == start.run_id
    c = Collector(consolidator("coalesce", parent_hold_s=5.0))
    assert c.offer(start, 0.0) == [Forward(start)]


def test_two_runs_naming_each_other_as_parent_start_after_parent_hold_plus_missing_start_timeout():
    c = Collector(consolidator("coalesce", parent_hold_s=5.0, missing_start_timeout_s=30.0))
    one = spark(1, running=0, parent=parent_of(2))[0]
    two = spark(2, running=0, parent=parent_of(1))[0]
    assert c.offer(one, 0.0) == [Release(one)]
    assert c.offer(two, 0.0) == [Release(two)]
    # Each parent is seen and still waiting: parent_hold_s alone does not let either go.
    for now in (5.0, 30.0, 34.9):
        c.tick(now)
    assert c.sent == []
    c.tick(35.0)
    assert sorted((e.run_id, e.event_type) for e in c.sent) == [(run_id(1), "START"), (run_id(2), "START")]
    assert {e.run_id: e.doc for e in c.sent} == {run_id(1): one.doc, run_id(2): two.doc}
