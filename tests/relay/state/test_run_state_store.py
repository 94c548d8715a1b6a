"""RunStateStore: run-state records the broker refuses as too large. Plain data, the topic
a dict (:class:`~tests.support.changelog.CompactedTopic`)."""

from __future__ import annotations

import orjson

from relay.metrics import RelayMetrics
from relay.stages.decode import decode_record
from relay.state.store import RunStateStore
from tests.relay.state.test_table import Lane, Ticket, spark
from tests.support.changelog import CompactedTopic
from tests.support.dead_letters import padded

#: A broker's max.message.bytes: a run's record with the padded RUNNING merged is refused.
MAX_RECORD_BYTES = 30_000


def _padded(event):
    event.body = padded(event.body, 3 * MAX_RECORD_BYTES)
    event.doc = orjson.loads(event.body)
    return event


def _restored(topic: CompactedTopic, now: float, mode: str = "consolidated") -> Lane:
    fresh = Lane(mode)
    for key, value in topic.records.items():
        if value is not None:
            fresh.table.restore(key.decode().partition("/")[2], 0, value, now=now)
    return fresh


async def test_a_run_whose_state_grows_too_large_never_has_its_start_sent_again_after_its_terminal(caplog):
    """START written and delivered, then a RUNNING with a large facet makes the run's record
    too large. It used to be settled as if written: the topic kept the record that listed
    the START as unsent, and after a crash following the delivered consolidated COMPLETE
    the new owner sent that START again, after the terminal, and kept the run open. The
    record is written reduced instead (merged facets, then outbox left out)."""
    start, running, complete = spark(1)
    lane = Lane("consolidated", settle_s=1.0)
    topic = CompactedTopic(max_record_bytes=MAX_RECORD_BYTES)
    store = RunStateStore(topic, [lane.table], RelayMetrics())
    lane.offer(start, 0.0)
    await store.settle(5)
    assert lane.deliver_all() == ["START"]
    lane.offer(_padded(running), 0.5)
    lane.offer(complete, 0.6)
    for _ in range(3):  # commits: refused whole, written without its merged facets
        await store.settle(5)
    assert running.ticket.released == 1 and complete.ticket.released == 1
    lane.tick(2.0)  # the consolidated COMPLETE (the large facet merged in) is forwarded
    for _ in range(3):  # refused with its outbox too, written without it: the COMPLETE goes out
        await store.settle(5)
    assert lane.deliver_all() == ["COMPLETE"]
    # kill -9 before the run's next record: the new owner sends the COMPLETE again (the
    # last output, at least once: as from a whole record), never the START, and takes the
    # run for finished (a late copy of its events is dropped).
    fresh = _restored(topic, 100.0)
    fresh.write()
    assert fresh.deliver_all() == ["COMPLETE"]
    late = spark(1)[1]
    fresh.offer(late, 101.0)
    fresh.tick(110.0)
    fresh.write()
    assert fresh.submitted == [] and late.ticket.released == 1
    assert any(r.getMessage() == "run_state_reduced" for r in caplog.records)


async def test_a_run_written_without_its_merged_facets_is_restored_without_them():
    """What a restore loses when a run's record is too large: the facets merged before the
    reduced record (its terminal is built from what is merged after the restore)."""
    start, running, complete = spark(1)
    lane = Lane("consolidated", settle_s=1.0)
    topic = CompactedTopic(max_record_bytes=MAX_RECORD_BYTES)
    store = RunStateStore(topic, [lane.table], RelayMetrics())
    lane.offer(start, 0.0)
    lane.offer(_padded(running), 0.5)
    for _ in range(3):
        await store.settle(5)
    assert lane.deliver_all() == ["START"]
    await store.settle(5)
    fresh = _restored(topic, 100.0)
    fresh.offer(complete, 100.0)
    fresh.tick(110.0)
    fresh.write()
    [(terminal, _)] = fresh.submitted
    assert terminal.event_type == "COMPLETE"
    assert "padding" not in terminal.doc["run"]["facets"]
    assert "processing_engine" in terminal.doc["run"]["facets"]  # the COMPLETE's own


def large_copy(event):
    """``event`` with a large run facet, as the input topic holds it (its digest that of its body)."""
    large = decode_record(padded(event.body, 3 * MAX_RECORD_BYTES), max_bytes=1 << 22, source=event.source)
    large.ticket = Ticket()
    return large


def read_again(events):
    """Copies of ``events`` as the input topic gives them again after a crash (same offsets)."""
    out = []
    for event in events:
        copy = decode_record(event.body, max_bytes=1 << 22, source=event.source)
        copy.ticket = Ticket()
        out.append(copy)
    return out


async def _crash_before_delivery(mode: str, *, settle_s: float = 1.0):
    """A run whose record is too large even without its merged facets (a large START, sent
    as itself), its collector down; kill -9. Returns what the run was offered (the input
    topic's records), the lane, and the lane of the new owner (restored from the topic)."""
    start, running, complete = events = spark(1)
    events[0] = start = large_copy(start)
    lane = Lane(mode, settle_s=settle_s)
    topic = CompactedTopic(max_record_bytes=MAX_RECORD_BYTES)
    store = RunStateStore(topic, [lane.table], RelayMetrics())
    lane.offer(start, 0.0)
    lane.offer(running, 0.5)
    lane.offer(complete, 0.6)
    lane.tick(2.0)
    for _ in range(4):  # refused whole, refused without merged facets, written reduced
        await store.settle(5)
    assert [e.event_type for e, _ in lane.submitted][:1] == ["START"]  # collector down: none delivered
    assert start.ticket.released == 0  # its offset is not committed: read again after the crash
    if mode == "coalesce":
        assert complete.ticket.released == 0
    return events, lane, _restored(topic, 100.0, mode)


async def test_a_run_written_without_its_outbox_loses_nothing_after_a_crash_consolidated():
    """The record leaves out the run's outbox (the large START, then the consolidated
    COMPLETE with it merged in): the START's offset stays uncommitted until it is delivered,
    the record marks it, and the new owner sends its copy read again, then the COMPLETE
    (built without the merged facets); a copy of the others is dropped. It used to send
    nothing (the START read again after the record's terminal was dropped)."""
    events, _, fresh = await _crash_before_delivery("consolidated")
    fresh.write()
    assert fresh.submitted == []  # the COMPLETE waits for the START before it
    for copy in read_again(events):
        fresh.offer(copy, 101.0)
    fresh.tick(110.0)
    fresh.write()
    assert fresh.deliver_all() == ["START"]
    fresh.write()
    sent = fresh.submitted
    assert [e.event_type for e, _ in sent] == ["COMPLETE"]
    assert "padding" not in sent[0][0].doc["run"]["facets"]  # merged facets: left out
    assert fresh.deliver_all() == ["COMPLETE"]
    fresh.write()
    assert fresh.submitted == [] and fresh.table.runs == 0
    # Its record says the run finished with nothing to send: after another crash, its
    # events read again send nothing (no second terminal).
    again = Lane("consolidated")
    for key, value in fresh.changelog.items():
        if value is not None:
            again.table.restore(key.decode().partition("/")[2], 0, value, now=200.0)
    for copy in read_again(events):
        again.offer(copy, 201.0)
    again.tick(210.0)
    again.write()
    assert again.submitted == []


async def test_a_run_written_without_its_outbox_loses_nothing_after_a_crash_coalesce():
    """Coalesce: START and COMPLETE are sent as themselves, the RUNNING merged: all three go
    out after the crash, in order, the terminal once."""
    events, _, fresh = await _crash_before_delivery("coalesce", settle_s=0.0)
    for copy in read_again(events):
        fresh.offer(copy, 101.0)
    fresh.tick(110.0)
    sent = []
    for _ in range(4):
        fresh.write()
        sent += fresh.deliver_all()
    assert sent == ["START", "RUNNING", "COMPLETE"]
    assert fresh.table.runs == 0


async def test_a_left_out_event_delivered_before_the_crash_is_not_waited_for():
    """A record marks a left-out event that was delivered (and its offset committed) before
    a later record could be written: a later event of its run and partition read again shows
    it will not come back; the run's outbox goes on without it."""
    start, running, complete = events = spark(1)
    events[0] = start = large_copy(start)
    lane = Lane("coalesce", settle_s=0.0)
    topic = CompactedTopic(max_record_bytes=MAX_RECORD_BYTES)
    store = RunStateStore(topic, [lane.table], RelayMetrics())
    lane.offer(start, 0.0)
    lane.offer(running, 0.5)
    lane.offer(complete, 0.6)
    for _ in range(4):
        await store.settle(5)
    fresh = _restored(topic, 100.0, "coalesce")
    for copy in read_again(events)[1:]:  # the START's offset was committed
        fresh.offer(copy, 101.0)
    sent = []
    for _ in range(4):
        fresh.write()
        sent += fresh.deliver_all()
    assert sent == ["RUNNING", "COMPLETE"]
