"""KafkaSource against the real broker: what the relay's consumer settings guarantee."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay.source.kafka import KafkaSource
from tests.support.kafka import produce

pytestmark = pytest.mark.kafka


async def _nothing(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
    return {}


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
