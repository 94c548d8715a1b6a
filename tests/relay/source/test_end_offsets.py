"""EndOffsets against the real broker: the end offsets the consumer lag is measured to
while librdkafka fetches nothing (a paused partition, an unreachable broker)."""

from __future__ import annotations

import logging
import time

import pytest

from relay.embedded.broker import EmbeddedBroker
from relay.source.end_offsets import EndOffsets
from relay.source.offsets import Partition
from tests.support.kafka import produce
from tests.support.relay import eventually

pytestmark = pytest.mark.kafka

#: One record a batch: Tansu answers ListOffsets with the last batch's base offset + 1
#: (tests/support/kafka.end_offsets), Kafka with the offset the next record gets.
ONE_A_BATCH = {"batch.num.messages": 1}


def test_the_broker_states_the_end_offsets_and_one_gone_leaves_them_as_they_were(caplog):
    with EmbeddedBroker() as broker:
        broker.create_topic("events", 2)
        produce(broker.bootstrap_servers, "events", [(None, b"x")] * 7, partition=0, config=ONE_A_BATCH)
        produce(broker.bootstrap_servers, "events", [(None, b"y")] * 3, partition=1, config=ONE_A_BATCH)
        answers: list[bool] = []
        ends = EndOffsets({"bootstrap.servers": broker.bootstrap_servers}, timeout_s=1.0,
                          on_answer=lambda: answers.append(True))
        both = [("events", 0), ("events", 1)]
        assert eventually(lambda: asked(ends, both) == {("events", 0): 7, ("events", 1): 3}, 15), ends.known()
        assert answers
        # Only the partitions asked for: one given away has no end offset here any more.
        assert asked(ends, [("events", 1)]) == {("events", 1): 3}

        broker.stop()
        with caplog.at_level(logging.INFO, logger="relay"):
            slowest = 0.0

            def unanswered() -> bool:
                nonlocal slowest
                started = time.monotonic()
                known = asked(ends, both)
                slowest = max(slowest, time.monotonic() - started)
                assert known == {("events", 1): 3}  # kept, not forgotten nor failed
                return any(r.getMessage() == "end_offsets_unanswered" for r in caplog.records)
            assert eventually(unanswered, 15)
        # Asking never waits for the broker: it runs on the consumer's thread, between polls.
        assert slowest < 0.5, slowest
        ends.close()
        assert asked(ends, both) == {("events", 1): 3}


def asked(ends: EndOffsets, partitions: list[Partition]) -> dict[Partition, int]:
    ends.ask(partitions)
    return ends.known()
