"""KafkaSource against the real broker: what the relay's consumer settings guarantee."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from relay.source.kafka import KafkaSource
from relay.source.offsets import OffsetTracker
from tests.support.kafka import committed_offsets, produce

pytestmark = pytest.mark.kafka


async def _nothing(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
    return {}


async def joined(source: KafkaSource, timeout_s: float = 30) -> None:
    """Poll until the group assigned ``source`` its partitions (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    while not source.assignment and time.monotonic() < deadline:
        await source.poll_soon(10, 0.2, then=lambda ms: len(ms))


def test_consumer_refetches_soon_after_its_prefetch_queue_was_full(kafka):
    """Once librdkafka's fetched-ahead queue has been full it waits ``fetch.queue.backoff.ms``
    before fetching again, even if the queue was emptied meanwhile. With librdkafka's
    default (1 s), a relay that drains the queue faster than that waits up to a second per
    queue-full with nothing to do (measured in the pipeline alone: 25.5k events/s, against
    39-40k with the relay's default). Here the queue and each fetch are small (256 KiB and
    64 KiB; records of 3 KB) so that the queue fills and is drained dozens of times: the
    longest waits between two polls that return records stay well under a second (with
    librdkafka's default, every one of the longest ten is ~1 s)."""
    topic = kafka.new_topic("prefetch")
    total = 6000
    produce(kafka.bootstrap_servers, topic, [(None, b"x" * 3000) for _ in range(total)])

    async def main() -> tuple[int, list[float]]:
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=kafka.new_group(),
                             topics=(topic,), on_assign=_nothing, on_revoke=_nothing,
                             properties={**kafka.consumer_properties(), "queued.max.messages.kbytes": "256",
                                         "fetch.max.bytes": "65536", "max.partition.fetch.bytes": "65536",
                                         "message.max.bytes": "10000"})
        await source.start()
        got, waits, last = 0, [], None
        deadline = time.monotonic() + 120
        try:
            while got < total and time.monotonic() < deadline:
                messages, _generation = await source.poll_soon(500, 0.1, then=lambda ms: [
                    m for m in ms if m.error() is None])
                if messages:
                    now = time.monotonic()
                    if last is not None:
                        waits.append(now - last)
                    last = now
                got += len(messages)
        finally:
            await source.close()
        return got, waits

    got, waits = asyncio.run(main())
    assert got == total
    longest = sorted(waits, reverse=True)
    # The third longest: one or two scheduling hiccups on a busy machine do not count.
    assert longest[2] < 0.6, f"polls waited up to {longest[:10]} s for records the topic still held"


def test_offsets_settled_after_the_last_commit_are_committed_when_close_revokes(kafka):
    """librdkafka revokes the assignment from inside ``close()``; what the relay's revoke
    handler returns then (deliveries settled after its last commit) is committed through
    the consumer the callback was given. It used to fail an assertion there, so the relay's
    shutdown stopped half-way (nothing else closed) and those offsets were read again.
    Offsets for partitions no longer assigned are not committed by ``commit()``: one queued
    behind a rebalance that revoked them would move the group's offset back."""
    topic, elsewhere = kafka.new_topic("close"), kafka.new_topic("not-assigned")
    produce(kafka.bootstrap_servers, topic, [(None, b"x")] * 10)
    produce(kafka.bootstrap_servers, elsewhere, [(None, b"y")] * 10)
    group = kafka.new_group()
    revokes: list = []

    sources: list[KafkaSource] = []
    rebalancing: list = []

    async def on_revoke(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
        revokes.append(partitions)
        rebalancing.append(sources[0].rebalancing_since)  # what /healthz reads meanwhile
        return {(topic, 0): 7}

    async def main() -> bool:
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=group, topics=(topic,),
                             on_assign=_nothing, on_revoke=on_revoke, properties=kafka.consumer_properties())
        sources.append(source)
        await source.start()
        try:
            await joined(source)
            assert source.assignment == {(topic, 0)}
            committed = await source.commit({(topic, 0): 3, (elsewhere, 0): 5})
        finally:
            await source.close()
        return committed

    assert asyncio.run(main()) is True
    assert revokes == [[(topic, 0)]]
    assert rebalancing[0] is not None and sources[0].rebalancing_since is None
    assert committed_offsets(kafka.bootstrap_servers, topic, group, 1) == {0: 7}
    assert committed_offsets(kafka.bootstrap_servers, elsewhere, group, 1)[0] < 0  # nothing committed


def test_a_commit_queued_behind_a_revocation_skips_the_partition_even_when_assigned_back(kafka):
    """Offsets computed before a poll whose rebalance revoked a partition (committing its
    newer offsets) and assigned it back: committing them afterwards would move the group's
    offset back, so they are skipped though the partition is assigned again."""
    topic = kafka.new_topic("requeued")
    produce(kafka.bootstrap_servers, topic, [(None, b"x")] * 10)
    group = kafka.new_group()

    async def main() -> None:
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=group, topics=(topic,),
                             on_assign=_nothing, on_revoke=_nothing, properties=kafka.consumer_properties())
        await source.start()
        try:
            await joined(source)
            assert await source.commit({(topic, 0): 6})
            loop, busy = asyncio.get_running_loop(), threading.Event()
            # The consumer's thread is polling; its rebalance revokes the partition (after
            # committing 6) and assigns it back: it stays in source.assignment.
            polling = loop.run_in_executor(source._executor, busy.wait, 10)
            rebalance = loop.run_in_executor(source._executor, source._mark_revoked, [(topic, 0)])
            stale = asyncio.ensure_future(source.commit({(topic, 0): 3}))  # computed before the poll
            await asyncio.sleep(0)  # ok: one turn of the loop, not a wait: the commit queues behind the poll
            busy.set()
            await asyncio.gather(polling, rebalance)
            assert await stale is True and source.assignment == {(topic, 0)}
            # Not moved back to 3 (a restart would have re-read offsets 3-5).
            assert await asyncio.to_thread(committed_offsets, kafka.bootstrap_servers, topic, group, 1) == {0: 6}
            assert await source.commit({(topic, 0): 8})  # computed after: committed
        finally:
            await source.close()

    asyncio.run(main())
    assert committed_offsets(kafka.bootstrap_servers, topic, group, 1) == {0: 8}


def test_a_commit_computed_as_a_revocation_begins_never_moves_the_offset_back(kafka):
    """The consumer's thread counts a revocation (the generation) as it begins, before the
    revoke handler runs on the loop. Offsets the loop computes in between, from the
    tracker's state before the revocation, came with the new generation; queued behind the
    poll, they were committed after the revocation had committed newer ones and the
    partition had been assigned back: the group's offset moved back (a restart re-read
    what was delivered). The tracker's partition log, given up by the revocation, keeps
    them out."""
    topic = kafka.new_topic("revoking")
    produce(kafka.bootstrap_servers, topic, [(None, b"x")] * 10)
    group, part = kafka.new_group(), (topic, 0)
    tracker = OffsetTracker()

    async def revoked(partitions):  # noqa: ANN001, ANN202 - the relay's: the final offsets
        return tracker.revoke(partitions)

    async def assigned_back(partitions):  # noqa: ANN001, ANN202 - and a record read again
        tracker.track(part, 10)
        return {}

    async def main() -> None:
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=group, topics=(topic,),
                             on_assign=_nothing, on_revoke=_nothing, properties=kafka.consumer_properties())
        await source.start()
        try:
            await joined(source)
            tickets = [tracker.track(part, offset) for offset in range(10)]
            for ticket in tickets[:6]:
                ticket.release()
            assert await source.commit(tracker.committable())
            counted, go = threading.Event(), threading.Event()

            def rebalance() -> None:  # on the consumer's thread, as inside a poll
                source._mark_revoked([part])
                counted.set()
                go.wait(10)
                source._commit_now(source._hand_over(revoked, [part]))
                source._hand_over(assigned_back, [part])
            loop = asyncio.get_running_loop()
            polling = loop.run_in_executor(source._executor, rebalance)
            assert await asyncio.to_thread(counted.wait, 10)
            for ticket in tickets[6:8]:
                ticket.release()
            offsets = tracker.committable()  # computed before the revoke handler ran
            assert offsets == {part: 8}
            stale = asyncio.ensure_future(source.commit(offsets, tracker.still_owned(offsets)))
            await asyncio.sleep(0)  # ok: one turn of the loop, not a wait: the commit queues behind the poll
            for ticket in tickets[8:]:
                ticket.release()  # settled before the revocation: it commits 10
            go.set()
            await polling
            assert await stale is True and source.assignment == {part}
            assert await asyncio.to_thread(committed_offsets, kafka.bootstrap_servers, topic, group, 1) == {0: 10}
        finally:
            await source.close()

    asyncio.run(main())


def test_a_rebalance_handler_that_outlasts_max_poll_interval_stops_the_consumer_with_the_fix(kafka):
    """Restoring run state and the look-back run inside the assignment callback, while the
    consumer does not poll. Past max.poll.interval.ms the group removes the member anyway,
    so that is how long the handler may take (it was a fixed 60 s, which a large run
    state outlasted: the relay crashed at every start); past it, the error names the key."""
    topic = kafka.new_topic("slow-assign")
    produce(kafka.bootstrap_servers, topic, [(None, b"x")])
    forever = None

    async def stuck(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
        await forever.wait()

    async def main() -> Exception | None:
        nonlocal forever
        forever = asyncio.Event()
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=kafka.new_group(), topics=(topic,),
                             on_assign=stuck, on_revoke=_nothing,
                             properties={**kafka.consumer_properties(), "max.poll.interval.ms": "7000"})
        await source.start()
        began = time.monotonic()
        try:
            while time.monotonic() - began < 60:
                await source.poll_soon(10, 0.2, then=len)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            return err
        finally:
            forever.set()
            # librdkafka's close has been seen to wait for ever after a failed assignment
            # callback: close() is bounded, so that a relay stopping on this error exits.
            closing = time.monotonic()
            await source.close(timeout_s=5)
            closed_in.append(time.monotonic() - closing)
        return None

    closed_in: list[float] = []
    error = asyncio.run(main())
    assert closed_in and closed_in[0] < 15
    assert type(error).__name__ == "SourceError", repr(error)
    assert "max.poll.interval.ms (7 s)" in str(error) and "kafka.consumer_properties" in str(error)
