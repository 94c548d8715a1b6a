"""RunStateStore: run-state records the broker refuses as too large. Plain data, the topic
a dict (:class:`~tests.support.changelog.CompactedTopic`)."""

from __future__ import annotations

import orjson

from relay.metrics import RelayMetrics
from relay.state.store import RunStateStore
from tests.relay.state.test_table import Lane, spark
from tests.support.changelog import CompactedTopic
from tests.support.dead_letters import padded

#: A broker's max.message.bytes: a run's record with the padded RUNNING merged is refused.
MAX_RECORD_BYTES = 30_000


def _padded(event):
    event.body = padded(event.body, 3 * MAX_RECORD_BYTES)
    event.doc = orjson.loads(event.body)
    return event


def _restored(topic: CompactedTopic, now: float) -> Lane:
    fresh = Lane("consolidated")
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
    # kill -9 before the run's next record: the new owner sends nothing again, and takes
    # the run for finished (a late copy of its events is dropped).
    fresh = _restored(topic, 100.0)
    fresh.write()
    assert [e.event_type for e, _ in fresh.submitted] == []
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
