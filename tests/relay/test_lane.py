"""CollectorLane with a route by dataset namespace: what it holds keeps its offset
uncommitted, goes on in run order once decided, and is taken back on revoke."""

from __future__ import annotations

import asyncio
import uuid

import orjson

from relay.config import CollectorConfig, PipelineConfig
from relay.events import LineageEvent, SourceRef
from relay.lane import CollectorLane
from relay.metrics import RelayMetrics
from relay.sinks.base import Undeliverable
from relay.source.offsets import OffsetTracker
from relay.stages.decode import decode_record

PART = ("ol", 0)
ROUTE = {"include": [{"job_namespace": "spark-*", "dataset_namespace": "s3://warehouse*"}]}


class Collector:
    """A collector that takes everything, in the order it is handed over."""

    name = "c"

    def __init__(self) -> None:
        self.got: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, body: bytes) -> Undeliverable | None:
        doc = orjson.loads(body)
        self.got.put_nowait((doc["job"]["name"], doc["eventType"]))
        return None


class Relay:
    """What the relay does around a lane: a ticket per record, offered, then its own
    obligation released."""

    def __init__(self, lane: CollectorLane) -> None:
        self.lane, self.tracker, self.offset = lane, OffsetTracker(), 0

    def offer(self, event: LineageEvent, now: float) -> None:
        event.ticket = self.tracker.track(PART, self.offset)
        event.source = SourceRef(PART[0], PART[1], self.offset)
        self.offset += 1
        self.lane.offer(event, now)
        event.ticket.release()

    def committable(self) -> int | None:
        return self.tracker.committable().get(PART)


def event(event_type: str, run: str, *, outputs: tuple[str, ...] = (), second: int = 0) -> LineageEvent:
    doc = {"eventType": event_type, "eventTime": f"2024-05-01T02:00:{second:02d}Z", "producer": "p",
           "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
           "run": {"runId": str(uuid.uuid5(uuid.NAMESPACE_OID, run))},
           "job": {"namespace": "spark-prod", "name": run}, "inputs": [],
           "outputs": [{"namespace": ns, "name": "t"} for ns in outputs]}
    decoded = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(decoded, LineageEvent)
    return decoded


def lane(collector: Collector, route: dict = ROUTE, **ordering: object) -> CollectorLane:
    return CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", route=route),
                         pipeline=PipelineConfig.model_validate({"ordering": {"on_hold_timeout": "dead_letter",
                                                                              **ordering}}),
                         metrics=RelayMetrics().for_collector("c"), dead_letters=None)


async def test_a_held_start_keeps_its_offset_until_its_complete_routes_the_run():
    collector = Collector()
    relay = Relay(lane(collector))
    await relay.lane.start()
    try:
        relay.offer(event("START", "a"), 0.0)
        assert relay.lane.held == 1 and relay.committable() is None
        relay.offer(event("START", "other"), 0.1)  # held too, and never blocks run a
        relay.offer(event("COMPLETE", "a", outputs=("s3://warehouse",), second=1), 1.0)
        got = [await asyncio.wait_for(collector.got.get(), 5) for _ in range(2)]
        assert got == [("a", "START"), ("a", "COMPLETE")]  # not held by the ordering: it had its START
        assert await relay.lane.drain(5)
        assert relay.lane.held == 1 and relay.committable() == 1  # "other", at offset 1, holds it
        relay.offer(event("COMPLETE", "other", outputs=("s3://lake",), second=1), 2.0)
        assert relay.lane.held == 0 and relay.committable() == 4  # dropped as not_routed, settled
        assert collector.got.empty()
    finally:
        await relay.lane.close()


async def test_a_hold_timeout_settles_and_a_revoke_takes_held_events_back():
    collector = Collector()
    relay = Relay(lane(collector, hold_timeout_s=10))
    await relay.lane.start()
    try:
        relay.offer(event("START", "a"), 0.0)
        relay.lane.expire(10.5)
        assert relay.lane.held == 0 and relay.committable() == 1
        relay.offer(event("START", "b"), 11.0)
        assert relay.lane.revoke({PART}) == 1 and relay.lane.held == 0
        relay.lane.expire(100.0)  # taken back: not decided (the new owner reads it again)
        assert relay.committable() == 1
        # The lane's route still judges what the run search finds (pure).
        assert relay.lane.routes(event("START", "c"))
        assert not relay.lane.routes(event("COMPLETE", "c", outputs=("s3://lake",)))
    finally:
        await relay.lane.close()


def test_a_lane_without_dataset_rules_routes_per_event_in_offer_itself():
    per_event = lane(Collector(), {"include": [{"job_namespace": "spark-*"}]})
    assert "offer" not in vars(per_event)  # CollectorLane.offer, no run-routing step
    assert "offer" in vars(lane(Collector()))
