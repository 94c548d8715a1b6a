"""``/readyz``: 200 only while the relay consumes its share of the topics. Kubernetes
rolls a Deployment (maxUnavailable 0) on it: a new pod ready before it joined its group
let the rollout stop an old one while nothing consumed, and a misspelt topic never held
the rollout up. Its ``reason`` says what to fix: a broker that does not answer is not a
missing topic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from relay.embedded.broker import create_topic, free_port
from relay.server import start_server
from tests.support.relay import RelayProcess, RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def readyz(base: str) -> tuple[int, dict]:
    resp = requests.get(f"{base}/readyz", timeout=5)
    return resp.status_code, resp.json()


@contextmanager
def served(relay: RelayThread) -> Iterator[str]:
    """The relay's /healthz, /readyz and /metrics on a free loopback port, on its own loop."""
    assert relay._loop is not None and relay.relay is not None
    runner, port = asyncio.run_coroutine_threadsafe(start_server(relay.relay, "127.0.0.1", 0), relay._loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), relay._loop).result(10)


def test_ready_once_the_group_gave_the_replica_its_share_an_empty_one_too(kafka, tmp_path):
    """The first 200 comes once the partitions are assigned (it came at start, ~3 s before
    the group did). A replica the group gives nothing (more replicas than partitions) is
    ready all the same: it joined, and takes over when another goes."""
    topic, dlq, group = kafka.new_topic("ready", partitions=1), kafka.new_topic("dlq"), kafka.new_group()
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic, "--group-id", group, "--dlq-topic", dlq,
            "--collector", "c=http://127.0.0.1:9/unused"]
    for key, value in kafka.consumer_properties().items():
        args += ["--consumer-property", f"{key}={value}"]
    first = RelayProcess(args, log_path=tmp_path / "first.log").start()  # returns at the first 200
    second = None
    try:
        status, body = readyz(f"http://127.0.0.1:{first.http_port}")
        assert (status, body["partitions"]) == (200, 1), body
        second = RelayProcess(args, log_path=tmp_path / "second.log").start()
        status, body = readyz(f"http://127.0.0.1:{second.http_port}")
        assert (status, body["partitions"]) == (200, 0), body
        assert readyz(f"http://127.0.0.1:{first.http_port}")[0] == 200
    finally:
        if second is not None:
            assert second.terminate(30) == 0
        assert first.terminate(30) == 0


def test_not_ready_while_a_subscribed_topic_is_missing_until_it_exists(kafka):
    """A misspelt topic (or one not created yet) is consumed by nobody: the relay says so
    (the group assigned it the other topic's partitions) until the topic exists."""
    present, missing, dlq, group = kafka.new_topic("here"), f"missing-{kafka.new_group()}", kafka.new_topic("dlq"), \
        kafka.new_group()
    config = relay_config(kafka.bootstrap_servers, present, {"c": "http://127.0.0.1:9/unused"}, group=group, dlq=dlq,
                          kafka={"bootstrap_servers": kafka.bootstrap_servers, "topics": [present, missing],
                                 "group_id": group, "dlq_topic": dlq, "consumer_properties": kafka.consumer_properties()})
    with RelayThread(config) as relay, served(relay) as base:
        assert eventually(lambda: relay.relay is not None and relay.relay.source.joined, 30)
        status, body = readyz(base)
        assert (status, body.get("reason"), body.get("missing_topics")) == (503, "missing_topics", [missing]), body
        assert relay.relay.broker.answered
        create_topic(kafka.bootstrap_servers, missing, 1)
        assert eventually(lambda: readyz(base)[0] == 200, 20), readyz(base)


def test_an_unreachable_broker_is_named_not_blamed_on_a_topic(caplog, monkeypatch):
    """With a bootstrap address nobody answers on, /readyz said ``missing_topics`` naming
    the topic (no ``topics_missing`` logged): an operator went to create a topic that
    exists. Until the broker says a topic does not exist, none is missing; once it has not
    answered for a while, the reason is ``broker_unreachable``."""
    monkeypatch.setattr("relay.source.broker_contact.SILENT_AFTER_S", 0.5)
    bootstrap = f"127.0.0.1:{free_port()}"
    config = relay_config(bootstrap, "openlineage", {"c": "http://127.0.0.1:9/unused"}, group="g", dlq="unused",
                          drain_timeout_s=1,
                          kafka={"bootstrap_servers": bootstrap, "topics": ["openlineage"], "group_id": "g",
                                 "create_dlq_topic": False})
    answers = []

    def checked_topics_unreachable() -> bool:
        answers.append(readyz(base))
        checks = [r for r in caplog.records if r.getMessage() == "topic_check_failed"]
        return bool(checks) and answers[-1][1].get("reason") == "broker_unreachable"
    with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay, served(relay) as base:
        # The relay asked for the topic's metadata and got no answer: a missing topic was reported then.
        assert eventually(checked_topics_unreachable, 30), answers[-3:]
    assert all(status == 503 and "missing_topics" not in body and body["reason"] != "missing_topics"
               for status, body in answers), answers
