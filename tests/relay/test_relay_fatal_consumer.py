"""A fatal error of the Kafka consumer (fenced by a replica with the same group.instance.id)
stops the relay with the reason instead of leaving it up and consuming nothing. A fenced
consumer cannot commit any more (its last commit is refused): what was delivered since the
last periodic commit is read again by the next consumer.

Tansu cannot fence a static member by itself, so a proxy in front of it answers one
heartbeat with FENCED_INSTANCE_ID, as Kafka answers the older of two members that share a
group.instance.id. librdkafka then hands the error over as it does in production: a
consumed message whose code is _FATAL (and whose fatal() is False)."""

from __future__ import annotations

import json

import pytest

from relay.embedded.broker import FAST_GROUP_PROPERTIES
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.source.kafka import SourceError
from tests.support.kafka import committed_offsets, produce
from tests.support.kafka_proxy import FENCED_INSTANCE_ID, HEARTBEAT, proxied_broker
from tests.support.relay import RelayProcess, RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka
STATIC = {"group.instance.id": "relay-0"}


def test_a_fenced_consumer_stops_the_relay_with_the_reason_after_committing():
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 1)
        stream = sample_stream(20, seed=3)
        produce(broker.bootstrap_servers, "events", stream)
        config = relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq")
        config.kafka.consumer_properties.update(STATIC)
        relay = RelayThread(config).start()
        try:
            assert collector.wait_for(lambda c: c.count == len(stream), 60), "the relay delivers before the fence"
            assert eventually(lambda: committed(broker, 1) == len(stream), 20), "delivered events committed"
            proxy.answer_with_error(HEARTBEAT, FENCED_INSTANCE_ID)
            assert eventually(lambda: relay.error is not None, 30), "the relay went on after a fatal error"
        finally:
            with pytest.raises(SourceError, match="fatal error.*fenced.*group.instance.id"):
                relay.stop()
        assert [key for key, _, _ in proxy.injected] == [HEARTBEAT]


def test_the_cli_exits_1_with_relay_failed_logged(tmp_path):
    """What Kubernetes sees: the process exits 1 (it restarts the pod with a new consumer),
    and the log names the reason and the fix."""
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 2)
        stream = sample_stream(30, seed=5)
        produce(broker.bootstrap_servers, "events", stream)
        args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", "events", "--group-id", "g",
                "--dlq-topic", "dlq", "--collector", f"c={collector.url}"]
        for key, value in {**FAST_GROUP_PROPERTIES, **STATIC}.items():
            args += ["--consumer-property", f"{key}={value}"]
        relay = RelayProcess(args, log_path=tmp_path / "relay.log").start()
        try:
            assert collector.wait_for(lambda c: c.count == len(stream), 60), "the relay delivers before the fence"
            assert eventually(lambda: committed(broker, 2) == len(stream), 20), "delivered events committed"
            proxy.answer_with_error(HEARTBEAT, FENCED_INSTANCE_ID)
            assert relay.proc is not None
            assert relay.proc.wait(40) == 1
        finally:
            relay.close()
        log = (tmp_path / "relay.log").read_text()
        lines = [json.loads(line) for line in log.splitlines()]  # every line JSON: it was printed again as text
        failed = [line for line in lines if line["event"] == "relay_failed"]
        assert len(failed) == 1 and "group.instance.id" in failed[0]["error"], log[-3000:]
        assert failed[0]["exit_code"] == 1


def committed(broker, partitions: int) -> int:  # noqa: ANN001
    """Records of topic ``events`` committed by group ``g``."""
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", partitions).values())
