"""The demo's producer keeps its journal in the demo's own work directory: a demo whose
throwaway broker dies leaves nothing in the user's cache for later producers to trip on."""

from __future__ import annotations

import uuid

from producer.spark.demo import demo_producer
from relay.embedded.broker import EmbeddedBroker


def event() -> dict:
    return {"eventType": "START", "eventTime": "2026-11-29T14:00:12.821Z", "run": {"runId": str(uuid.uuid4())},
            "job": {"namespace": "demo", "name": "lineage_demo"}, "inputs": [], "outputs": [], "producer": "x",
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"}


def test_a_demo_whose_broker_died_journals_in_its_work_dir_not_the_users_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    work = tmp_path / "work"
    with EmbeddedBroker() as broker:
        broker.create_topic("openlineage", 3)
        producer = demo_producer(bootstrap_servers=broker.bootstrap_servers, topic="openlineage", workdir=work,
                                 close_timeout_s=1)
    for _ in range(3):  # the broker is gone
        producer.emit(event())
    producer.close()
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))
    assert any(p.is_file() for p in (work / "journal").rglob("*"))
