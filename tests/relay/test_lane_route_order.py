"""A route that leaves a run's START out (``event_types: [COMPLETE]``, as the README
suggests for OpenMetadata): the run's routed events must not wait ``hold_timeout_s`` for a
START that never comes to this collector, nor be dead-lettered as ``hold_timeout``."""

from __future__ import annotations

import asyncio

from tests.relay.test_lane import Collector, Relay, event, lane

COMPLETE_ONLY = {"include": [{"event_types": ["COMPLETE"]}]}


async def deliveries(collector: Collector, count: int) -> list[tuple[str, str]]:
    return [await asyncio.wait_for(collector.got.get(), 5) for _ in range(count)]


async def test_a_complete_whose_start_is_not_routed_goes_at_once():
    collector = Collector()
    relay = Relay(lane(collector, COMPLETE_ONLY))  # on_hold_timeout: dead_letter
    await relay.lane.start()
    try:
        relay.offer(event("START", "a"), 0.0)
        relay.offer(event("RUNNING", "a", second=1), 0.5)
        relay.offer(event("COMPLETE", "a", second=2), 1.0)
        assert relay.lane.held == 0, "the COMPLETE waits for a START this collector never gets"
        assert await deliveries(collector, 1) == [("a", "COMPLETE")]
        assert await relay.lane.drain(5)
        assert relay.committable() == 3
    finally:
        await relay.lane.close()


async def test_a_complete_ahead_of_its_unrouted_start_goes_once_the_start_is_read():
    collector = Collector()
    relay = Relay(lane(collector, COMPLETE_ONLY, terminal_grace_s=1.0))
    await relay.lane.start()
    try:
        relay.offer(event("COMPLETE", "a", second=2), 0.0)  # before its START in the topic
        assert relay.lane.held == 1
        relay.offer(event("START", "a"), 0.5)
        relay.lane.expire(0.5 + 1.0 + 0.01)  # its terminal grace over, far below hold_timeout_s
        assert await deliveries(collector, 1) == [("a", "COMPLETE")]
        assert relay.lane.held == 0
        assert await relay.lane.drain(5)
        assert relay.committable() == 2
    finally:
        await relay.lane.close()


async def test_routed_by_dataset_with_event_types_the_complete_does_not_wait_for_the_start():
    route = {"include": [{"dataset_namespace": "s3://warehouse*", "event_types": ["COMPLETE"]}]}
    collector = Collector()
    relay = Relay(lane(collector, route))
    await relay.lane.start()
    try:
        relay.offer(event("START", "a"), 0.0)  # names no dataset: held until the run is decided
        relay.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=1), 1.0)
        assert await deliveries(collector, 1) == [("a", "COMPLETE")]
        assert relay.lane.held == 0
        assert await relay.lane.drain(5)
        assert relay.committable() == 2
    finally:
        await relay.lane.close()


def test_a_route_without_event_types_tracks_no_run_it_leaves_out():
    """A START left out by a namespace rule is its whole run's: remembering it would only
    push routed runs out of max_tracked_runs."""
    relay = Relay(lane(Collector(), {"include": [{"job_namespace": "other-*"}]}))
    relay.offer(event("START", "a"), 0.0)
    assert relay.lane._sequencer.tracked_runs == 0
