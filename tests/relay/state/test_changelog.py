"""RunStateChangelog against a real broker: closing it while writes are still being flushed."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from relay.embedded.broker import EmbeddedBroker
from relay.state.changelog import FAILED, OK, TOO_LARGE, RunStateChangelog
from tests.support.kafka import produce
from tests.support.kafka_proxy import MESSAGE_TOO_LARGE, proxied_broker

pytestmark = pytest.mark.kafka


async def test_close_while_flushing_leaves_the_poll_thread_to_end_cleanly(kafka, monkeypatch):
    topic = kafka.new_topic("changelog-in", partitions=2)
    changelog = RunStateChangelog(bootstrap_servers=kafka.bootstrap_servers, topic=topic + ".state",
                                  input_topic=topic, create=True, producer_properties={}, consumer_properties={})
    await changelog.start()
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))

    class SlowFlush:
        """The real producer, whose last flush takes a while (a slow broker): the poll
        thread goes round several times meanwhile."""

        def __init__(self, producer) -> None:  # noqa: ANN001
            self._producer = producer

        def flush(self, timeout_s: float) -> int:
            time.sleep(0.35)  # ok: the slow flush this test is about, not a wait for a condition
            return self._producer.flush(timeout_s)

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self._producer, name)

    changelog._host.producer = SlowFlush(changelog._host.producer)
    answers: list[str] = []
    for i in range(20):
        changelog.write(i % 2, f"run-{i}".encode(), b"{}", answers.append)
    thread = changelog._host._thread
    await changelog.close()
    assert thread is not None and not thread.is_alive()
    assert failures == []
    assert await changelog.wait_acked(5) and answers == [OK] * 20


@pytest.mark.parametrize("refusals", [1, 2], ids=["refused_once", "refused_twice"])
async def test_a_state_write_refused_as_too_large_is_tried_again_before_it_counts_as_too_large(refusals):
    """The broker refuses a record batch for its size (through a fault proxy): each record
    in it may fit on its own, so the first refusal is a plain failure (the run is written
    again); only a second one in a row makes it too large (kept in memory only)."""
    with proxied_broker() as (broker, proxy):
        broker.create_topic("in", 1)
        changelog = RunStateChangelog(bootstrap_servers=broker.bootstrap_servers, topic="in.state",
                                      input_topic="in", create=True, producer_properties={}, consumer_properties={})
        await changelog.start()
        try:
            answers: list[str] = []
            proxy.refuse_produce(MESSAGE_TOO_LARGE, times=refusals)
            # As the store does, a failed run is written again at its next flush (paced here:
            # while the producer spoilt by the refusal is being replaced, a write fails at once,
            # and a loaded machine can take a second or more to replace it).
            deadline = time.monotonic() + 30
            for _ in range(300):
                changelog.write(0, b"c/run-1", b'{"state": 1}', answers.append)
                assert await changelog.wait_acked(15)
                if answers[-1] != FAILED or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)  # ok: the pace of the store's flushes, not a synchronisation
            # The refusal also replaces the producer: a write may fail meanwhile.
            assert answers[0] == FAILED and set(answers[:-1]) == {FAILED}, answers
            assert answers[-1] == (OK if refusals == 1 else TOO_LARGE), answers
            deadline = time.monotonic() + 15
            while changelog._host.replaced == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # ok: the poll interval of a wait with a deadline
            assert changelog._host.replaced >= 1, "the refusal replaces the producer"
        finally:
            await changelog.close()


async def test_reading_a_partition_back_reads_its_last_batch_whole():
    """The embedded broker answers ListOffsets with the last batch's first offset + 1: a
    read that stopped there restored 1,000 of these 5,000 runs (one batch)."""
    with EmbeddedBroker() as broker:
        broker.create_topic("in", 1)
        broker.create_topic("in.state", 1)
        runs = {f"run-{i}".encode(): f'{{"n": {i}}}'.encode() for i in range(5000)}
        produce(broker.bootstrap_servers, "in.state", [*runs.items(), (b"run-7", None), (b"run-8", b"last")],
                config={"linger.ms": 200})
        changelog = RunStateChangelog(bootstrap_servers=broker.bootstrap_servers, topic="in.state", input_topic="in",
                                      create=False, producer_properties={}, consumer_properties={})
        await changelog.start()
        try:
            got = await changelog.read_partition(0)
        finally:
            await changelog.close()
    del runs[b"run-7"]  # its tombstone
    runs[b"run-8"] = b"last"  # its latest value
    assert got == runs


async def test_a_run_state_of_several_megabytes_is_written_and_read_back():
    """A run's record holds its undelivered events, which reach tens of MB: at librdkafka's
    1 MB default, such a record was refused before it left the relay and the run was kept
    in memory only (a restart then went back to an older record)."""
    with EmbeddedBroker() as broker:
        broker.create_topic("in", 1)
        changelog = RunStateChangelog(bootstrap_servers=broker.bootstrap_servers, topic="in.state", input_topic="in",
                                      create=True, producer_properties={}, consumer_properties={})
        await changelog.start()
        try:
            value = b'{"outbox": ["' + bytes(random.Random(3).choices(b"abcdefghij", k=6_000_000)) + b'"]}'
            answers: list[str] = []
            changelog.write(0, b"c/run-1", value, answers.append)
            assert await changelog.wait_acked(30) and answers == [OK]
            assert await changelog.read_partition(0) == {b"c/run-1": value}
        finally:
            await changelog.close()
