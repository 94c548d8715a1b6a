"""Topic creation at start-up (dead-letter and run-state topics, and the redrive markers).

Created topics take the cluster's replication factor unless ``kafka.topic_replication_factor``
names one: a fixed 1 made single-copy topics, which ``acks=all`` writes cannot reach where
``min.insync.replicas`` is 2."""

from __future__ import annotations

import concurrent.futures
import gc

import confluent_kafka.admin
import pytest
from confluent_kafka.admin import AdminClient

from relay.config import build_config
from relay.errors import ConfigError
from relay.source.admin import create_topic
from tests.support.relay import RelayThread, eventually, relay_config


def _admin_clients() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is AdminClient)


@pytest.mark.kafka
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


class RecordingAdmin:
    """Stands in for the cluster's admin API: keeps the topics asked for, creates them all."""

    asked: list = []

    def __init__(self, conf: dict) -> None:
        self.conf = conf

    def create_topics(self, topics, **_kw):
        RecordingAdmin.asked.extend(topics)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        return {t.topic: done for t in topics}


@pytest.fixture
def asked(monkeypatch):
    RecordingAdmin.asked = []
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", RecordingAdmin)
    return RecordingAdmin.asked


def test_a_created_topic_takes_the_clusters_replication_factor_by_default(asked):
    create_topic("127.0.0.1:9", "openlineage.dlq", 1)
    [topic] = asked
    assert topic.topic == "openlineage.dlq" and topic.replication_factor == -1  # -1: the broker's default


def test_a_configured_replication_factor_is_asked_for(asked):
    config = build_config({"kafka": {"bootstrap_servers": "x:9092", "topic_replication_factor": 3},
                           "collectors": [{"name": "m", "url": "http://127.0.0.1:1"}]})
    create_topic("127.0.0.1:9", "state", 6, replication_factor=config.kafka.topic_replication_factor)
    [topic] = asked
    assert (topic.replication_factor, topic.num_partitions) == (3, 6)


def test_a_replication_factor_below_one_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="kafka.topic_replication_factor"):
        build_config({"kafka": {"bootstrap_servers": "x:9092", "topic_replication_factor": 0},
                      "collectors": [{"name": "m", "url": "http://127.0.0.1:1"}]})


@pytest.mark.kafka
@pytest.mark.parametrize("factor", [None, 1])
def test_the_relay_creates_its_dead_letter_and_run_state_topics_with_the_configured_factor(
        kafka, monkeypatch, factor):
    topic, dlq, group = kafka.new_topic("in"), kafka.new_group("dlq"), kafka.new_group()  # dlq: not created yet
    asked_for: list = []
    create_topics = AdminClient.create_topics

    def recording(self, topics, **kw):  # the real call, its topics kept
        asked_for.extend(topics)
        return create_topics(self, topics, **kw)
    monkeypatch.setattr(AdminClient, "create_topics", recording)
    config = relay_config(kafka.bootstrap_servers, topic, {"m": "http://127.0.0.1:9"}, group=group, dlq=dlq,
                          collector={"mode": "consolidated"})
    config = config.model_copy(update={"kafka": config.kafka.model_copy(update={"topic_replication_factor": factor})})
    with RelayThread(config) as relay:
        assert eventually(lambda: relay.relay is not None and relay.relay.started, 30), "the relay did not start"
    asked = {t.topic: t.replication_factor for t in asked_for}
    expected = factor or -1  # -1: the cluster's default.replication.factor
    assert asked == {dlq: expected, config.kafka.run_state_topic: expected}
