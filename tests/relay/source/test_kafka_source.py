"""KafkaSource against the real broker: what the relay's consumer settings guarantee."""

from __future__ import annotations

import asyncio
import time

from relay.source.kafka import KafkaSource
from tests.support.kafka import produce


async def _nothing(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
    return {}


def test_prefetch_queue_is_topped_up_while_the_relay_drains_it(kafka):
    """Once librdkafka's fetched-ahead queue is full it waits ``fetch.queue.backoff.ms``
    before fetching again, even if the queue was emptied meanwhile: with its default (1 s),
    a relay that drains the queue faster than that gets empty polls for up to a second per
    queue-full (measured: ~100 ms stalls every ~27k events at 25k events/s). Here the queue
    and each fetch are made small (64 KiB, ~20 records of 3 KB) so that the queue fills
    and is drained ~150 times: with the relay's default the next records are fetched at
    once and polls do not come back empty while the topic still holds records (with a
    1 s backoff, ~20 of them did per 1000 records)."""
    topic = kafka.new_topic("prefetch")
    total = 3000
    produce(kafka.bootstrap_servers, topic, [(None, b"x" * 3000) for _ in range(total)])

    async def main() -> tuple[int, int]:
        source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, group_id=kafka.new_group(),
                             topics=(topic,), on_assign=_nothing, on_revoke=_nothing,
                             properties={**kafka.consumer_properties(), "queued.max.messages.kbytes": "64",
                                         "queued.min.messages": "20", "fetch.max.bytes": "65536",
                                         "max.partition.fetch.bytes": "65536",
                                         "message.max.bytes": "10000"})
        await source.start()
        got = empty_after_first = 0
        deadline = time.monotonic() + 120
        try:
            while got < total and time.monotonic() < deadline:
                (messages, _generation) = await source.poll_soon(500, 0.1, then=lambda ms: [
                    m for m in ms if m.error() is None])
                if got and not messages:
                    empty_after_first += 1
                got += len(messages)
        finally:
            await source.close()
        return got, empty_after_first

    got, empty = asyncio.run(main())
    assert got == total
    assert empty <= 5, f"{empty} polls came back empty while {total - got} records were still unread"
