"""Lookback against a real broker: exactly the records before the group's committed offset,
at most ``max_records`` of them per partition, decoded; an unreachable broker or a read
out of time is logged and never raised."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from relay.config import KafkaConfig, LookbackConfig
from relay.embedded.broker import free_port
from relay.embedded.sample import sample_stream
from relay.source.lookback import Lookback
from tests.support.kafka import produce

pytestmark = pytest.mark.kafka


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def lookback(bootstrap: str, primed: list, topic: str = "events", group: str = "g", **config) -> Lookback:  # noqa: ANN003
    kafka = KafkaConfig(bootstrap_servers=bootstrap, topics=(topic,), group_id=group)
    return Lookback(kafka, LookbackConfig(**config), max_bytes=1 << 20,
                    prime=lambda event, now: primed.append(event))


async def test_reads_back_the_last_max_records_before_the_committed_offset(kafka):
    topic, group = kafka.new_topic("lookback", partitions=2), kafka.new_group()
    records = list(sample_stream(10, seed=21)[:30])
    records[17] = (b"bad", b"not json")  # undecodable: read, not handed over
    produce(kafka.bootstrap_servers, topic, records, partition=0)
    produce(kafka.bootstrap_servers, topic, records[:3], partition=1)  # nothing committed there
    commit(kafka.bootstrap_servers, group, {(topic, 0): 20})
    primed: list = []
    reader = lookback(kafka.bootstrap_servers, primed, topic, group, max_records=5)
    try:
        assert await reader.prime([(topic, 0), (topic, 1)]) == 4
    finally:
        reader.close()
    assert [(e.source.partition, e.source.offset) for e in primed] == [(0, 15), (0, 16), (0, 18), (0, 19)]
    assert [e.body for e in primed] == [records[i][1] for i in (15, 16, 18, 19)]


async def test_an_unreachable_broker_is_logged_and_not_raised(caplog):
    primed: list = []
    reader = lookback(f"127.0.0.1:{free_port()}", primed, timeout_s=1)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="relay"):
            assert await reader.prime([("events", 0)]) == 0
    finally:
        reader.close()
    assert time.monotonic() - began < 15
    failed = [r for r in caplog.records if r.getMessage() == "lookback_failed"]
    assert failed and failed[0].fields["partitions"] == "events/0" and primed == []
