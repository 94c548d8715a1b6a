"""A broker that comes back empty (restarted with its data lost: the embedded Tansu broker's
memory storage, a cluster rebuilt) under a running relay process: the relay says its topic
is gone while it is, and consumes it again once it exists, without a restart of its own."""

from __future__ import annotations

import orjson
import pytest
import requests

from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker, create_topic
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import produce
from tests.support.relay import RelayProcess, eventually

pytestmark = pytest.mark.kafka


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def readyz(relay: RelayProcess) -> tuple[int, dict]:
    answer = requests.get(f"http://127.0.0.1:{relay.http_port}/readyz", timeout=5)
    return answer.status_code, answer.json()


def delivered(collector: RecordingCollector, stream: list[tuple[bytes, bytes]]) -> bool:
    expected = {canonical(orjson.loads(v)) for _, v in stream}
    return {canonical(e) for e in collector.events()} >= expected


def test_a_broker_back_without_the_topic_is_reported_then_the_recreated_topic_consumed(tmp_path):
    topic, dlq, group = "lineage", "lineage.dlq", "relay"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker, RecordingCollector() as collector:
        create_topic(broker.bootstrap_servers, topic, 2)
        args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--group-id", group,
                "--dlq-topic", dlq, "--collector", f"a={collector.url}"]
        for key, value in FAST_GROUP_PROPERTIES.items():
            args += ["--consumer-property", f"{key}={value}"]
        relay = RelayProcess(args, log_path=tmp_path / "relay.log").start()
        try:
            before = sample_stream(20, seed=31)
            produce(broker.bootstrap_servers, topic, before)
            assert collector.wait_for(lambda c: delivered(c, before), 60)

            broker.restart()  # same port, nothing kept: no topic, no group, no offsets
            # librdkafka looked for the topic again only every 5 minutes (its default
            # topic.metadata.refresh.interval.ms): the relay went on answering ready with
            # no partition and logged nothing.
            assert eventually(lambda: readyz(relay)[1].get("missing_topics") == [topic], 30), readyz(relay)
            assert readyz(relay)[0] == 503
            assert eventually(lambda: '"topics_missing"' in relay.log_path.read_text(), 10)

            create_topic(broker.bootstrap_servers, topic, 2)
            after = sample_stream(20, seed=32)
            produce(broker.bootstrap_servers, topic, after)
            # ... and it took as long to be given the recreated topic's partitions.
            assert collector.wait_for(lambda c: delivered(c, after), 40), relay.log_path.read_text()[-3000:]
            assert eventually(lambda: readyz(relay) == (200, {"ready": True, "paused": False, "partitions": 2}),
                              20), readyz(relay)
            assert relay.terminate(30) == 0
        finally:
            relay.close()
