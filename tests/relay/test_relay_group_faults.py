"""Consumer-group faults with events still waiting for delivery: the relay loses nothing and
keeps run order.

Partitions lost (the broker forgot the member: UNKNOWN_MEMBER_ID on a heartbeat) while the
collector is down: the relay takes back what it had queued for them, the group assigns the
partitions back to it, and it reads them again from the last commit. What it read again
used to be dropped as "after the run's terminal" (the sequencer still remembered forwarding
the terminal it had taken back) and committed: 71 of 217 events lost."""

from __future__ import annotations

import logging
import time

import orjson
import pytest

from relay.embedded.broker import EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.relay.test_relay_end_to_end import assert_run_order
from tests.support.kafka import committed_offsets, produce
from tests.support.kafka_proxy import HEARTBEAT, UNKNOWN_MEMBER_ID, proxied_broker
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def test_partitions_lost_with_events_pending_lose_nothing():
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 2)
        first, second = sample_stream(30, seed=7), sample_stream(30, seed=8)
        produce(broker.bootstrap_servers, "events", first)
        relay = RelayThread(relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g",
                                         dlq="dlq")).start()
        try:
            total = pending_behind_an_outage(broker, collector, relay, first, second)
            lose_partitions(proxy)
            assert eventually(lambda: relay.metric("lineage_relay_events_consumed_total") > total, 30), \
                "the partitions were read again"
            recover_and_deliver(broker, collector, first + second)
            assert relay.metric("lineage_relay_events_dropped_total", collector="c", reason="after_terminal") == 0
            assert relay.error is None
        finally:
            relay.stop()
    assert_run_order(collector.events())


def test_partitions_lost_while_paused_are_read_again_once_assigned_back():
    """librdkafka keeps a partition paused by the application across its unassignment and
    a later assignment. Here the relay pauses for backpressure (the collector down, its
    window full), loses its partitions, gives back what it held for them (so it resumes,
    with nothing assigned) and is assigned them again: unless they are resumed then, they
    are never read again, silently (polls go on, empty)."""
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 2)
        first, second = sample_stream(30, seed=7), sample_stream(30, seed=8)
        produce(broker.bootstrap_servers, "events", first)
        relay = RelayThread(relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g",
                                         dlq="dlq", collector={"max_pending": 10})).start()
        try:
            assert collector.wait_for(lambda c: c.count == len(first), 60), "the first part delivered"
            collector.set_outage(503)
            produce(broker.bootstrap_servers, "events", second)
            assert eventually(lambda: relay.relay.source.paused, 30), "paused for backpressure"
            consumed = relay.metric("lineage_relay_events_consumed_total")
            lose_partitions(proxy)
            assert eventually(lambda: relay.metric("lineage_relay_events_consumed_total") > consumed, 30), \
                "the partitions were read again once assigned back"
            recover_and_deliver(broker, collector, first + second)
            assert relay.error is None
        finally:
            relay.stop()
    assert_run_order(collector.events())


def lose_partitions(proxy) -> None:  # noqa: ANN001
    """The broker forgets the member: its next heartbeat is answered UNKNOWN_MEMBER_ID."""
    proxy.answer_with_error(HEARTBEAT, UNKNOWN_MEMBER_ID)
    assert eventually(lambda: proxy.injected, 10), "the heartbeat answered with the error"


def recover_and_deliver(broker, collector, stream) -> None:  # noqa: ANN001
    """The collector back: every event of ``stream`` reaches it, and everything is committed."""
    collector.clear_outage()
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= unique, 60), \
        f"{len(unique - {canonical(e) for e in collector.events()})} events never delivered"
    assert eventually(lambda: committed(broker) == len(stream), 30)


def pending_behind_an_outage(broker, collector, relay, first, second) -> int:  # noqa: ANN001
    """Once ``relay`` delivered ``first``, the collector goes down and ``second`` is
    produced; returns the events in all, once the relay consumed them (now pending)."""
    assert collector.wait_for(lambda c: c.count == len(first), 60), "the first part delivered"
    collector.set_outage(503)
    produce(broker.bootstrap_servers, "events", second)
    total = len(first) + len(second)
    assert eventually(lambda: relay.metric("lineage_relay_events_consumed_total") >= total, 30)
    return total


def committed(broker, partitions: int = 2) -> int:  # noqa: ANN001
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", partitions).values())


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


#: The collector stays down this long after the rebalance began: under the first replica's
#: wait (drain_timeout_s, 30 s in the first case); without that wait the new owner takes over in ~3 s
#: and retries alongside it (an 8 s outage did not show the reorder, 20 s and more did).
OUTAGE_AFTER_REBALANCE_S = 20.0


@pytest.mark.parametrize(("drain_timeout_s", "message"), [
    (30, "revoke_waiting_for_deliveries"),  # the wait outlasts the outage
    (2, "revoke_deliveries_aborted"),       # the outage outlasts the wait
], ids=["waited-for", "stopped"])
def test_a_replica_joining_during_an_outage_keeps_each_run_in_order(caplog, drain_timeout_s, message):
    """A second replica joins while the collector answers 503: the first gives up half of
    its partitions with deliveries still being retried. It waits for those before handing
    the partitions over; otherwise a retried START could land after the COMPLETE the new
    owner sends once the collector is back (16 of 80 runs, measured before the wait). When
    the outage outlasts the wait (drain_timeout_s), it stops those deliveries instead of
    retrying them alongside the new owner (before: runs like START, COMPLETE, START).

    The runs the first replica had begun and not delivered yet are read again by the new
    owner from the last commit, START included; the ones delivered before the outage it
    learns by reading back what came before the commit (lookback)."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 4)
        first, second = sample_stream(40, seed=7), sample_stream(40, seed=8)
        produce(broker.bootstrap_servers, "events", first)

        def config():  # noqa: ANN202
            return relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                                pipeline={"ordering": {"hold_timeout_s": 2.0}}, drain_timeout_s=drain_timeout_s)
        a = RelayThread(config()).start()
        b = None
        try:
            total = pending_behind_an_outage(broker, collector, a, first, second)
            with caplog.at_level(logging.INFO, logger="relay"):
                b = RelayThread(config()).start()
                # The first round of the (cooperative) rebalance: a gives up two partitions.
                assert eventually(lambda: any(r.getMessage() == "partitions_assigned" for r in caplog.records), 40)
                # The outage goes on for a while: long enough for the new owner to take over and
                # retry too (when the first replica did not wait), shorter than its wait.
                time.sleep(OUTAGE_AFTER_REBALANCE_S)  # ok: the outage's length, part of the scenario
            collector.clear_outage()
            assert eventually(lambda: b.metric("lineage_relay_events_consumed_total") > 0, 40), "b took over"
            # b read back what a had committed of its partitions (the runs delivered before the outage).
            assert b.metric("lineage_relay_lookback_events_total") > 0
            unique = {canonical(orjson.loads(v)) for _, v in first + second}
            assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= unique, 60), \
                f"{len(unique - {canonical(e) for e in collector.events()})} events never delivered"
            assert eventually(lambda: committed(broker, 4) == total, 30)
        finally:
            a.stop()
            if b is not None:
                b.stop()
    assert_run_order(collector.events())
    assert any(r.getMessage() == message for r in caplog.records)
