"""A START a collector's route leaves out begins its run only when it is left out by its
event type alone (``event_types: [COMPLETE]``): runs the route leaves out whole are not
tracked, a left-out terminal ends its run (swept by ``finished_ttl_s``), a restart's
look-back and its run search learn such a START, and a revoke takes back what it taught."""

from __future__ import annotations

import asyncio

import orjson

from relay.events import LineageEvent
from relay.stages.decode import decode_record
from tests.relay.test_lane import PART, Collector, Relay, event, lane

COMPLETE_ONLY = {"include": [{"event_types": ["COMPLETE"]}]}
WAREHOUSE_COMPLETES = {"include": [{"dataset_namespace": "s3://warehouse*", "event_types": ["COMPLETE"]}]}


def in_namespace(e: LineageEvent, namespace: str) -> LineageEvent:
    """``e`` sent by a job of ``namespace`` (test_lane's events are all spark-prod's)."""
    doc = orjson.loads(e.body)
    doc["job"]["namespace"] = namespace
    decoded = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(decoded, LineageEvent)
    return decoded


class GatedCollector(Collector):
    """Delivers while its gate is open; a delivery started while it is closed waits."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def deliver(self, body: bytes):
        await self.gate.wait()
        return await super().deliver(body)


async def deliveries(collector: Collector, count: int) -> list[tuple[str, str]]:
    return [await asyncio.wait_for(collector.got.get(), 5) for _ in range(count)]


def test_runs_ending_in_a_left_out_terminal_are_forgotten_after_finished_ttl_s():
    """FAIL under a COMPLETE-only route: each run stayed tracked, open, for ever."""
    relay = Relay(lane(Collector(), COMPLETE_ONLY, finished_ttl_s=10))
    for i in range(50):
        relay.offer(event("START", f"f{i}"), 0.0)
        relay.offer(event("FAIL", f"f{i}", second=1), 0.0)
    relay.lane.expire(11.0)
    assert relay.lane._sequencer.tracked_runs == 0
    assert relay.committable() == 100


def test_runs_the_route_leaves_out_whole_do_not_push_a_routed_run_out():
    """Dev runs (never routed) filled max_tracked_runs: the long prod run was forgotten and
    its COMPLETE held (then dead-lettered as hold_timeout)."""
    for route in ({"include": [{"job_namespace": "prod-*", "event_types": ["COMPLETE"]}]},
                  {"include": [{"job_namespace": "prod-*"}], "exclude": [{"event_types": ["OTHER"]}]}):
        relay = Relay(lane(Collector(), route, max_tracked_runs=100))
        relay.offer(in_namespace(event("START", "long"), "prod-a"), 0.0)
        for i in range(100):
            relay.offer(in_namespace(event("START", f"d{i}"), "dev"), 1.0)
            relay.offer(in_namespace(event("COMPLETE", f"d{i}", second=1), "dev"), 1.0)
        relay.offer(in_namespace(event("COMPLETE", "long", second=5), "prod-a"), 2.0)
        assert relay.lane.held == 0, route
        assert relay.lane._sequencer.tracked_runs == 1, route


def test_a_restart_learns_a_left_out_start_of_a_dataset_routed_run():
    relay = Relay(lane(Collector(), WAREHOUSE_COMPLETES))
    relay.lane.prime(event("START", "a"), 0.0)  # read back: before the committed offset
    relay.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=1), 1.0)
    assert relay.lane.held == 0, "the COMPLETE waits hold_timeout_s for a START read before the restart"


def test_the_run_search_counts_a_start_left_out_by_its_type():
    """The run search (relay.source.run_search) takes a START found further back for a
    lane's when lane.routes() says so: else the run's COMPLETE stayed held."""
    for route in (WAREHOUSE_COMPLETES, COMPLETE_ONLY):
        assert lane(Collector(), route).routes(event("START", "a")), route
    namespaced = lane(Collector(), {"include": [{"job_namespace": "prod-*", "event_types": ["COMPLETE"]}]})
    assert not namespaced.routes(in_namespace(event("START", "a"), "dev"))


async def test_a_revoked_early_terminal_read_again_still_follows_the_runs_other_events():
    """Route leaving START out: the COMPLETE read before its START waits out its grace;
    revoked and read again, the RUNNING was dropped as after_terminal (lost for this
    collector, its offset committed)."""
    collector = Collector()
    relay = Relay(lane(collector, {"exclude": [{"event_types": ["START"]}]}, terminal_grace_s=1.0))
    await relay.lane.start()
    try:
        relay.offer(event("COMPLETE", "a", second=3), 0.0)
        relay.offer(event("START", "a"), 0.0)  # left out: the COMPLETE now waits out its grace
        assert relay.lane.revoke({PART}) == 1
        for e in (event("COMPLETE", "a", second=3), event("START", "a"), event("RUNNING", "a", second=1)):
            relay.offer(e, 5.0)  # read again from the committed offset
        relay.lane.expire(6.5)
        assert await deliveries(collector, 2) == [("a", "RUNNING"), ("a", "COMPLETE")]
    finally:
        await relay.lane.close()


async def test_a_run_ended_by_a_left_out_terminal_gets_back_what_a_revoke_took():
    """START delivered, RUNNING under way, FAIL left out by the route: the revoke took the
    RUNNING back, and read again it was dropped as after_terminal (the left-out FAIL had
    ended the run): lost for this collector, its offset committed."""
    collector = GatedCollector()
    relay = Relay(lane(collector, {"include": [{"event_types": ["START", "RUNNING", "COMPLETE"]}]}))
    await relay.lane.start()
    try:
        relay.offer(event("START", "a"), 0.0)
        assert await deliveries(collector, 1) == [("a", "START")]
        collector.gate.clear()
        relay.offer(event("RUNNING", "a", second=1), 0.1)
        relay.offer(event("FAIL", "a", second=2), 0.2)
        assert relay.lane.revoke({PART}) + relay.lane.abort({PART}) >= 1
        collector.gate.set()
        for e in (event("RUNNING", "a", second=1), event("FAIL", "a", second=2)):
            relay.offer(e, 1.0)  # read again
        assert ("a", "RUNNING") in await deliveries(collector, 1)
    finally:
        await relay.lane.close()


async def test_a_revoked_early_terminal_of_a_run_whose_start_was_delivered_is_not_held_when_read_again():
    """No route. The COMPLETE read before its START, the START delivered, the COMPLETE
    waiting out its grace when the partition was revoked: read again, the START is a
    duplicate and the COMPLETE waited hold_timeout_s for a START the collector already had
    (or was dead-lettered)."""
    collector = Collector()
    relay = Relay(lane(collector, {}, terminal_grace_s=1.0, hold_timeout_s=60))
    await relay.lane.start()
    try:
        relay.offer(event("COMPLETE", "a", second=3), 0.0)
        relay.offer(event("START", "a"), 0.0)
        assert await deliveries(collector, 1) == [("a", "START")]
        assert relay.lane.revoke({PART}) == 1  # the COMPLETE, in its grace
        for e in (event("COMPLETE", "a", second=3), event("START", "a"), event("RUNNING", "a", second=1)):
            relay.offer(e, 5.0)  # read again from the committed offset
        relay.lane.expire(6.5)   # past the COMPLETE's grace, far from hold_timeout_s
        assert await deliveries(collector, 2) == [("a", "RUNNING"), ("a", "COMPLETE")]
        assert relay.lane.held == 0
    finally:
        await relay.lane.close()


async def test_the_run_search_does_not_take_a_run_for_ended_by_a_terminal_the_route_leaves_out():
    """After a restart the run search found the run's START and its FAIL further back; the
    route leaves FAIL out, which does not end the run here (a RUNNING after it still goes).
    The lane counted the FAIL as its own, so the held RUNNING was dropped as after_terminal."""
    collector = Collector()
    relay = Relay(lane(collector, {"include": [{"event_types": ["START", "RUNNING", "COMPLETE"]}]}))
    await relay.lane.start()
    try:
        running = event("RUNNING", "a", second=3)
        relay.offer(running, 0.0)  # its START lies before the committed offset: held
        assert relay.lane.held == 1
        # What the run search (relay.source.run_search) does with a START and a FAIL it found:
        # a lane takes the run for begun or ended when lane.routes() says so.
        began, ended = relay.lane.routes(event("START", "a")), relay.lane.routes(event("FAIL", "a", second=2))
        assert began
        relay.lane.learn_earlier(running.run_id, finished=ended, now=1.0)
        assert await deliveries(collector, 1) == [("a", "RUNNING")]
    finally:
        await relay.lane.close()
