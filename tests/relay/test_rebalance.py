"""PartitionHandover with a consolidated collector's run state: what a revocation writes
once it has waited for the deliveries under way, and what a lost partition does not."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from relay.config import PipelineConfig
from relay.lane import CollectorLane
from relay.metrics import RelayMetrics
from relay.rebalance import PartitionHandover
from relay.sinks.config import CollectorConfig
from relay.state.store import RunStateStore
from tests.relay.state.test_run_state_store import MAX_RECORD_BYTES, large_copy, read_again
from tests.relay.state.test_table import Lane, SlowDeadLetters, spark
from tests.support.changelog import CompactedTopic
from tests.support.waiting import until

PART = ("ol", 0)


class GatedCollector:
    """Takes each event once the test opens its gate (open to begin with)."""

    name = "c"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.got: list[str] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, body: bytes) -> None:
        await self.gate.wait()
        self.got.append(orjson.loads(body)["eventType"])


class Tracker:
    def __init__(self) -> None:
        self.revoked: list[list] = []

    def revoke(self, partitions: list) -> dict:
        self.revoked.append(partitions)
        return {}


class Relay:
    """One consolidated lane, its run state in a :class:`CompactedTopic`, its handover."""

    def __init__(self) -> None:
        self.collector = GatedCollector()
        self.lane = CollectorLane(self.collector, CollectorConfig(name="c", url="http://127.0.0.1:9",
                                                                  mode="consolidated",
                                                                  consolidation={"settle_s": 0.5}),
                                  pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                                  dead_letters=SlowDeadLetters())
        self.topic = CompactedTopic()
        self.store = RunStateStore(self.topic, [self.lane.table], RelayMetrics())
        self.tracker = Tracker()
        self.handover = PartitionHandover([self.lane], self.tracker, state=self.store, lookback=None,
                                          drain_timeout_s=20, state_settle_s=10, stop=asyncio.Event(),
                                          time_left=lambda: float("inf"), reset_at_assignment=lambda: ())

    def new_owner(self) -> list[str]:
        """What the partition's next owner sends first: the outboxes it restores."""
        fresh = Lane("consolidated")
        for key, value in self.topic.records.items():
            if value is not None:
                fresh.table.restore(key.decode().partition("/")[2], 0, value, now=100.0)
        fresh.write()
        return [e.event_type for e, _ in fresh.submitted]


async def _under_way(relay: Relay, sent: str) -> None:
    """Run 1 as far as ``sent`` (START, or the consolidated COMPLETE): written, handed to
    the collector, which has not answered yet."""
    start, running, complete = spark(1, partition=0)
    relay.lane.offer(start, 0.0)
    if sent == "START":
        relay.collector.gate.clear()
    await relay.store.settle(5)  # a commit: the START is written, then sent
    if sent == "COMPLETE":
        assert await relay.lane.drain(5)
        await relay.store.settle(5)  # its delivery recorded
        relay.collector.gate.clear()
        relay.lane.offer(running, 1.0)
        relay.lane.offer(complete, 1.1)
        relay.lane.expire(2.0)  # settle_s passed: the consolidated terminal is forwarded
        relay.store.flush()  # the flush after a poll batch: written, then sent
    await until(lambda: relay.lane.pending == 1, f"the {sent} under way")


@pytest.mark.parametrize("sent", ["START", "COMPLETE"])
async def test_output_delivered_while_a_revocation_waits_is_not_sent_again_by_the_new_owner(sent, caplog):
    """The revocation wrote the run state before it waited for the deliveries, and forgot
    the run, so the delivery that landed during the wait was never written: the new owner
    restored an outbox that still held it, and sent the consolidated terminal (or the
    START) a second time."""
    relay = Relay()
    await relay.lane.start()
    try:
        await _under_way(relay, sent)
        with caplog.at_level(logging.INFO, logger="relay.app"):
            revoking = asyncio.ensure_future(relay.handover.revoked([PART]))
            await until(lambda: any(r.getMessage() == "revoke_waiting_for_deliveries" for r in caplog.records),
                        "the revocation waiting for the delivery")
            relay.collector.gate.set()
            await asyncio.wait_for(revoking, 10)
        assert relay.collector.got[-1] == sent and relay.tracker.revoked == [[PART]]
    finally:
        await relay.lane.close()
    assert relay.new_owner() == []


async def test_a_lost_partition_writes_no_run_state():
    """Another member may own a lost partition already: its runs are forgotten unwritten,
    and not written by a later revocation either."""
    relay = Relay()
    await relay.lane.start()
    try:
        await _under_way(relay, "COMPLETE")
        writes, records = relay.topic.writes, dict(relay.topic.records)
        await relay.handover.lost([PART])
        relay.collector.gate.set()
        await relay.handover.revoked([("ol", 1)])
        await relay.store.settle(5)
        assert relay.topic.writes == writes and relay.topic.records == records
    finally:
        await relay.lane.close()


@pytest.mark.parametrize("moved", ["revoked", "lost"])
async def test_an_event_its_reduced_record_leaves_out_is_sent_by_the_new_owner(moved):
    """A run whose record is too large even without its merged facets (a large START), its
    collector down, its partition moved: the record marks the START, whose ticket is not
    settled (the partition's last commit stays below it); the new owner sends its copy read
    again. It used to take the copy for a duplicate: the START was lost."""
    relay = Relay()
    relay.topic = CompactedTopic(max_record_bytes=MAX_RECORD_BYTES)
    relay.store = RunStateStore(relay.topic, [relay.lane.table], RelayMetrics())
    relay.handover = PartitionHandover([relay.lane], relay.tracker, state=relay.store, lookback=None,
                                       drain_timeout_s=0.2, state_settle_s=10, stop=asyncio.Event(),
                                       time_left=lambda: float("inf"), reset_at_assignment=lambda: ())
    start = large_copy(spark(1, partition=0)[0])
    await relay.lane.start()
    try:
        relay.collector.gate.clear()  # down
        relay.lane.offer(start, 0.0)
        for _ in range(3):  # commits: refused whole, refused without merged facets, written reduced
            await relay.store.settle(5)
        await until(lambda: relay.lane.pending == 1, "the START under way")
        if moved == "revoked":
            await relay.handover.revoked([PART])
        else:
            await relay.handover.lost([PART])
        assert start.ticket.released == 0 and relay.collector.got == []
    finally:
        await relay.lane.close()
    fresh = Lane("consolidated")
    for key, value in relay.topic.records.items():
        fresh.table.restore(key.decode().partition("/")[2], 0, value, now=100.0)
    fresh.offer(read_again([start])[0], 101.0)
    fresh.write()
    assert fresh.deliver_all() == ["START"]


async def test_the_wait_for_deliveries_ends_within_the_handlers_time(caplog):
    """max.poll.interval.ms (15 s) below drain_timeout_s (20 s): the wait was 20 s, the
    consumer gave the handler up after 15 s, before it stopped the deliveries and gave the
    partition up, and the relay stopped (relay_failed). Now the wait ends within what the
    handler has left, the deliveries are stopped and the partition handed over."""
    relay = Relay()
    relay.handover = PartitionHandover([relay.lane], relay.tracker, state=relay.store, lookback=None,
                                       drain_timeout_s=20, state_settle_s=10, stop=asyncio.Event(),
                                       time_left=lambda: float("inf"), reset_at_assignment=lambda: (),
                                       handover_left=lambda: 2.0)
    await relay.lane.start()
    try:
        await _under_way(relay, "START")  # the collector has not answered
        with caplog.at_level(logging.INFO, logger="relay.app"):
            await asyncio.wait_for(relay.handover.revoked([PART]), 10)  # was 20 s
        [waited] = [r for r in caplog.records if r.getMessage() == "revoke_waiting_for_deliveries"]
        assert waited.fields["timeout_s"] <= 2.0
        assert any(r.getMessage() == "revoke_deliveries_aborted" for r in caplog.records)
        assert relay.tracker.revoked == [[PART]] and relay.lane.sending({PART}) == 0
    finally:
        relay.collector.gate.set()
        await relay.lane.close()


async def test_a_revocation_given_up_gives_the_partition_up_as_if_lost(caplog):
    """The consumer gives a handler up past max.poll.interval.ms (the handler cancelled):
    the partition moves to another member all the same. Its deliveries went on (the drain
    delivered them while the other member owned it) and the tracker kept it (committed at
    shutdown). Now they are stopped and the partition forgotten, its runs unwritten."""
    relay = Relay()
    await relay.lane.start()
    try:
        await _under_way(relay, "START")
        writes = relay.topic.writes
        with caplog.at_level(logging.INFO, logger="relay.app"):
            revoking = asyncio.ensure_future(relay.handover.revoked([PART]))
            await until(lambda: any(r.getMessage() == "revoke_waiting_for_deliveries" for r in caplog.records),
                        "the revocation waiting for the delivery")
            revoking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await revoking
        assert any(r.getMessage() == "revoke_deliveries_aborted" for r in caplog.records)
        assert relay.tracker.revoked == [[PART]] and relay.lane.sending({PART}) == 0
        relay.collector.gate.set()
        await relay.store.settle(5)
        assert relay.topic.writes == writes  # nothing of it written after it was given up
    finally:
        relay.collector.gate.set()
        await relay.lane.close()


class SlowLookback:
    """A look-back reading from a slow partition leader: it takes ``read_s``."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.reading = asyncio.Event()
        self.forgotten: list[list] = []

    async def prime(self, partitions: list) -> int:
        self.reading.set()
        await asyncio.sleep(self.read_s)  # ok: the slow read itself, not a wait for a condition
        return 0

    def forget(self, partitions: list) -> None:
        self.forgotten.append(list(partitions))


@pytest.mark.parametrize("stopped", ["before", "during"])
async def test_a_stop_ends_an_assignments_lookback_and_its_partitions_are_not_handled(stopped):
    """The look-back (or a run-state restore) ran to its end whatever the stop: the relay
    waits on the poll whose callback runs it, and returned 20 s after a stop it had to
    answer within drain_timeout_s + 5 s. Now the stop ends it; the partitions are
    abandoned (none of their records handled, hence none committed), what was restored
    of them forgotten."""
    relay = Relay()
    stop = asyncio.Event()
    lookback = SlowLookback(read_s=60)
    relay.handover = PartitionHandover([relay.lane], relay.tracker, state=relay.store, lookback=lookback,
                                       drain_timeout_s=3, state_settle_s=10, stop=stop,
                                       time_left=lambda: float("inf"), reset_at_assignment=lambda: ())
    if stopped == "before":
        stop.set()
    assigning = asyncio.ensure_future(relay.handover.assigned([PART]))
    if stopped == "during":
        await asyncio.wait_for(lookback.reading.wait(), 10)
        stop.set()
    assert await asyncio.wait_for(assigning, 10) == {}
    assert relay.handover.abandoned == {PART} and lookback.forgotten == [[PART]]
    # Revoked on the way out (leaving the group): no longer abandoned, nothing to commit.
    await relay.handover.revoked([PART])
    assert relay.handover.abandoned == set() and relay.tracker.revoked == [[PART]]


async def test_an_assignment_without_a_stop_is_handled():
    relay = Relay()
    lookback = SlowLookback(read_s=0)
    relay.handover = PartitionHandover([relay.lane], relay.tracker, state=relay.store, lookback=lookback,
                                       drain_timeout_s=3, state_settle_s=10, stop=asyncio.Event(),
                                       time_left=lambda: float("inf"), reset_at_assignment=lambda: ())
    assert await asyncio.wait_for(relay.handover.assigned([PART]), 10) == {}
    assert lookback.reading.is_set() and relay.handover.abandoned == set() and lookback.forgotten == []


class HeldTopic:
    """A changelog whose broker does not answer (writes kept) until :meth:`release`."""

    def __init__(self, inner: CompactedTopic) -> None:
        self.inner, self.hold, self.queued = inner, True, []

    def write(self, partition, key, value, on_done) -> None:
        if self.hold:
            self.queued.append((partition, key, value, on_done))
        else:
            self.inner.write(partition, key, value, on_done)

    def release(self) -> None:
        self.hold = False
        for queued in self.queued:
            self.inner.write(*queued)
        self.queued = []

    @property
    def unacked(self) -> int:
        return self.inner.unacked + len(self.queued)

    async def wait_acked(self, timeout_s: float) -> bool:
        if self.queued:
            await asyncio.sleep(timeout_s)  # ok: no answer within the timeout
            return False
        return await self.inner.wait_acked(timeout_s)

    async def read_partition(self, partition):
        return await self.inner.read_partition(partition)


async def test_a_revocation_given_up_in_its_first_settle_forgets_the_partitions_runs():
    """Cancelled (or failing) before its events were taken back (in the first state settle,
    the broker slow), a revocation gave the partition up without the lanes' revoke: its run
    state stayed, and a later settle wrote its record and delivered its START for a
    partition another member owns. Now it is given up as a lost one is."""
    relay = Relay()
    topic = HeldTopic(relay.topic)
    relay.store.changelog = topic
    await relay.lane.start()
    try:
        start, _running, _complete = spark(1, partition=0)
        relay.lane.offer(start, 0.0)  # captured: sent once its run's state is written
        revoking = asyncio.ensure_future(relay.handover.revoked([PART]))
        await asyncio.sleep(0.2)  # ok: the revocation is in its first settle (no broker answer)
        revoking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await revoking
        assert relay.tracker.revoked == [[PART]]
        assert relay.lane.table.runs == 0
        topic.release()  # the broker answers the write made before
        await relay.store.settle(5)  # the shutdown's settle
        await relay.lane.drain(5)
        assert relay.collector.got == []
    finally:
        await relay.lane.close()


async def test_an_abandoned_assignment_forgets_its_restored_runs():
    """A stop during the look-back abandons the assignment: what restore() put in the run
    state table is forgotten, not written again nor sent by the shutdown's settle."""
    from tests.relay.state.test_table import _open_consolidated_run

    saved, _ = _open_consolidated_run()
    relay = Relay()
    relay.topic.records.update(saved.changelog)
    stop = asyncio.Event()
    lookback = SlowLookback(read_s=60)
    relay.handover = PartitionHandover([relay.lane], relay.tracker, state=relay.store, lookback=lookback,
                                       drain_timeout_s=3, state_settle_s=10, stop=stop,
                                       time_left=lambda: float("inf"), reset_at_assignment=lambda: ())
    await relay.lane.start()
    try:
        assigning = asyncio.ensure_future(relay.handover.assigned([PART]))
        await asyncio.wait_for(lookback.reading.wait(), 10)
        stop.set()
        await asyncio.wait_for(assigning, 10)
        assert relay.handover.abandoned == {PART} and lookback.forgotten == [[PART]]
        assert relay.lane.table.runs == 0
        writes = relay.topic.writes
        await relay.store.settle(5)  # the shutdown's settle
        await relay.lane.drain(2)
        assert relay.topic.writes == writes and relay.collector.got == []
    finally:
        await relay.lane.close()


async def test_a_former_modes_output_under_way_is_waited_for_and_not_sent_again_by_the_new_owner():
    """A passthrough lane's run saved in a former mode (consolidated): its outbox START is
    under way when the partition is revoked. The revocation threw the former runs' ids
    away: the START was neither waited for nor aborted, and it landed after the record was
    handed over unwritten: the new owner sent it again."""
    from tests.relay.state.test_table import _open_consolidated_run

    def passthrough_lane(collector: GatedCollector) -> CollectorLane:
        return CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", mode="passthrough"),
                             pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"), dead_letters=None)

    saved, _ = _open_consolidated_run()  # its record: START in the outbox, a RUNNING captured
    topic = CompactedTopic()
    topic.records.update(saved.changelog)
    collector = GatedCollector()
    lane = passthrough_lane(collector)
    store = RunStateStore(topic, [lane.state_table], RelayMetrics())
    handover = PartitionHandover([lane], Tracker(), state=store, lookback=None, drain_timeout_s=5,
                                 state_settle_s=5, stop=asyncio.Event(), time_left=lambda: float("inf"),
                                 reset_at_assignment=lambda: ())
    await lane.start()
    try:
        collector.gate.clear()
        await store.restore([0], 100.0)
        await store.settle(5)
        await until(lambda: lane.pending >= 1, "the former START under way")
        revoking = asyncio.ensure_future(handover.revoked([PART]))
        await until(lambda: lane.sending({PART}) >= 1, "the revocation waiting for the former START")
        collector.gate.set()  # our START lands while the revocation waits for it
        await asyncio.wait_for(revoking, 10)
        await lane.drain(2)
        ours = list(collector.got)
    finally:
        collector.gate.set()
        await lane.close()
    collector2 = GatedCollector()  # the new owner, same configuration
    lane2 = passthrough_lane(collector2)
    store2 = RunStateStore(topic, [lane2.state_table], RelayMetrics())
    await lane2.start()
    try:
        await store2.restore([0], 200.0)
        for _ in range(2):
            await store2.settle(5)
            await lane2.drain(2)
        theirs = list(collector2.got)
    finally:
        await lane2.close()
    assert ours.count("START") + theirs.count("START") == 1, (ours, theirs)
