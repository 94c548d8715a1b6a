"""Consumer lag, in records and in seconds: what tells an operator the relay falls behind,
and how close the waiting records come to the topic's retention."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, end_offsets, produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka

#: How old the records are when produced.
AGE_S = 3600
#: One record a batch: Tansu answers ListOffsets with the last batch's base offset + 1
#: (tests/support/kafka.end_offsets), Kafka with the offset the next record gets.
ONE_A_BATCH = {"batch.num.messages": 1}


def test_lag_in_records_and_seconds_while_a_collector_is_down_and_zero_once_caught_up():
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 1)
        # More records than one poll takes (the relay consumes a batch ahead of delivery).
        stream = sample_stream(3000, seed=29)
        assert len(stream) > 9000
        produced_at = time.time()
        produce(broker.bootstrap_servers, "events", stream, timestamp_ms=int((produced_at - AGE_S) * 1000))
        collector.set_outage(503)
        # A few undelivered events pause consumption after the first batch: the rest waits.
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              collector={"max_pending": 5})
        labels = {"topic": "events", "partition": "0"}
        with RelayThread(config) as relay:
            # Nothing is delivered: the oldest record not done with is AGE_S old, give or
            # take the test's own time, whether it was consumed or still waits in the topic.
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag_seconds", **labels) > 0, 30)
            age = relay.metric("lineage_relay_consumer_lag_seconds", **labels)
            assert AGE_S <= age <= AGE_S + (time.time() - produced_at) + 1, age
            # (Measured every few seconds: once consumption has paused, they agree.)
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag", **labels)
                              == len(stream) - relay.metric("lineage_relay_events_consumed_total"), 30)
            collector.clear_outage()
            assert collector.wait_for(lambda c: c.count == len(stream), 120)
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag", **labels) == 0
                              and relay.metric("lineage_relay_consumer_lag_seconds", **labels) == 0, 30)
        assert relay.error is None


def test_lag_counts_the_records_that_arrive_while_consumption_is_paused():
    """A paused partition (backpressure: a collector failing) is not fetched, and
    librdkafka's end offset for it, updated by fetch responses only, stays where it was
    when the pause began: the lag said 0 while records piled up, and the alerts on it
    (LineageRelayNotConsuming, LineageRelayConsumerLagHigh) never fired in the outages
    they are for. The broker is asked for the end offsets instead."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 1)
        collector.set_outage(503)
        first = sample_stream(20, seed=41)
        produce(broker.bootstrap_servers, "events", first)
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              collector={"max_pending": 5})
        labels = {"topic": "events", "partition": "0"}
        with RelayThread(config) as relay:
            # Paused, not only held off (relay.backpressure): librdkafka no longer fetches.
            assert eventually(lambda: relay.relay is not None and relay.relay.source.paused, 30)
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag", **labels)
                              == len(first) - relay.metric("lineage_relay_events_consumed_total"), 30)
            # One record a batch: Tansu answers ListOffsets with the last batch's base offset
            # + 1 (tests/support/kafka.end_offsets), Kafka with the offset the next record gets.
            waiting = sample_stream(100, seed=43)
            produce(broker.bootstrap_servers, "events", waiting, config={"batch.num.messages": 1})
            total = len(first) + len(waiting)

            def lag_counts_them() -> bool:
                return relay.relay.source.paused and (
                    relay.metric("lineage_relay_consumer_lag", **labels)
                    == total - relay.metric("lineage_relay_events_consumed_total") >= len(waiting))
            assert eventually(lag_counts_them, 30), (relay.metric("lineage_relay_consumer_lag", **labels),
                                                     relay.metric("lineage_relay_events_consumed_total"))
            collector.clear_outage()
            assert collector.wait_for(lambda c: c.count == total, 60)
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag", **labels) == 0, 30)
        assert relay.error is None


def test_a_partition_given_to_another_replica_leaves_the_lag_series_of_the_first():
    """After a rebalance, each replica reports lag only for the partitions it owns: the
    series of one given away would keep their last value for ever (alerts firing, sums over
    the replicas counting it twice)."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        stream = sample_stream(20, seed=31)
        produce(broker.bootstrap_servers, "events", stream)

        def config():  # noqa: ANN202
            return relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq")
        with RelayThread(config()) as a:
            assert collector.wait_for(lambda c: c.count == len(stream), 60)
            both = {"0", "1"}
            assert eventually(lambda: lag_partitions(a, "lineage_relay_consumer_lag") == both
                              and lag_partitions(a, "lineage_relay_consumer_lag_seconds") == both, 30)
            with RelayThread(config()) as b:
                # Nothing consumed from a partition yet, no lag for it: b needs records of its own.
                assert eventually(lambda: b.relay is not None and len(b.relay.source.assignment) == 1, 60)
                produce(broker.bootstrap_servers, "events", sample_stream(20, seed=37))

                def split() -> bool:
                    for name in ("lineage_relay_consumer_lag", "lineage_relay_consumer_lag_seconds"):
                        mine, theirs = lag_partitions(a, name), lag_partitions(b, name)
                        if not mine or not theirs or mine & theirs or mine | theirs != both:
                            return False
                    return True
                assert eventually(split, 60), (lag_partitions(a, "lineage_relay_consumer_lag"),
                                               lag_partitions(b, "lineage_relay_consumer_lag"))
            assert a.error is None


def test_a_partition_assigned_while_consumption_is_paused_has_its_lag_measured():
    """A partition assigned while the relay is paused (a collector down) is paused from the
    start: nothing is fetched, and the consumer does not know its position. Its lag is
    measured from where it starts (its committed offset, else where auto.offset.reset
    says): it had no lag series for the whole outage, and the lag alerts could not fire."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        first = sample_stream(10, seed=5)
        produce(broker.bootstrap_servers, "events", first[: len(first) // 2], partition=0, config=ONE_A_BATCH)
        produce(broker.bootstrap_servers, "events", first[len(first) // 2:], partition=1, config=ONE_A_BATCH)
        collector.set_outage(503)
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              collector={"max_pending": 5}, drain_timeout_s=2)
        with RelayThread(config) as relay:
            assert eventually(lambda: relay.relay is not None and relay.relay.source.paused
                              and len(relay.relay.source.assignment) == 2, 40)
            # Another member takes a partition (reading nothing), then leaves: the partition
            # comes back to the relay, paused.
            other = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g",
                              "enable.auto.commit": False, "auto.offset.reset": "earliest",
                              "partition.assignment.strategy": "cooperative-sticky", **FAST_GROUP_PROPERTIES})
            try:
                other.subscribe(["events"])
                deadline = time.monotonic() + 40
                while not other.assignment() and time.monotonic() < deadline:
                    other.poll(0.2)
                assert other.assignment()
                other.pause(other.assignment())
                moved = other.assignment()[0].partition
            finally:
                other.close()
            assert eventually(lambda: len(relay.relay.source.assignment) == 2, 40)
            assert relay.relay.source.paused
            produce(broker.bootstrap_servers, "events", sample_stream(10, seed=7), partition=moved,
                    config=ONE_A_BATCH)
            committed = committed_offsets(broker.bootstrap_servers, "events", "g", 2)[moved]
            waiting = end_offsets(broker.bootstrap_servers, "events")[moved] - max(committed, 0)
            labels = {"topic": "events", "partition": str(moved)}
            assert eventually(lambda: relay.relay.metrics.registry.get_sample_value(
                "lineage_relay_consumer_lag", labels) == waiting, 30), (
                relay.relay.metrics.registry.get_sample_value("lineage_relay_consumer_lag", labels), waiting)
            collector.clear_outage()
        assert relay.error is None


def test_lag_seconds_of_records_waiting_behind_delivered_ones_counts_from_when_the_partition_was_caught_up():
    """A partition whose consumed records are all delivered, with new records waiting while
    consumption is paused: the age is at most the time since the partition was last seen
    caught up. It said the age of the last record consumed there, days old, and
    LineageRelayLagOld fired for records seconds old."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        old = sample_stream(1, seed=11)
        produce(broker.bootstrap_servers, "events", old, partition=1,
                timestamp_ms=int((time.time() - 3 * 86400) * 1000))
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                              collector={"max_pending": 5})
        labels = {"topic": "events", "partition": "1"}
        with RelayThread(config) as relay:
            assert collector.wait_for(lambda c: c.count == len(old), 60)
            # Measured caught up: everything consumed, and delivered.
            assert eventually(lambda: relay.relay.metrics.registry.get_sample_value(
                "lineage_relay_consumer_lag_seconds", labels) == 0
                and relay.metric("lineage_relay_consumer_lag", **labels) == 0, 30)
            caught_up_seen = time.time()
            collector.set_outage(503)
            produce(broker.bootstrap_servers, "events", sample_stream(10, seed=12), partition=0)
            assert eventually(lambda: relay.relay.source.paused, 40)  # partition 0's events are not delivered
            produce(broker.bootstrap_servers, "events", sample_stream(5, seed=13), partition=1, config=ONE_A_BATCH)
            assert eventually(lambda: relay.metric("lineage_relay_consumer_lag", **labels) > 0, 30)
            age = relay.metric("lineage_relay_consumer_lag_seconds", **labels)
            # Caught up at most one lag interval (5 s) before it was seen so.
            assert 0 < age <= time.time() - caught_up_seen + 6, age
            collector.clear_outage()
        assert relay.error is None


def lag_partitions(relay: RelayThread, name: str) -> set[str]:
    """The partitions ``relay`` has a ``name`` series for."""
    assert relay.relay is not None
    return {s.labels["partition"] for metric in relay.relay.metrics.registry.collect()
            for s in metric.samples if s.name == name}
