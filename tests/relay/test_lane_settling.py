"""CollectorLane: an offset is settled only once its event reached the collector or the
dead-letter topic, also across a look-back and a partition taken away and given back
(copies of one event in two partitions; dead letters still being written at a revoke)."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from relay.config import CollectorConfig, PipelineConfig
from relay.events import LineageEvent, SourceRef
from relay.lane import CollectorLane
from relay.metrics import CollectorMetrics, RelayMetrics
from relay.sinks.base import Undeliverable
from relay.source.offsets import OffsetTracker
from relay.stages.decode import decode_record

P0, P1 = ("ol", 0), ("ol", 1)
RUN = str(uuid.uuid4())


def body(event_type: str, second: int = 0) -> bytes:
    return orjson.dumps({
        "eventType": event_type, "eventTime": f"2024-05-01T02:00:{second:02d}Z", "producer": "p",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": RUN}, "job": {"namespace": "n", "name": "j"}, "inputs": [], "outputs": []})


class Collector:
    """Takes everything, or refuses (400) what ``refuse`` names; ``answer`` closed: never
    answers (a collector that is down)."""

    name = "c"

    def __init__(self, refuse: bytes | None = None, answer: bool = True) -> None:
        self.got: list[bytes] = []
        self.arrived: asyncio.Queue[bytes] = asyncio.Queue()
        self.refuse = refuse
        self.answer = asyncio.Event()
        if answer:
            self.answer.set()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, data: bytes) -> Undeliverable | None:
        self.got.append(data)
        self.arrived.put_nowait(data)
        await self.answer.wait()
        if self.refuse is not None and self.refuse in data:
            return Undeliverable("collector_rejected", "HTTP 400", 400)
        return None


class DeadLetters:
    """A dead-letter topic that takes its time: writes complete when ``write_all`` says."""

    def __init__(self) -> None:
        self.waiting: list = []
        self.written = 0

    def send(self, value, key, *, reason, detail, source, on_done, collector=None) -> None:
        self.waiting.append(on_done)

    def write_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for on_done in waiting:
            self.written += 1
            on_done()


class Consumer:
    """What the relay does around a lane: a ticket per record, offered, then its own
    obligation released."""

    def __init__(self, lane: CollectorLane) -> None:
        self.lane, self.tracker = lane, OffsetTracker()

    def read(self, data: bytes, part: tuple[str, int], offset: int, now: float) -> None:
        event = decode_record(data, max_bytes=1 << 20)
        assert isinstance(event, LineageEvent)
        event.source = SourceRef(part[0], part[1], offset)
        event.ticket = self.tracker.track(part, offset)
        event.consumed_at = now
        self.lane.offer(event, now)
        event.ticket.release()

    def read_back(self, data: bytes, part: tuple[str, int], offset: int, now: float) -> None:
        """A record below the committed offset, read back by the look-back on assignment."""
        event = decode_record(data, max_bytes=1 << 20)
        event.source = SourceRef(part[0], part[1], offset)
        self.lane.prime(event, now)


def make_lane(collector: Collector, metrics: CollectorMetrics, dead_letters: DeadLetters | None = None,
              **pipeline: object) -> CollectorLane:
    return CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9"),
                         pipeline=PipelineConfig.model_validate(pipeline), metrics=metrics,
                         dead_letters=dead_letters)


async def settle(lane: CollectorLane) -> None:
    assert await lane.drain(5)


async def read_again_and_see_it_sent(consumer: Consumer, collector: Collector, metrics: CollectorMetrics,
                                     start: bytes, complete: bytes) -> None:
    """p0 given back and read again from its committed offset (1, the COMPLETE whose dead
    letter is not written yet): neither a duplicate nor after its run's terminal, it is sent
    again (refused again), and its offset waits for its own dead letter."""
    consumer.read(complete, P0, 1, 1.0)
    await settle(consumer.lane)
    assert collector.got == [start, complete, complete]
    assert metrics.deduplicated._value.get() == 0
    assert metrics.dropped("after_terminal")._value.get() == 0
    assert consumer.tracker.committable() == {}


async def test_a_copy_in_another_partition_is_delivered_after_a_restart_found_its_twin_committed():
    running = body("RUNNING")
    # Before the restart: the collector is down; A (p0@10) waits, its byte-identical copy B
    # (p1@5) is a duplicate and p1's commit passes it.
    down = Collector(answer=False)
    before = Consumer(make_lane(down, RelayMetrics().for_collector("c"), ordering={"enabled": False}))
    await before.lane.start()
    try:
        before.read(running, P0, 10, 0.0)
        before.read(running, P1, 5, 0.1)
        assert before.tracker.committable() == {P1: 6}  # p0 waits for A
    finally:
        await before.lane.close()
    # Restarted (or both partitions given to one replica): the look-back reads B back below
    # p1's commit, and p0 is read again from A.
    up = Collector()
    metrics = RelayMetrics().for_collector("c")
    after = Consumer(make_lane(up, metrics, ordering={"enabled": False}))
    await after.lane.start()
    try:
        after.read_back(running, P1, 5, 1.0)
        after.read(running, P1, 6, 1.05)  # a later copy in B's own partition: still a duplicate
        assert after.tracker.committable() == {P1: 7} and metrics.deduplicated._value.get() == 1
        after.read(running, P0, 10, 1.1)
        await settle(after.lane)
        assert up.got == [running]  # A reached the collector
        assert after.tracker.committable() == {P0: 11, P1: 7}
        assert metrics.deduplicated._value.get() == 1
        after.read(running, P0, 11, 1.2)  # from now on its digest is an ordinary one
        assert metrics.deduplicated._value.get() == 2
    finally:
        await after.lane.close()


@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "no-dedupe"])
async def test_a_dead_letter_not_written_at_a_revoke_keeps_the_record_read_again_uncommitted(dedupe):
    start, complete = body("START", 0), body("COMPLETE", 1)
    collector = Collector(refuse=b"COMPLETE")
    dead_letters = DeadLetters()
    metrics = RelayMetrics().for_collector("c")
    consumer = Consumer(make_lane(collector, metrics, dead_letters, dedupe={"enabled": dedupe}))
    await consumer.lane.start()
    try:
        consumer.read(start, P0, 0, 0.0)
        consumer.read(complete, P0, 1, 0.0)
        await settle(consumer.lane)
        assert len(dead_letters.waiting) == 1 and consumer.tracker.committable() == {P0: 1}
        # The partition is revoked (or lost) and given back while the dead letter is not
        # written yet: p0 is read again from its committed offset, 1.
        consumer.lane.revoke({P0})
        assert consumer.lane.abort({P0}) == 0
        assert consumer.tracker.revoke([P0]) == {P0: 1}
        await read_again_and_see_it_sent(consumer, collector, metrics, start, complete)
        dead_letters.write_all()
        assert dead_letters.written == 2 and consumer.tracker.committable() == {P0: 2}
    finally:
        await consumer.lane.close()


async def test_a_dead_letter_refused_while_a_revoke_waits_is_taken_back_by_the_abort():
    start, complete = body("START", 0), body("COMPLETE", 1)
    collector = Collector(refuse=b"COMPLETE")
    dead_letters = DeadLetters()
    metrics = RelayMetrics().for_collector("c")
    consumer = Consumer(make_lane(collector, metrics, dead_letters))
    await consumer.lane.start()
    try:
        consumer.read(start, P0, 0, 0.0)
        await settle(consumer.lane)
        collector.answer.clear()
        consumer.read(complete, P0, 1, 0.0)
        await asyncio.wait_for(collector.arrived.get(), 5)  # the START's
        assert await asyncio.wait_for(collector.arrived.get(), 5) == complete
        # Revoked while the COMPLETE is with the collector; its verdict, a refusal, comes
        # while the revoke waits for it (a dead letter then on its way).
        assert consumer.lane.revoke({P0}) == 0 and consumer.lane.sending({P0}) == 1
        collector.answer.set()
        await settle(consumer.lane)
        assert len(dead_letters.waiting) == 1
        consumer.lane.abort({P0})
        consumer.tracker.revoke([P0])
        await read_again_and_see_it_sent(consumer, collector, metrics, start, complete)
    finally:
        await consumer.lane.close()
