"""KnownRuns, as the run consolidator relies on it: which finished runs are remembered,
and that open runs expire by their own idleness, also after a restore."""

from __future__ import annotations

import orjson

from relay.stages.consolidate import AFTER_TERMINAL, Drop, Expired, RunConsolidator
from tests.relay.stages.test_consolidate import consolidator, run_id, spark


def test_the_oldest_finished_run_is_forgotten_first_and_a_newer_ones_late_event_is_still_dropped():
    c = consolidator("coalesce", max_finished_runs=2)
    runs = {n: spark(n, running=1) for n in (1, 2, 3)}
    for n, (start, _running, complete) in runs.items():
        c.offer(start, float(n))
        c.offer(complete, n + 0.5)
    assert [c.finished(run_id(n)) for n in (1, 2, 3)] == [False, True, True]
    for n in (2, 3):
        late = runs[n][1]
        assert c.offer(late, 10.0) == [Drop(late, AFTER_TERMINAL)]


def restored(c: RunConsolidator, order: list[int], **options) -> RunConsolidator:
    """A new consolidator holding ``c``'s runs, restored in ``order``, read back from JSON."""
    states = {n: orjson.loads(orjson.dumps(c.to_state(run_id(n)))) for n in order}
    fresh = consolidator("coalesce", **options)
    for n in order:
        fresh.restore(run_id(n), states[n])
    return fresh


def test_runs_restored_out_of_touched_order_expire_by_their_own_idleness():
    c = consolidator("coalesce", run_ttl_s=60.0)
    c.offer(spark(1)[0], 50.0)
    c.offer(spark(2)[0], 100.0)
    fresh = restored(c, [2, 1], run_ttl_s=60.0)  # the newer run first
    assert [a.run_id for a in fresh.tick(115.0) if isinstance(a, Expired)] == [run_id(1)]
    assert fresh.tick(159.0) == []
    assert [a.run_id for a in fresh.tick(160.0) if isinstance(a, Expired)] == [run_id(2)]
