"""RunStateTable: write-ahead of what held runs send, tickets settled by acknowledgements,
restore after a crash, closed runs, revocation. Plain data, no broker."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime

import orjson
import pytest

from relay.config import PipelineConfig
from relay.embedded.sample import spark_run
from relay.events import LineageEvent, SourceRef
from relay.lane import CollectorLane
from relay.metrics import RelayMetrics
from relay.sinks.base import Undeliverable
from relay.sinks.config import CollectorConfig
from relay.stages.consolidate import RunConsolidator
from relay.stages.decode import decode_record
from relay.state.store import RunStateStore
from relay.state.table import RunStateTable
from tests.support.changelog import CompactedTopic

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
_offsets = iter(range(1 << 30))


class Ticket:
    def __init__(self) -> None:
        self.released = 0

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        self.released += 1


def run_id(n: int) -> str:
    return str(uuid.UUID(int=n, version=4))


def spark(n: int, *, partition: int = 0, running: int = 1, parent: tuple | None = None) -> list[LineageEvent]:
    out = []
    for doc in spark_run("spark-prod", f"etl.t{n}", run_id=run_id(n), start=T0, rng=random.Random(n),
                         with_running=running, parent=parent):
        event = decode_record(orjson.dumps(doc), max_bytes=1 << 22, source=SourceRef("ol", partition, next(_offsets)))
        event.ticket = Ticket()
        out.append(event)
    return out


def deepest(event: LineageEvent, place: str) -> LineageEvent:
    """``event`` with a value nested as deep as decode accepts (orjson writes 254 levels), in
    a run facet or under a top-level key of its own (``place``)."""
    for depth in range(260, 0, -1):
        value: object = 1
        for _ in range(depth):
            value = [value]
        doc = orjson.loads(event.body)
        if place == "facet":
            doc["run"]["facets"]["deep"] = {"_producer": "https://example.com", "_schemaURL":
                                            "https://example.com/Deep.json#/$defs/Deep", "value": value}
        else:
            doc["deep"] = value
        try:
            body = orjson.dumps(doc)
        except orjson.JSONEncodeError:
            continue
        deep = decode_record(body, max_bytes=1 << 22, source=event.source)
        if isinstance(deep, LineageEvent):
            deep.ticket = Ticket()
            return deep
    raise AssertionError("no nesting accepted")


def restored(lane: Lane, now: float, **knobs) -> Lane:
    """A new relay after kill -9: the lane's changelog read back."""
    fresh = Lane(lane.consolidator.mode, **knobs)
    for key, value in lane.changelog.items():
        if value is not None:
            fresh.table.restore(key.decode().partition("/")[2], 0, value, now=now)
    return fresh


class Lane:
    """A consolidator and its table, as a lane drives them; the broker and delivery are lists."""

    def __init__(self, mode: str = "consolidated", **knobs) -> None:
        options = dict(settle_s=1.0, missing_start_timeout_s=30.0, parent_hold_s=5.0, finished_ttl_s=60.0)
        options.update(knobs)
        self.consolidator = RunConsolidator(mode=mode, **options)
        self.submitted: list[tuple[LineageEvent, LineageEvent | None]] = []
        self.table = RunStateTable("c", self.consolidator, lambda e, after: self.submitted.append((e, after)))
        self.changelog: dict[bytes, bytes | None] = {}

    def offer(self, event: LineageEvent, now: float) -> None:
        if self.table.refill(event):  # as CollectorLane.offer: left out of a restored record
            return
        self.apply(self.consolidator.offer(event, now))

    def tick(self, now: float) -> None:
        self.apply(self.consolidator.tick(now))

    def apply(self, actions) -> None:
        for action in actions:
            name = type(action).__name__
            if name == "Forward":
                self.table.forwarded(action.event)
            elif name == "Release":
                self.table.captured(action.event)
            elif name == "Drop":
                action.event.ticket.release()
            else:
                self.table.touched(action.run_id)

    def write(self, ok: bool = True, commit: bool = True) -> list:
        """A commit's writes, or (``commit=False``) those of the flush after each poll batch."""
        writes = self.table.take_writes(include_deliveries=commit)
        for write in writes:
            if ok:
                self.changelog[write.key] = write.value
            self.table.written(write, ok)
        return writes

    def deliver_all(self) -> list[str]:
        sent = [e.event_type for e, _ in self.submitted]
        for event, _ in self.submitted:  # as CollectorLane._settled
            if not self.table.delivered(event) and event.ticket is not None:
                event.ticket.release()
        self.submitted.clear()
        return sent


def test_forwarded_events_are_sent_only_once_written_and_captured_ones_settle_then():
    start, running, complete = spark(1)
    lane = Lane()
    lane.offer(start, 0.0)
    lane.offer(running, 0.1)
    assert lane.submitted == [] and running.ticket.released == 0
    lane.write(ok=False)  # the broker refused: nothing goes out, nothing settles
    assert lane.submitted == [] and running.ticket.released == 0
    lane.write()
    assert [e for e, _ in lane.submitted] == [start] and running.ticket.released == 1
    record = orjson.loads(lane.changelog[lane.table.key(run_id(1))])
    assert record["state"]["start"] == "emitted" and len(record["outbox"]) == 1
    assert lane.deliver_all() == ["START"] and start.ticket.released == 1
    assert lane.write(commit=False) == []  # nothing waits for it: the commit will write it
    lane.write()
    assert "outbox" not in orjson.loads(lane.changelog[lane.table.key(run_id(1))])
    assert lane.table.is_duplicate(start) and lane.table.is_duplicate(running)
    assert not lane.table.is_duplicate(complete)


def test_a_terminal_waits_until_nothing_is_before_it_in_the_written_outbox():
    start, running, complete = spark(1)
    lane = Lane(settle_s=0.5)
    lane.offer(complete, 0.0)  # the terminal overtook its START
    lane.offer(running, 0.1)
    lane.tick(1.0)  # settled, but no START yet
    lane.offer(start, 2.0)
    lane.tick(2.0)  # START and the consolidated terminal are both due now
    lane.write()
    assert [e.event_type for e, _ in lane.submitted] == ["START"]
    assert len(orjson.loads(lane.changelog[lane.table.key(run_id(1))])["outbox"]) == 2
    lane.deliver_all()
    assert lane.submitted == []  # the outbox still says START before the terminal
    lane.write(commit=False)  # written at once: the terminal waits for it
    assert [e.event_type for e, _ in lane.submitted] == ["COMPLETE"]
    assert [d["eventType"] for d in orjson.loads(lane.changelog[lane.table.key(run_id(1))])["outbox"]] == ["COMPLETE"]


def test_a_crash_restores_open_runs_and_resends_only_what_may_be_undelivered():
    first, second = spark(1), spark(2)
    lane = Lane()
    for event in (first[0], first[1], second[0]):
        lane.offer(event, 0.0)
    lane.write()
    lane.deliver_all()
    lane.write()  # both STARTs delivered and recorded
    lane.offer(second[1], 1.0)
    lane.offer(second[2], 1.0)
    lane.tick(3.0)  # run 2's terminal is in its outbox, written, not yet delivered
    lane.write()
    assert [e.event_type for e, _ in lane.submitted] == ["COMPLETE"]
    # kill -9: a new relay restores from the changelog
    fresh = Lane()
    for key, value in lane.changelog.items():
        if value is not None:
            fresh.table.restore(key.decode().partition("/")[2], 0, value, now=100.0)
    assert fresh.consolidator.open_runs == 1 and fresh.submitted == []
    fresh.write()
    assert [(e.run_id, e.event_type) for e, _ in fresh.submitted] == [(run_id(2), "COMPLETE")]
    fresh.deliver_all()
    # Records re-read from uncommitted offsets are recognised, or dropped after the terminal.
    assert fresh.table.is_duplicate(first[0]) and fresh.table.is_duplicate(first[1])
    replayed = spark(2)[0]
    fresh.offer(replayed, 101.0)
    assert replayed.ticket.released == 1 and fresh.submitted == []
    fresh.offer(first[2], 102.0)
    fresh.tick(104.0)
    fresh.write()
    assert [(e.run_id, e.event_type) for e, _ in fresh.submitted] == [(run_id(1), "COMPLETE")]


def finished(lane: Lane) -> Lane:
    """``lane`` after run 1 went through: offered, settled, written and delivered."""
    for event in spark(1):
        lane.offer(event, 0.0)
    lane.tick(2.0)
    for _ in range(3):
        lane.write()
        lane.deliver_all()
    return lane


def test_a_finished_run_is_written_as_closed_then_tombstoned_when_forgotten():
    lane = finished(Lane(finished_ttl_s=60.0))
    key = lane.table.key(run_id(1))
    assert orjson.loads(lane.changelog[key])["state"]["closed"] == "finished"
    assert lane.table.runs == 0
    lane.tick(100.0)  # finished_ttl_s passed: the consolidator forgets it
    lane.write()
    assert lane.changelog[key] is None


def test_revoke_forgets_the_partitions_runs_and_returns_their_output():
    mine, theirs = spark(1, partition=0), spark(2, partition=1)
    lane = Lane()
    lane.offer(mine[0], 0.0)
    lane.offer(theirs[0], 0.0)
    gone, abandoned = lane.table.revoke({1})
    assert gone == {run_id(2)} and [e.run_id for e in abandoned] == [run_id(2)]
    assert lane.consolidator.to_state(run_id(2)) is None and lane.consolidator.to_state(run_id(1)) is not None
    lane.write()
    assert [e.run_id for e, _ in lane.submitted] == [run_id(1)]


def test_a_childs_start_is_submitted_behind_its_parents_start():
    parent = spark(1, running=0)
    child = spark(2, running=0, parent=("spark-prod", "etl.t1", run_id(1)))
    lane = Lane(parent_hold_s=5.0)
    lane.offer(child[0], 0.0)  # waits for its parent
    lane.offer(parent[0], 0.5)  # releases both STARTs
    lane.write()
    after = {event.run_id: waits_for for event, waits_for in lane.submitted}
    assert after == {run_id(1): None, run_id(2): parent[0]}


@pytest.mark.parametrize("place", ["facet", "top"])
def test_events_nested_as_deep_as_decode_accepts_are_held_written_and_sent(place):
    start, running, complete = spark(1)
    held = [deepest(running, place), deepest(complete, place)]
    lane = Lane("coalesce")
    for event in held:
        lane.offer(event, 0.0)  # held before their START: whole documents in the run's state
    lane.write()  # raised TypeError (recursion limit) when the record nested them deeper
    assert [e.ticket.released for e in held] == [1, 1]
    fresh = restored(lane, 10.0)
    fresh.offer(start, 10.0)
    fresh.write()
    sent = [e for e, _ in fresh.submitted]
    assert fresh.deliver_all() == ["START", "RUNNING"]
    fresh.write(commit=False)
    sent += [e for e, _ in fresh.submitted]
    assert fresh.deliver_all() == ["COMPLETE"]
    deep = (lambda doc: doc["run"]["facets"]["deep"]) if place == "facet" else (lambda doc: doc["deep"])
    assert deep(sent[1].doc) == deep(held[0].doc)  # the merged RUNNING
    assert sent[2].doc == held[1].doc


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_a_start_nested_as_deep_as_decode_accepts_waits_for_its_parent_in_written_state(mode):
    child = deepest(spark(2, running=0, parent=("spark-prod", "etl.t1", run_id(1)))[0], "top")
    lane = Lane(mode, parent_hold_s=5.0)
    lane.offer(child, 0.0)  # held for its unseen parent (consolidated: merged as well)
    lane.write()
    assert child.ticket.released == 1 and lane.submitted == []
    fresh = restored(lane, 10.0, parent_hold_s=5.0)
    fresh.tick(20.0)  # the parent never came
    fresh.write()
    assert [e.doc for e, _ in fresh.submitted] == [child.doc]


class RefusingCollector:
    """An HTTP collector that refuses the bodies in ``refused`` and takes the others."""

    name = "c"

    def __init__(self, refused: set[bytes]) -> None:
        self.refused = refused
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, body: bytes) -> Undeliverable | None:
        if body in self.refused:
            return Undeliverable("collector_rejected", "HTTP 400", 400)
        self.got.put_nowait(body)
        return None


class SlowDeadLetters:
    """The dead-letter topic, acknowledging a write only when the test says so."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[tuple[bytes, object]] = asyncio.Queue()

    def send(self, value, key, *, reason, detail, source, on_done, collector=None) -> None:
        self.sent.put_nowait((value, on_done))


async def test_a_child_start_does_not_wait_for_a_parent_start_being_dead_lettered():
    parent = spark(1, running=0)
    child = spark(2, running=0, parent=("spark-prod", "etl.t1", run_id(1)))
    collector, dead_letters = RefusingCollector({parent[0].body}), SlowDeadLetters()
    lane = CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", mode="coalesce"),
                         pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                         dead_letters=dead_letters)
    await lane.start()

    def write_state() -> None:
        for write in lane.table.take_writes():
            lane.table.written(write, ok=True)

    try:
        lane.offer(parent[0], 0.0)
        write_state()  # the parent's START goes to the collector, which refuses it
        value, acknowledge = await asyncio.wait_for(dead_letters.sent.get(), 5)
        assert value == parent[0].body  # dead-lettered, not yet acknowledged: still in the outbox
        lane.offer(child[0], 1.0)
        write_state()
        # It used to wait behind the parent's START for ever: the dispatcher was done with it.
        assert await asyncio.wait_for(collector.got.get(), 5) == child[0].body
        acknowledge()
        assert parent[0].ticket.released == 1 and await lane.drain(5)
    finally:
        await lane.close()


def test_a_long_run_remembers_the_digests_of_its_latest_events_only():
    """A run that streams RUNNINGs for days: its dedupe memory, written whole with each
    change of its state, stays bounded (the latest SEEN_MAX events'), and a duplicate of a
    recent event is still caught."""
    from relay.state.slots import SEEN_MAX

    events = spark(7, running=SEEN_MAX + 50)
    lane = Lane(mode="coalesce")
    for i, event in enumerate(events[:-1]):
        lane.offer(event, i * 0.001)
    lane.write()
    record = orjson.loads(lane.changelog[lane.table.key(run_id(7))])
    assert len(bytes.fromhex(record["seen"])) == SEEN_MAX * 16
    assert lane.table.is_duplicate(events[-2]) and lane.table.is_duplicate(events[-SEEN_MAX])
    assert not lane.table.is_duplicate(events[1])  # long forgotten


def _types(lane: Lane) -> list[str]:
    return [e.event_type for e, _ in lane.submitted]


@pytest.mark.parametrize("second_fails", [False, True])
def test_a_failed_write_does_not_let_a_later_acknowledged_one_send_its_events_first(second_fails):
    """A write fails (a batch refused for its size, written again) while a later write of
    the same run is in flight: the later record holds the earlier one's state and outbox,
    so its acknowledgement sends both, in order (it sent the RUNNING, then the START with
    the write after). If the later one fails too, both are written again, in order."""
    start, running, _ = spark(1)
    lane = Lane("coalesce")
    lane.offer(start, 0.0)
    [first] = lane.table.take_writes()
    lane.offer(running, 0.1)
    lane.tick(50.0)  # the RUNNING is due: forwarded behind the START
    [second] = lane.table.take_writes()
    assert [e.event_type for e in first.to_send + second.to_send] == ["START", "RUNNING"]
    lane.table.written(first, ok=False)
    assert lane.submitted == []
    lane.table.written(second, ok=not second_fails)
    if second_fails:
        assert lane.submitted == []
        lane.write()
    assert _types(lane) == ["START", "RUNNING"]
    assert lane.deliver_all() == ["START", "RUNNING"]
    assert lane.table.take_writes(include_deliveries=True)  # written once more, without the outbox


def test_a_later_write_failing_first_keeps_its_events_behind_an_earlier_write_in_flight():
    """The produce call itself can fail (a full queue), answered before an earlier write's
    acknowledgement: the earlier one's events go out first, the later ones with the next write."""
    start, running, _ = spark(1)
    lane = Lane("coalesce")
    lane.offer(start, 0.0)
    [first] = lane.table.take_writes()
    lane.offer(running, 0.1)
    lane.tick(50.0)
    [second] = lane.table.take_writes()
    lane.table.written(second, ok=False)
    lane.table.written(first, ok=True)
    assert _types(lane) == ["START"]
    lane.write(commit=False)
    assert _types(lane) == ["START", "RUNNING"]


def test_a_tombstone_that_fails_after_its_partition_was_revoked_is_not_written_again():
    """The partition's new owner may have written the run since: a tombstone made again
    after the revocation would delete that record."""
    lane = finished(Lane(finished_ttl_s=60.0))
    lane.tick(100.0)  # forgotten: its record is tombstoned
    [tombstone] = lane.table.take_writes()
    assert tombstone.value is None
    lane.table.written(tombstone, ok=False)
    [again] = lane.table.take_writes()  # still ours: made again
    assert again.value is None and again.key == tombstone.key
    lane.table.revoke({0})
    lane.table.written(again, ok=False)
    assert lane.table.take_writes(include_deliveries=True) == []


class BlockingCollector:
    """A collector that takes nothing until the test says so (deliveries stay in flight)."""

    name = "c"

    def __init__(self) -> None:
        self.started: asyncio.Queue[bytes] = asyncio.Queue()
        self.answer = asyncio.Event()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def deliver(self, body: bytes) -> Undeliverable | None:
        self.started.put_nowait(body)
        await self.answer.wait()
        return None


async def test_revoking_a_runs_partition_hands_over_its_events_read_from_another_partition():
    """A run whose events came on two partitions lives in its first partition's state. When
    that partition is revoked, the run's undelivered events go with its state to the new
    owner, which sends them; those read from the partition kept here are handed over too,
    or that partition's commits stopped at them for good."""
    start, running, _ = spark(1, partition=0)
    start.source = SourceRef("ol", 1, start.source.offset)  # same run, the other partition
    collector = BlockingCollector()
    lane = CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", mode="coalesce"),
                         pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                         dead_letters=SlowDeadLetters())
    await lane.start()

    def write_state() -> None:
        for write in lane.table.take_writes():
            lane.table.written(write, ok=True)

    try:
        lane.offer(running, 0.0)  # first, on partition 0: the run's state lives there
        lane.offer(start, 0.1)
        write_state()
        assert await asyncio.wait_for(collector.started.get(), 5) == start.body  # in flight
        assert start.ticket.released == 0 and running.ticket.released == 1
        lane.revoke({("ol", 0)})
        lane.abort({("ol", 0)})
        assert start.ticket.released == 1, "partition 1's commits would wait for its START for ever"
    finally:
        collector.answer.set()
        await lane.close()


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_state_written_by_an_earlier_version_with_events_decode_now_refuses_is_restored_and_sent(mode):
    """An earlier version took an eventTime with a space for T (Python's str(datetime)),
    and kept such events in run state: restoring or replaying them raised, and the relay
    stopped at every start. They are sent as they are; the collector judges them."""
    start, running, complete = spark(1)
    legacy = {"v": 1, "state": None, "outbox": []}
    old_complete = orjson.loads(complete.body)
    old_complete["eventTime"] = old_complete["eventTime"].replace("T", " ")
    if mode == "consolidated":  # written, not yet delivered: in the record's outbox
        lane = Lane(mode)
        lane.offer(start, 0.0)
        lane.write()
        lane.deliver_all()
        lane.write()
        record = orjson.loads(lane.changelog[lane.table.key(run_id(1))])
        record["outbox"] = [old_complete]
        legacy = record
    else:  # held before its START in coalesce mode
        lane = Lane(mode, missing_start_timeout_s=30.0)
        lane.offer(running, 0.0)
        lane.write()
        record = orjson.loads(lane.changelog[lane.table.key(run_id(1))])
        record["state"]["held"].append([record["state"]["held"][0][0] + 1, old_complete])
        legacy = record
    fresh = Lane(mode, missing_start_timeout_s=30.0)
    fresh.table.restore(run_id(1), 0, orjson.dumps(legacy), now=100.0)
    fresh.write()
    if mode == "coalesce":
        fresh.tick(200.0)  # no START came: the held events are replayed (raised here)
        fresh.write()
        fresh.deliver_all()
        fresh.write(commit=False)
    sent = [orjson.loads(e.body) for e, _ in fresh.submitted]
    assert old_complete in sent


async def test_a_write_acknowledged_after_its_runs_partition_was_revoked_hands_its_events_over():
    """The write holding a moved run's START (read from a partition kept here) was in flight
    at the revocation: once acknowledged, the START is durable in the record the new owner
    restores and sends, so it is settled here; it used to be neither sent nor settled, and
    the kept partition's commits stopped at it."""
    start, running, _ = spark(1, partition=0)
    start.source = SourceRef("ol", 1, start.source.offset)  # same run, the other partition
    lane = CollectorLane(BlockingCollector(), CollectorConfig(name="c", url="http://127.0.0.1:9", mode="coalesce"),
                         pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                         dead_letters=SlowDeadLetters())
    await lane.start()
    try:
        lane.offer(running, 0.0)  # first, on partition 0: the run's state lives there
        for write in lane.table.take_writes():
            lane.table.written(write, ok=True)
        lane.offer(start, 0.1)
        in_flight = lane.table.take_writes()
        lane.revoke({("ol", 0)})
        lane.abort({("ol", 0)})
        for write in in_flight:
            lane.table.written(write, ok=True)
        assert start.ticket.released == 1
        assert lane.pending == 0  # handed over, not sent from here
    finally:
        await lane.close()


def _marked_start_delivered() -> tuple[Lane, LineageEvent, LineageEvent]:
    """A run whose record is refused as too large twice: the record written marks its START
    (outbox left out), which is then sent and delivered."""
    start, complete = spark(1, running=0)
    lane = Lane(settle_s=1.0)
    lane.offer(start, 0.0)
    lane.offer(complete, 0.1)  # captured: the settle window is open
    for refused in (True, True, False):
        for write in lane.table.take_writes(include_deliveries=True):
            if refused:
                lane.table.written(write, False, too_large=True)
            else:
                lane.changelog[write.key] = write.value
                lane.table.written(write, True)
    assert isinstance(orjson.loads(lane.changelog[lane.table.key(run_id(1))])["outbox"][0], list)  # a mark
    assert complete.ticket.released == 1
    assert lane.deliver_all() == ["START"]
    return lane, start, complete


def test_a_marked_event_delivered_settles_only_once_a_record_without_its_mark_is_written():
    """The record on the topic marks the delivered START: its offset is committed only once
    a later record of the run (without the mark) is acknowledged. It used to settle on
    delivery; the commit's write failing (answered, not timed out), the commit passed the
    mark, and after a crash the restored outbox waited at it for ever (the consolidated
    COMPLETE never sent, the run kept in memory)."""
    lane, start, _ = _marked_start_delivered()
    assert start.ticket.released == 0
    lane.write(ok=False)  # the commit's write fails: its offset is not committed
    assert start.ticket.released == 0
    # kill -9: the START is read again from the committed offset and takes the mark's place.
    fresh = restored(lane, 100.0, settle_s=1.0)
    copy = decode_record(start.body, max_bytes=1 << 22, source=start.source)
    copy.ticket = Ticket()
    fresh.offer(copy, 100.0)
    sent = []
    for now in range(101, 105):
        fresh.tick(float(now))
        fresh.write()
        sent += fresh.deliver_all()
    assert sent == ["START", "COMPLETE"] and copy.ticket.released == 1
    assert fresh.table.runs == 0
    # Without the failure: the next acknowledged record settles it.
    lane.write()
    assert start.ticket.released == 1
    assert "outbox" not in orjson.loads(lane.changelog[lane.table.key(run_id(1))])


def _event(doc: dict) -> LineageEvent:
    event = decode_record(orjson.dumps(doc), max_bytes=1 << 22, source=SourceRef("ol", 0, next(_offsets)))
    event.ticket = Ticket()
    return event


@pytest.mark.parametrize("mode", ["passthrough", "coalesce"])
async def test_a_copy_of_an_other_after_its_runs_terminal_is_delivered_once(mode):
    """A producer's retry of an OTHER that follows its run's terminal, read once the run's
    final record was written (its slot and ``seen`` digests gone): the pipeline's deduper
    catches it, as a passthrough collector's. A coalesce collector used to deliver it twice."""
    start, complete = spark(1, running=0)
    other = orjson.loads(complete.body)
    other["eventType"] = "OTHER"
    other["eventTime"] = "2024-05-01T03:00:00.000Z"
    collector = RefusingCollector(set())
    lane = CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", mode=mode),
                         pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                         dead_letters=SlowDeadLetters())
    await lane.start()
    try:
        for now, event in enumerate([start, complete, _event(other), _event(other)]):
            lane.offer(event, float(now))
            for _ in range(3):  # written, delivered, written again (the last: final)
                if lane.table is not None:
                    for write in lane.table.take_writes(include_deliveries=True):
                        lane.table.written(write, ok=True)
                await lane.drain(5)
            if lane.table is not None and now == 1:
                assert lane.table.runs == 0  # the finished run's slot is gone
        got = []
        while not collector.got.empty():
            got.append(orjson.loads(collector.got.get_nowait())["eventType"])
        assert got == ["START", "COMPLETE", "OTHER"]
    finally:
        await lane.close()


def _open_consolidated_run() -> tuple[Lane, list[LineageEvent]]:
    """A consolidated run whose START is written (in its record's outbox) but not delivered,
    and whose RUNNING (a progress facet) is captured, its offset committable: the relay is
    then killed, and its collector's mode changed."""
    start, running, complete = events = spark(1)
    doc = orjson.loads(running.body)
    doc["run"]["facets"]["progress"] = {"_producer": "https://example.com", "_schemaURL":
                                        "https://example.com/P.json#/$defs/P", "percent": 50}
    events[1] = running = decode_record(orjson.dumps(doc), max_bytes=1 << 22, source=running.source)
    running.ticket = Ticket()
    lane = Lane("consolidated")
    lane.offer(start, 0.0)
    lane.offer(running, 0.5)
    lane.write()
    assert [e.event_type for e, _ in lane.submitted] == ["START"] and running.ticket.released == 1
    return lane, events


def test_a_run_saved_in_consolidated_mode_is_flushed_then_goes_on_in_coalesce_mode():
    """The collector's mode changed to coalesce: its open run's record was refused whole
    (run_state_unreadable), its undelivered START never sent and the facets captured from
    the RUNNING lost. The outbox goes out, then the merged view (the RUNNING it stands for);
    the run then goes on in coalesce mode, without a second START."""
    lane, (start, _, complete) = _open_consolidated_run()
    fresh = Lane("coalesce")
    fresh.table.restore(run_id(1), 0, lane.changelog[lane.table.key(run_id(1))], now=100.0)
    fresh.write()
    sent = [e for e, _ in fresh.submitted]
    assert [e.event_type for e in sent] == ["START", "RUNNING"]
    assert orjson.loads(sent[0].body) == orjson.loads(start.body)
    assert sent[1].doc["run"]["facets"]["progress"]["percent"] == 50
    fresh.deliver_all()
    fresh.write()
    assert orjson.loads(fresh.changelog[fresh.table.key(run_id(1))])["state"]["closed"] == "emitted"
    late = decode_record(complete.body, max_bytes=1 << 22, source=complete.source)
    late.ticket = Ticket()
    fresh.offer(late, 101.0)
    fresh.write()
    assert fresh.deliver_all() == ["COMPLETE"]


def test_a_run_saved_in_coalesce_mode_is_flushed_then_goes_on_in_consolidated_mode():
    start, running, complete = spark(1)
    lane = Lane("coalesce")
    lane.offer(start, 0.0)
    lane.offer(running, 0.5)  # merged, held for coalesce_window_s
    lane.write()
    assert lane.deliver_all() == ["START"]
    lane.write()
    fresh = Lane("consolidated", settle_s=1.0)
    assert fresh.table.restore(run_id(1), 0, lane.changelog[lane.table.key(run_id(1))], now=100.0)
    fresh.write()
    assert fresh.deliver_all() == ["RUNNING"]  # the merged RUNNING it held
    late = decode_record(complete.body, max_bytes=1 << 22, source=complete.source)
    late.ticket = Ticket()
    fresh.offer(late, 102.0)
    fresh.tick(104.0)
    fresh.write()
    assert fresh.deliver_all() == ["COMPLETE"]  # consolidated now, without a second START


async def test_a_run_saved_before_its_collector_became_passthrough_is_flushed_and_forgotten(caplog):
    """Switched to passthrough: the run's record was skipped as of an unknown collector. The
    passthrough lane's table of former runs sends its outbox and the merged view, then
    tombstones the record."""
    lane, _ = _open_consolidated_run()
    topic = CompactedTopic()
    topic.records.update(lane.changelog)
    collector = RefusingCollector(set())
    passthrough = CollectorLane(collector, CollectorConfig(name="c", url="http://127.0.0.1:9", mode="passthrough"),
                                pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("c"),
                                dead_letters=SlowDeadLetters())
    store = RunStateStore(topic, [passthrough.state_table], RelayMetrics())
    await passthrough.start()
    try:
        await store.restore([0], 100.0)
        for _ in range(3):
            await store.settle(5)
            await passthrough.drain(5)
        got = []
        while not collector.got.empty():
            got.append(orjson.loads(collector.got.get_nowait()))
        assert [d["eventType"] for d in got] == ["START", "RUNNING"]
        assert got[1]["run"]["facets"]["progress"]["percent"] == 50
        assert topic.records[lane.table.key(run_id(1))] is None  # tombstoned
        assert passthrough.state_table.runs == 0
        assert any(r.getMessage() == "run_state_mode_changed" for r in caplog.records)
        assert not any(r.getMessage() == "run_state_unreadable" for r in caplog.records)
    finally:
        await passthrough.close()
