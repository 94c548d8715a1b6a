"""Consumer-group faults caused through a fault proxy in front of a real broker, with events
still waiting for delivery: the relay loses nothing and keeps run order.

Partitions lost (the broker forgot the member: UNKNOWN_MEMBER_ID on a heartbeat) while the
collector is down: the relay takes back what it had queued for them, the group assigns the
partitions back to it, and it reads them again from the last commit. What it read again
used to be dropped as "after the run's terminal" (the sequencer still remembered forwarding
the terminal it had taken back) and committed: 71 of 217 events lost."""

from __future__ import annotations

import orjson
import pytest

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
            assert collector.wait_for(lambda c: c.count == len(first), 60), "the first part delivered"
            collector.set_outage(503)
            produce(broker.bootstrap_servers, "events", second)
            total = len(first) + len(second)
            assert eventually(lambda: relay.metric("lineage_relay_events_consumed_total") >= total, 30)
            proxy.answer_with_error(HEARTBEAT, UNKNOWN_MEMBER_ID)
            assert eventually(lambda: proxy.injected, 10), "the heartbeat answered with the error"
            assert eventually(lambda: relay.metric("lineage_relay_events_consumed_total") > total, 30), \
                "the partitions were read again"
            collector.clear_outage()
            unique = {canonical(orjson.loads(v)) for _, v in first + second}
            assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= unique, 60), \
                f"{len(unique - {canonical(e) for e in collector.events()})} events never delivered"
            assert eventually(lambda: committed(broker) == total, 30)
            assert relay.metric("lineage_relay_events_dropped_total", collector="c", reason="after_terminal") == 0
            assert relay.error is None
        finally:
            relay.stop()
    assert_run_order(collector.events())


def committed(broker) -> int:  # noqa: ANN001
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", 2).values())


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
