"""The README's OpenMetadata route (``event_types: [COMPLETE]``) through the real relay and
broker: each COMPLETE goes out when it is read, not ``hold_timeout_s`` later (and not to
the dead-letter topic with ``on_hold_timeout: dead_letter``), also when its START was read
before a restart (the look-back learns it began the run)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES
from relay.embedded.sample import message_key, spark_run
from tests.support.kafka import committed_offsets, produce
from tests.support.kind_servers import OPENMETADATA, KindServer
from tests.support.relay import RelayThread, eventually

pytestmark = pytest.mark.kafka

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
#: Far longer than any wait below: a COMPLETE held for its START cannot pass by timing out.
HOLD_TIMEOUT_S = 120


def config(kafka, om: KindServer, topic: str, dlq: str, group: str):
    return build_config({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                  "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
        "collectors": [{"name": "om", "type": "openmetadata", "url": om.url, "token": "om-jwt",
                        "batch": {"max_events": 50, "linger_ms": 20},
                        "route": {"include": [{"event_types": ["COMPLETE"]}]}}],
        "pipeline": {"ordering": {"hold_timeout_s": HOLD_TIMEOUT_S, "on_hold_timeout": "dead_letter"}},
        "http": {"port": None}, "drain_timeout_s": 5})


def records(events: list[dict]) -> list[tuple[bytes, bytes]]:
    return [(message_key(e).encode(), orjson.dumps(e)) for e in events]


def test_completes_whose_starts_are_not_routed_go_out_when_read_also_after_a_restart(kafka):
    topic, dlq, group = kafka.new_topic("om-route"), kafka.new_topic("dlq"), kafka.new_group()
    rng = random.Random(7)
    runs = [spark_run("spark-prod", f"etl.job_{i}", start=T0 + timedelta(seconds=i), rng=rng, with_running=1)
            for i in range(4)]
    # Runs 0-1 whole; runs 2-3 begin (START, RUNNING) before the restart and end after it.
    before = runs[0] + runs[1] + runs[2][:2] + runs[3][:2]
    after = runs[2][2:] + runs[3][2:]
    produce(kafka.bootstrap_servers, topic, records(before))
    with KindServer(OPENMETADATA, token="om-jwt") as om:
        with RelayThread(config(kafka, om, topic, dlq, group)) as relay:
            assert om.wait_for(lambda s: len(s.received()) == 2, 30), len(om.received())
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1)[0]
                              == len(before), 30), "held events keep the offsets uncommitted"
            assert relay.metric("lineage_relay_events_held", collector="om") == 0
        produce(kafka.bootstrap_servers, topic, records(after))
        with RelayThread(config(kafka, om, topic, dlq, group)):
            assert om.wait_for(lambda s: len(s.received()) == 4, 30), len(om.received())
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1)[0]
                              == len(before) + len(after), 30)
    got = [(e["job"]["name"], e["eventType"]) for e in om.received()]
    assert sorted(got) == [(f"etl.job_{i}", "COMPLETE") for i in range(4)]
