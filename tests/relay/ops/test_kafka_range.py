"""Bounded reads of a topic (relay.ops.kafka_range) against a real broker."""

from __future__ import annotations

import pytest

from relay.ops.kafka_range import PartitionRange, open_consumer, read
from tests.support.kafka import produce
from tests.support.relay import relay_config

pytestmark = pytest.mark.kafka


def test_a_partition_read_to_its_range_end_can_be_read_again_with_the_same_consumer(kafka, monkeypatch):
    """A read pauses each partition it finished; the pause outlived unassign(), so a second
    read of that partition got nothing and gave up after the stall limit (a redrive reading
    back two originals from one source partition, or a value it had read before)."""
    monkeypatch.setattr("relay.ops.kafka_range._STALL_S", 3.0)
    topic = kafka.new_topic("t")
    produce(kafka.bootstrap_servers, topic, [(None, b"v%d" % i) for i in range(5)])
    config = relay_config(kafka.bootstrap_servers, topic, {"a": "http://127.0.0.1:9"}, group=kafka.new_group(),
                          dlq="unused")
    consumer = open_consumer(config.kafka, kafka.new_group())
    try:
        for start, end in ((1, 3), (2, 4), (0, 5)):
            got = [m.value() for m in read(consumer, topic, [PartitionRange(0, start, end)])]
            assert got == [b"v%d" % i for i in range(start, end)]
    finally:
        consumer.close()
