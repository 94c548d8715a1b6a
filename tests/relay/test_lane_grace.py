"""An early terminal waiting out ``terminal_grace_s`` while more than ``max_tracked_runs``
runs start: its run stays known, so the collector gets one terminal per run and the
partition's commits go on past it."""

from __future__ import annotations

from tests.relay.test_lane import Collector, Relay, event, lane


def delivered(collector: Collector) -> list[tuple[str, str]]:
    got = []
    while not collector.got.empty():
        got.append(collector.got.get_nowait())
    return got


def _early_complete_then_newer_runs(relay: Relay) -> None:
    relay.offer(event("COMPLETE", "a", second=9), 0.0)   # offset 0: before its START, held
    relay.offer(event("START", "a", second=1), 0.1)      # offset 1: the COMPLETE waits out its grace
    for run in ("b", "c", "d"):                          # offsets 2-4: more runs than max_tracked_runs
        relay.offer(event("START", run), 0.2)


async def test_a_run_in_grace_gets_one_terminal_however_many_runs_start_meanwhile():
    """Run a was forgotten for the runs started after it: its FAIL, held as a new run's,
    reached the collector at the hold timeout after its COMPLETE."""
    collector = Collector()
    relay = Relay(lane(collector, {}, max_tracked_runs=3, terminal_grace_s=2.0, hold_timeout_s=30,
                       on_hold_timeout="forward"))
    await relay.lane.start()
    try:
        _early_complete_then_newer_runs(relay)
        relay.offer(event("FAIL", "a", second=10), 0.3)  # offset 5: after the run's terminal
        for now in (3.0, 50.0):
            relay.lane.expire(now)
        assert await relay.lane.drain(5)
        assert [t for run, t in delivered(collector) if run == "a"] == ["START", "COMPLETE"]
        assert relay.committable() == 6 and relay.lane.held == 0
    finally:
        await relay.lane.close()


async def test_a_copy_of_the_start_of_a_run_in_grace_does_not_stop_the_commits():
    """Run a forgotten, its FAIL was held; the producer's retried START (a duplicate)
    released it over the COMPLETE waiting out its grace, which was never settled: the
    partition's commits stopped at offset 0 for good (and backpressure, in time, paused
    every partition)."""
    collector = Collector()
    relay = Relay(lane(collector, {}, max_tracked_runs=3, terminal_grace_s=2.0, hold_timeout_s=30,
                       on_hold_timeout="forward"))
    await relay.lane.start()
    try:
        _early_complete_then_newer_runs(relay)
        relay.offer(event("FAIL", "a", second=10), 0.3)   # offset 5
        relay.offer(event("START", "a", second=1), 0.4)   # offset 6: the producer's retry, a duplicate
        for now in (3.0, 50.0, 100.0):
            relay.lane.expire(now)
        assert await relay.lane.drain(5)
        assert relay.committable() == 7 and relay.lane.held == 0
        assert [t for run, t in delivered(collector) if run == "a"] == ["START", "COMPLETE"]
    finally:
        await relay.lane.close()
