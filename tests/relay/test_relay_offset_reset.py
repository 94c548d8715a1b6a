"""A committed offset the partition no longer holds: the topic was deleted and recreated (its
offsets start again at 0), or retention removed records before the relay read them.

librdkafka then resets the position to the earliest record. The relay delivers what the
partition holds (none of it was delivered: the look-back must not take it for what came
before the commit) and says that it happened: an ``offset_reset`` warning with the
offsets, and ``lineage_relay_offset_resets_total``."""

from __future__ import annotations

import logging

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from relay.embedded.broker import EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.relay.test_relay_end_to_end import assert_run_order
from tests.support.kafka import committed_offsets, produce
from tests.support.kafka_proxy import FETCH, OFFSET_OUT_OF_RANGE, proxied_broker
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka

#: The group's committed offset from before the topic was recreated.
OLD_OFFSET = 500


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


@pytest.mark.parametrize(("max_records", "strategy"), [(10_000, None), (0, None), (10_000, "range")],
                         ids=["lookback", "no-lookback", "eager-assignment"])
def test_a_committed_offset_beyond_the_partition_end_is_reset_reported_and_nothing_lost(caplog, max_records,
                                                                                         strategy):
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        stream = sample_stream(8, seed=17, out_of_order_ratio=0.0)
        produce(broker.bootstrap_servers, "events", stream)
        # The group's offsets from the topic's previous life, far beyond what it holds now.
        commit(broker.bootstrap_servers, "g", "events", {0: OLD_OFFSET, 1: OLD_OFFSET})
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              pipeline={"lookback": {"max_records": max_records}})
        if strategy is not None:  # the eager protocol: the whole assignment at each rebalance
            config = config.model_copy(update={"kafka": config.kafka.model_copy(update={"consumer_properties": {
                **config.kafka.consumer_properties, "partition.assignment.strategy": strategy}})})
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
            assert collector.wait_for(lambda c: c.count == len(stream), 60), \
                f"{len(stream) - collector.count} of {len(stream)} events not delivered"
            assert eventually(lambda: sorted(committed_offsets(broker.bootstrap_servers, "events", "g", 2).values())
                              != [OLD_OFFSET, OLD_OFFSET], 30)
            assert eventually(lambda: relay.metric("lineage_relay_offset_resets_total", topic="events") == 2, 30)
            assert relay.metric("lineage_relay_events_deduplicated_total", collector="c") == 0
        assert relay.error is None
    assert {orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in collector.events()} == \
        {orjson.dumps(orjson.loads(v), option=orjson.OPT_SORT_KEYS) for _, v in stream}
    assert_run_order(collector.events())
    resets = [r for r in caplog.records if r.getMessage() == "offset_reset"]
    assert sorted(r.fields["partition"] for r in resets) == [0, 1]
    for r in resets:
        assert r.levelno == logging.WARNING
        assert (r.fields["topic"], r.fields["from_offset"], r.fields["to_offset"], r.fields["low"]) == \
            ("events", OLD_OFFSET, 0, 0)
        assert r.fields["cause"] == "beyond_end" and r.fields["records_lost"] == 0
        assert 0 < r.fields["high"] < OLD_OFFSET and "recreated" in r.fields["hint"]
    assert sum(r.fields["high"] for r in resets) == len(stream)


def test_a_relay_restarted_at_its_committed_offset_is_not_reset(caplog):
    # The embedded broker answers ListOffsets with the last batch's first offset + 1, below
    # a committed offset inside that batch: the check must confirm the end by fetching, or
    # every restart would read the partition again from its start.
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        first, later = sample_stream(6, seed=18), sample_stream(3, seed=19)
        produce(broker.bootstrap_servers, "events", first)
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              pipeline={"lookback": {"max_records": 0}})  # nothing to mask a re-delivery
        with RelayThread(config):
            assert collector.wait_for(lambda c: c.count == len(first), 60)
            assert eventually(lambda: sum(committed_offsets(broker.bootstrap_servers, "events", "g", 2).values())
                              == len(first), 30)
        produce(broker.bootstrap_servers, "events", later)
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
            assert collector.wait_for(lambda c: c.count >= len(first) + len(later), 60)
            assert eventually(lambda: sum(committed_offsets(broker.bootstrap_servers, "events", "g", 2).values())
                              == len(first) + len(later), 30)
            assert relay.metric("lineage_relay_offset_resets_total", topic="events") == 0
        assert relay.error is None
    assert collector.count == len(first) + len(later)
    assert [r for r in caplog.records if r.getMessage() in ("offset_reset", "offset_check_failed")] == []


def test_a_committed_offset_retention_removed_starts_at_the_log_start_and_counts_the_records_lost(caplog):
    # Retention, as the broker's ListOffsets answers it (a proxy moves the log start): the
    # group committed 5, and records 0-19 are gone. librdkafka itself would start at 5 on
    # a broker that still serves it, or reset silently on one that does not.
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 1)
        stream = sample_stream(10, seed=23)
        assert len(stream) > 21
        # Two writes: the embedded broker answers ListOffsets' end with the last batch's
        # first offset + 1, which must lie past the moved log start.
        produce(broker.bootstrap_servers, "events", stream[:-1])
        produce(broker.bootstrap_servers, "events", stream[-1:])
        commit(broker.bootstrap_servers, "g", "events", {0: 5})
        proxy.move_log_start("events", 0, 20)
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              pipeline={"ordering": {"hold_timeout_s": 1}})
        kept = {orjson.dumps(orjson.loads(v), option=orjson.OPT_SORT_KEYS) for _, v in stream[20:]}
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
            assert collector.wait_for(lambda c: c.count >= len(kept), 60)
            assert eventually(lambda: committed_offsets(broker.bootstrap_servers, "events", "g", 1)[0]
                              == len(stream), 30)
            assert relay.metric("lineage_relay_offset_resets_total", topic="events") == 1
        assert relay.error is None
    assert {orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in collector.events()} == kept
    [reset] = [r for r in caplog.records if r.getMessage() == "offset_reset"]
    assert reset.levelno == logging.WARNING
    assert {k: reset.fields[k] for k in ("topic", "partition", "from_offset", "to_offset", "cause", "records_lost")} \
        == {"topic": "events", "partition": 0, "from_offset": 5, "to_offset": 20, "cause": "before_start",
            "records_lost": 15}


@pytest.mark.parametrize("log_start", [None, 20], ids=["cached-start", "retention"])
def test_a_fetch_out_of_range_while_consuming_is_reported(caplog, log_start):
    """While the relay consumes, the broker answers a fetch OFFSET_OUT_OF_RANGE, as it does
    when retention removed the records a lagging consumer was about to read (a proxy gives
    one answer that error). librdkafka resets the position by itself, to the log start it
    cached from the broker's answers, and says so in a log line: the relay turns it into an
    offset_reset warning (cause out_of_range) and counts it.

    ``cached-start``: the start cached is still 0, so the relay reads records again; they
    are duplicates, and every event is delivered once. ``retention``: the answer also says
    the log now starts at 20, so records 10-19 are skipped (lost, and the warning says how
    many); the rest is delivered. Both commit everything."""
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 1)
        stream = sample_stream(14, seed=29)
        total = len(stream)
        assert total > 40
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              pipeline={"ordering": {"hold_timeout_s": 1}})
        expected = stream if log_start is None else [*stream[:10], *stream[log_start:]]
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
            produce(broker.bootstrap_servers, "events", stream[:10])
            assert collector.wait_for(lambda c: c.count == 10, 60)
            if log_start is not None:
                proxy.move_log_start("events", 0, log_start)
            proxy.fail_fetch(OFFSET_OUT_OF_RANGE, log_start=log_start)
            produce(broker.bootstrap_servers, "events", stream[10:])
            assert eventually(lambda: relay.metric("lineage_relay_offset_resets_total", topic="events") == 1, 60)
            assert collector.wait_for(lambda c: c.count == len(expected), 60), f"{collector.count} delivered"
            assert eventually(lambda: committed_offsets(broker.bootstrap_servers, "events", "g", 1)[0] == total, 30)
            read_again = 10 if log_start is None else 0
            assert relay.metric("lineage_relay_events_deduplicated_total", collector="c") == read_again
            assert relay.metric("lineage_relay_events_consumed_total") == len(expected) + read_again
        assert relay.error is None
        assert (FETCH, OFFSET_OUT_OF_RANGE) in {(api, code) for api, _v, code in proxy.injected}
    canonical = {orjson.dumps(orjson.loads(v), option=orjson.OPT_SORT_KEYS) for _, v in expected}
    assert {orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in collector.events()} == canonical
    assert collector.count == len(expected)
    if log_start is None:
        assert_run_order(collector.events())
    [reset] = [r for r in caplog.records if r.getMessage() == "offset_reset"]
    assert reset.levelno == logging.WARNING
    keys = ("topic", "partition", "from_offset", "to_offset", "cause", "records_lost")
    assert {k: reset.fields.get(k) for k in keys} == {
        "topic": "events", "partition": 0, "from_offset": 10, "to_offset": log_start or 0, "cause": "out_of_range",
        "records_lost": None if log_start is None else log_start - 10}
