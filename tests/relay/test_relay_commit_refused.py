"""The broker refuses offset commits for a while (REBALANCE_IN_PROGRESS, as during a
rebalance): the relay keeps delivering, tries the commit again, and once the broker accepts
it everything delivered is committed; nothing is lost and the relay stays up."""

from __future__ import annotations

import logging

import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, produce
from tests.support.kafka_proxy import OFFSET_COMMIT, REBALANCE_IN_PROGRESS, proxied_broker
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def test_refused_commits_are_tried_again_and_nothing_is_lost(caplog):
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 2)
        first, second = sample_stream(20, seed=7), sample_stream(20, seed=8)
        proxy.answer_with_error(OFFSET_COMMIT, REBALANCE_IN_PROGRESS, times=3)
        produce(broker.bootstrap_servers, "events", first)
        relay = RelayThread(relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g",
                                         dlq="dlq")).start()
        try:
            with caplog.at_level(logging.WARNING, logger="relay.source"):
                assert collector.wait_for(lambda c: c.count == len(first), 60), "delivered while commits fail"
                assert eventually(lambda: len(proxy.injected) == 3, 30), "three commits refused"
                assert eventually(lambda: committed(broker) == len(first), 30), "committed once accepted"
            assert sum(1 for r in caplog.records if r.getMessage() == "commit_failed") == 3
            produce(broker.bootstrap_servers, "events", second)
            assert collector.wait_for(lambda c: c.count == len(first) + len(second), 60), "the relay goes on"
            assert eventually(lambda: committed(broker) == len(first) + len(second), 30)
            assert relay.error is None
        finally:
            relay.stop()


def committed(broker) -> int:  # noqa: ANN001
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", 2).values())
