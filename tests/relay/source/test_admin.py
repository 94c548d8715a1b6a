"""Topic creation at start-up (dead-letter and run-state topics)."""

from __future__ import annotations

import gc

import pytest
from confluent_kafka.admin import AdminClient

from relay.source.admin import create_topic

pytestmark = pytest.mark.kafka


def _admin_clients() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is AdminClient)


def test_creating_a_topic_that_exists_is_fine_and_leaves_no_client_behind(kafka):
    """A relay process collects cycles rarely (relay.process.tune_gc): a client kept alive by the
    'already exists' error's traceback would keep its threads and connection until then."""
    topic = kafka.new_topic("existing")
    gc.collect()
    before = _admin_clients()
    gc.disable()
    try:
        for _ in range(3):
            create_topic(kafka.bootstrap_servers, topic, 1)
        assert _admin_clients() == before
    finally:
        gc.enable()
