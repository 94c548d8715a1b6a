"""KafkaSource's rebalance callbacks without a broker (a fake consumer): the time a
handler is given, and what a revocation whose handler failed leaves to commit."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import TopicPartition

from relay.source.kafka import HANDOVER_MARGIN_S, KafkaSource, SourceError

PART = ("ol", 0)


class FakeConsumer:
    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        pass


async def _nothing(partitions):  # noqa: ANN001, ANN202 - a RebalanceHandler
    return {}


def _source(on_revoke, max_poll_ms: str = "300000") -> KafkaSource:  # noqa: ANN001
    return KafkaSource(bootstrap_servers="127.0.0.1:9", group_id="g", topics=("ol",),
                       properties={"max.poll.interval.ms": max_poll_ms}, on_assign=_nothing, on_revoke=on_revoke)


async def test_a_handler_learns_what_is_left_of_max_poll_interval() -> None:
    seen: list[float] = []
    source = None

    async def revoke(partitions):  # noqa: ANN001, ANN202
        seen.append(source.handover_left())
        return {}
    source = _source(revoke, "15000")
    source._loop = asyncio.get_running_loop()
    assert source.handover_left() == float("inf")  # no handler running
    source.assignment = {PART}
    began = time.monotonic()
    await asyncio.to_thread(source._revoked, FakeConsumer(), [TopicPartition(*PART)])
    assert 15 - HANDOVER_MARGIN_S - (time.monotonic() - began) <= seen[0] <= 15 - HANDOVER_MARGIN_S
    assert source.handover_left() == float("inf") and source.assignment == set()


@pytest.mark.parametrize("failure", ["raised", "outlasted"])
async def test_a_failed_revocation_leaves_nothing_to_commit(failure: str) -> None:
    """The revoke handler failed (or outlasted max.poll.interval.ms): the partition stayed
    assigned, and the shutdown's commit committed it while another member owned it (its
    offset moved back: duplicates)."""
    release = asyncio.Event()

    async def revoke(partitions):  # noqa: ANN001, ANN202
        if failure == "raised":
            raise RuntimeError("the run state could not be written")
        await release.wait()
        return {}
    source = _source(revoke, "1000")
    source._loop = asyncio.get_running_loop()
    consumer = source._consumer = FakeConsumer()
    source.assignment = {PART}
    try:
        with pytest.raises((RuntimeError, SourceError)):
            await asyncio.wait_for(asyncio.to_thread(source._revoked, consumer, [TopicPartition(*PART)]), 30)
    finally:
        release.set()
    assert source.assignment == set()
    # The shutdown's commit: computed after the revocation (no later one to skip it by).
    source._commit_owned({PART: 7}, source.generation, lambda _part: True)
    assert consumer.commits == []
