"""``/readyz``: 200 only while the relay consumes its share of the topics. Kubernetes
rolls a Deployment (maxUnavailable 0) on it: a new pod ready before it joined its group
let the rollout stop an old one while nothing consumed, and a misspelt topic never held
the rollout up."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from relay.embedded.broker import create_topic
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
        create_topic(kafka.bootstrap_servers, missing, 1)
        assert eventually(lambda: readyz(base)[0] == 200, 20), readyz(base)
