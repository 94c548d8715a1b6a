"""Back-pressure: at a lane's limit the relay holds consumption off, and pauses the
partitions only when the hold lasts (a collector down), resuming once it has drained."""

from __future__ import annotations

import logging

import orjson
import pytest

from relay import backpressure
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def canonical_set(stream: list[tuple[bytes, bytes]]) -> set[bytes]:
    return {orjson.dumps(orjson.loads(v), option=orjson.OPT_SORT_KEYS) for _, v in stream}


def test_a_backlog_over_a_lanes_limit_drains_without_pausing_the_partitions(kafka, caplog, monkeypatch):
    """Pausing makes librdkafka drop what it fetched ahead and, once resumed, fetch nothing
    for up to a second: a backlog bigger than the lane's limit must drain without it."""
    # Each hold at the limit lasts until half of it is delivered; a collector that keeps up
    # never holds it for long, but a loaded machine (CI) may take more than the real 3 s:
    # a hold that long would be a stalled collector, which is not what this test is about
    # (the next test pauses with the real hold).
    monkeypatch.setattr(backpressure, "HOLD_S", 20.0)
    caplog.set_level(logging.INFO)
    topic, dlq = kafka.new_topic("ol", partitions=2), kafka.new_topic("dlq")
    stream = sample_stream(300, seed=11)
    assert len(stream) > 1000
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        config = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(),
                              dlq=dlq, collector={"max_pending": 100})
        with RelayThread(config):
            assert collector.wait_for(lambda c: c.count >= len(stream), 60), f"got {collector.count}"
        events = collector.events()
    assert {orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in events} == canonical_set(stream)
    assert len(events) == len(stream)
    assert "consumption_paused" not in caplog.text


def test_a_collector_down_longer_than_the_hold_pauses_consumption_then_resumes(kafka, caplog):
    caplog.set_level(logging.INFO)
    topic, dlq = kafka.new_topic("ol", partitions=2), kafka.new_topic("dlq")
    stream = sample_stream(60, seed=12)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        collector.set_outage(503)
        config = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(),
                              dlq=dlq, collector={"max_pending": 20})
        with RelayThread(config) as relay:
            assert eventually(lambda: relay.relay is not None and relay.relay.source.paused
                              and relay.metric("lineage_relay_consumption_paused") == 1, 30), \
                "consumption was never paused while the collector was down"
            assert collector.count == 0
            collector.clear_outage()
            assert collector.wait_for(lambda c: c.count >= len(stream), 60), f"got {collector.count}"
            assert eventually(lambda: not relay.relay.source.paused
                              and relay.metric("lineage_relay_consumption_paused") == 0, 10)
    assert "consumption_paused" in caplog.text and "consumption_resumed" in caplog.text
    assert {orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in collector.events()} == canonical_set(stream)

