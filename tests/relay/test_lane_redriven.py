"""A record ``dlq redrive --to-topic`` writes back (:meth:`CollectorLane.offer_again`) is
delivered, as the README promises, also when its run was forgotten meanwhile
(``finished_ttl_s``, or a restart whose look-back does not reach its START): a COMPLETE the
collector refused was held for a START delivered long before, then dead-lettered again as
``hold_timeout`` (or, with ``on_hold_timeout: forward``, sent ``hold_timeout_s`` late)."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from relay.config import CollectorConfig, PipelineConfig
from relay.events import LineageEvent, SourceRef
from relay.lane import CollectorLane
from relay.metrics import RelayMetrics
from relay.sinks.base import Undeliverable
from relay.source.offsets import OffsetTracker
from relay.stages.decode import decode_record

RUN = str(uuid.UUID(int=7))


def run_event(event_type: str, second: int) -> LineageEvent:
    doc = {"eventType": event_type, "eventTime": f"2024-05-01T02:00:{second:02d}Z", "producer": "https://p",
           "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
           "run": {"runId": RUN}, "job": {"namespace": "ns", "name": "j"}}
    event = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(event, LineageEvent)
    return event


class RefusingCollector:
    """Refuses the first COMPLETE (a bad facet, say), takes everything else."""

    name = "c"

    def __init__(self) -> None:
        self.got: list[str] = []
        self.refuse_complete = True

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, body: bytes):
        event_type = orjson.loads(body)["eventType"]
        if event_type == "COMPLETE" and self.refuse_complete:
            self.refuse_complete = False
            return Undeliverable("collector_rejected", "400 bad facet", 400)
        self.got.append(event_type)
        return None


class DeadLetters:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def send(self, value, key, *, reason, detail, source, on_done, collector=None) -> None:
        self.reasons.append(reason)
        on_done()


class Relay:
    def __init__(self, collector: RefusingCollector, dead_letters: DeadLetters, policy: str) -> None:
        pipeline = PipelineConfig.model_validate({"ordering": {
            "on_hold_timeout": policy, "hold_timeout_s": 10, "finished_ttl_s": 60, "terminal_grace_s": 0}})
        self.lane = CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9"), pipeline=pipeline,
                                  metrics=RelayMetrics().for_collector("c"), dead_letters=dead_letters)
        self.tracker = OffsetTracker()
        self.offset = 0

    def offer(self, event: LineageEvent, now: float, *, redriven: bool = False) -> None:
        event.ticket = self.tracker.track(("ol", 0), self.offset)
        event.source = SourceRef("ol", 0, self.offset)
        self.offset += 1
        (self.lane.offer_again if redriven else self.lane.offer)(event, now)
        event.ticket.release()


@pytest.mark.parametrize("policy", ["dead_letter", "forward"])
@pytest.mark.parametrize("forgotten_by", ["finished_ttl_s", "restart"])
def test_a_redriven_terminal_of_a_forgotten_run_is_delivered_at_once(policy, forgotten_by):
    async def main() -> tuple[list[str], list[str], int]:
        collector, dead_letters = RefusingCollector(), DeadLetters()
        relay = Relay(collector, dead_letters, policy)
        await relay.lane.start()
        relay.offer(run_event("START", 0), 0.0)
        relay.offer(run_event("COMPLETE", 5), 1.0)
        await relay.lane.drain(5)
        assert collector.got == ["START"] and dead_letters.reasons == ["collector_rejected"]
        if forgotten_by == "finished_ttl_s":
            relay.lane.expire(200.0)
        else:
            await relay.lane.close()
            relay = Relay(collector, dead_letters, policy)
            await relay.lane.start()
        relay.offer(run_event("COMPLETE", 5), 3600.0, redriven=True)
        held = relay.lane.held
        relay.lane.expire(3600.5)
        await relay.lane.drain(5)
        await relay.lane.close()
        return collector.got, dead_letters.reasons, held

    got, reasons, held = asyncio.run(main())
    assert held == 0  # not held for its START, not even for hold_timeout_s
    assert got == ["START", "COMPLETE"] and reasons == ["collector_rejected"]
