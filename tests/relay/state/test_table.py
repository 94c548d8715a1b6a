"""RunStateTable: write-ahead of what held runs send, tickets settled by acknowledgements,
restore after a crash, closed runs, revocation. Plain data, no broker."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import orjson

from relay.embedded.sample import spark_run
from relay.events import LineageEvent, SourceRef
from relay.stages.consolidate import RunConsolidator
from relay.stages.decode import decode_record
from relay.state.table import RunStateTable

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
_offsets = iter(range(1 << 30))


class Ticket:
    def __init__(self) -> None:
        self.released = 0

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
        for event, _ in self.submitted:
            if event.ticket is not None:
                event.ticket.release()
            self.table.delivered(event)
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


def test_a_finished_run_is_written_as_closed_then_tombstoned_when_forgotten():
    lane = Lane(finished_ttl_s=60.0)
    for event in spark(1):
        lane.offer(event, 0.0)
    lane.tick(2.0)
    for _ in range(3):
        lane.write()
        lane.deliver_all()
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
