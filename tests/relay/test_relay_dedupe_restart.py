"""Dedupe across a restart, against a real broker: a copy of an event in another partition
is not proof the event reached the collector."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import orjson
import pytest

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES
from relay.embedded.sample import message_key, spark_run
from tests.support.kafka import committed_offsets, produce
from tests.support.kind_servers import MARQUEZ, KindServer
from tests.support.relay import RelayThread, eventually

pytestmark = pytest.mark.kafka


def test_a_copy_committed_in_another_partition_does_not_hide_the_event_after_a_restart(kafka):
    """The collector is down: event E (partition 0) waits to be retried, its byte-identical
    copy (partition 1) is a duplicate and partition 1's commit passes it. The relay stops with
    E undelivered. The next one read the committed copy back (the look-back) and took E, read
    again from partition 0, for a duplicate: committed, never delivered."""
    topic, group = kafka.new_topic("copies", partitions=2), kafka.new_group()
    event = spark_run("ns", "etl.copied", start=datetime(2024, 5, 1, 2, 0, tzinfo=UTC), rng=random.Random(5),
                      with_running=1)[1]
    key, value = message_key(event).encode(), orjson.dumps(event)

    with KindServer(MARQUEZ) as marquez:
        config = build_config({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                      "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.2,
                      "create_dlq_topic": True, "dlq_topic": kafka.new_topic("copies-dlq")},
            "collectors": [{"name": "marquez", "type": "marquez", "url": marquez.url,
                            "retry": {"initial_backoff_s": 0.05, "max_backoff_s": 0.2}}],
            "pipeline": {"ordering": {"enabled": False}},
            "http": {"port": None}, "drain_timeout_s": 1})
        marquez.outage = 503
        with RelayThread(config) as relay:
            produce(kafka.bootstrap_servers, topic, [(key, value)], partition=0)
            assert marquez.wait_for(lambda s: len(s.seen()) >= 1, 30)  # E is being retried
            produce(kafka.bootstrap_servers, topic, [(key, value)], partition=1)
            assert eventually(lambda: relay.metric("lineage_relay_events_deduplicated_total",
                                                   collector="marquez") == 1, 30)
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 2).get(1) == 1, 30)
        assert committed_offsets(kafka.bootstrap_servers, topic, group, 2).get(0, -1) <= 0  # E not delivered
        assert marquez.received() == []
        marquez.outage = None
        with RelayThread(config):
            assert marquez.wait_for(lambda s: len(s.received()) == 1, 30), "E never reached the collector"
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 2) == {0: 1, 1: 1}, 30)
        assert marquez.received() == [event]
