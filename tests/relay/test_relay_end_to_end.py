"""The relay against a real Kafka-protocol broker and real HTTP collectors on loopback."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import datetime, timezone

import orjson
import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream, spark_run
from tests.support.kafka import committed_offsets, produce, read_topic
from tests.support.relay import RelayThread, eventually, relay_config
from tests.support.spec import validator

pytestmark = pytest.mark.kafka

TERMINAL = {"COMPLETE", "FAIL", "ABORT"}


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def assert_run_order(events: list[dict]) -> None:
    """Per run: the first event is START, exactly one terminal, nothing after it."""
    by_run: dict[str, list[str]] = defaultdict(list)
    for e in events:
        if "run" in e:
            by_run[e["run"]["runId"]].append(e.get("eventType"))
    for run_id, types in by_run.items():
        assert types[0] == "START", f"run {run_id} began with {types}"
        terminals = [i for i, t in enumerate(types) if t in TERMINAL]
        assert len(terminals) == 1, f"run {run_id} had terminals {types}"
        assert terminals[0] == len(types) - 1, f"run {run_id} had events after its terminal: {types}"


@pytest.fixture
def collectors():
    with RecordingCollector() as a, RecordingCollector() as b:
        yield a, b


@pytest.fixture
def topics(kafka):
    return kafka.new_topic("ol", partitions=3), kafka.new_topic("dlq")


@pytest.mark.parametrize("decode_processes", [1, 2])
def test_two_collectors_get_every_unique_event_once_in_run_order(kafka, collectors, topics, decode_processes):
    topic, dlq = topics
    stream = sample_stream(700, seed=7, duplicate_ratio=0.10, out_of_order_ratio=0.08)
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    assert len(stream) > 2000 and len(stream) - len(unique) >= 0.09 * len(stream)
    produce(kafka.bootstrap_servers, topic, stream)
    a, b = collectors
    config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url},
                          group=kafka.new_group(), dlq=dlq,
                          pipeline={"ordering": {"terminal_grace_s": 1.0}, "decode_processes": decode_processes})
    with RelayThread(config) as relay:
        for c in (a, b):
            assert c.wait_for(lambda c: c.count >= len(unique), 90), f"got {c.count} of {len(unique)}"
        # Duplicates after a partition's last unique event may still be on their way.
        assert eventually(lambda: relay.metric("lineage_relay_events_deduplicated_total", collector="a")
                          == len(stream) - len(unique), 30)
    spec = validator()
    for c in (a, b):
        events = c.events()
        got = Counter(canonical(e) for e in events)
        assert set(got) == unique
        assert max(got.values()) == 1, "a duplicate was forwarded"
        assert_run_order(events)
        for e in events:
            spec.validate(e)
    # Everything was settled, so everything was committed.
    offsets = committed_offsets(kafka.bootstrap_servers, topic, config.kafka.group_id, 3)
    assert sum(o for o in offsets.values() if o > 0) == len(stream)


def test_outage_of_one_collector_does_not_stop_the_other(kafka, collectors, topics):
    topic, dlq = topics
    a, b = collectors
    a.set_outage(503)
    stream = sample_stream(60, seed=3)
    produce(kafka.bootstrap_servers, topic, stream)
    config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url},
                          group=kafka.new_group(), dlq=dlq)
    with RelayThread(config) as relay:
        assert b.wait_for(lambda c: c.count == len(stream), 60)
        assert a.count == 0 and len(a.attempts) > 0
        assert relay.metric("lineage_relay_delivery_retries_total", collector="a") > 0
        a.clear_outage()
        assert a.wait_for(lambda c: c.count == len(stream), 60)
    assert_run_order(a.events())
    assert {canonical(e) for e in a.events()} == {canonical(orjson.loads(v)) for _, v in stream}
    assert read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=1) == []


def test_retry_after_is_honoured(kafka, collectors, topics):
    topic, dlq = topics
    a, _ = collectors
    a.fail_next(1, 429, retry_after="2")
    events = spark_run("ns", "job", start=datetime(2024, 1, 1, tzinfo=timezone.utc), rng=random.Random(1),
                       with_running=0)[:1]
    produce(kafka.bootstrap_servers, topic, [(b"k", orjson.dumps(e)) for e in events])
    config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=kafka.new_group(), dlq=dlq)
    with RelayThread(config):
        assert a.wait_for(lambda c: c.count == 1, 30)
    first, second = a.attempts[0], a.attempts[1]
    assert first.status == 429 and second.status == 201
    assert second.at - first.at >= 2.0


def test_permanent_rejection_goes_to_dead_letter_topic(kafka, collectors, topics):
    topic, dlq = topics
    a, b = collectors
    stream = sample_stream(10, seed=11)
    victim = orjson.loads(stream[4][1])
    a.reject_when(lambda doc: 400 if doc == victim else None)
    produce(kafka.bootstrap_servers, topic, stream, partition=0)
    config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url},
                          group=kafka.new_group(), dlq=dlq)
    with RelayThread(config) as relay:
        assert b.wait_for(lambda c: c.count == len(stream), 30)
        assert a.wait_for(lambda c: c.count == len(stream) - 1, 30)
        dead = read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=20)
        # Counted when the dead-letter producer's acknowledgement reaches the relay's loop,
        # which may come after another consumer can read the record.
        assert eventually(lambda: relay.metric("lineage_relay_events_dead_lettered_total",
                                               reason="collector_rejected") == 1, 10)
    assert len(dead) == 1
    record = dead[0]
    assert record.value == stream[4][1] and record.key == stream[4][0]
    assert record.headers["reason"] == b"collector_rejected"
    assert record.headers["collector"] == b"a"
    assert b"400" in record.headers["detail"]
    assert record.headers["source"] == f"{topic}/0/4".encode()
    assert len([at for at in a.attempts if at.status == 400]) == 1, "a 400 must not be retried"


def test_malformed_records_are_dead_lettered_and_valid_ones_delivered(kafka, collectors, topics):
    topic, dlq = topics
    a, _ = collectors
    good = [orjson.loads(v) for _, v in sample_stream(3, seed=5, running_per_run=(0, 0))]
    bad_uuid = dict(good[0], run={"runId": "not-a-uuid", "facets": {}})
    no_producer = {k: v for k, v in good[1].items() if k != "producer"}
    bad_type = dict(good[2], eventType="FINISHED")
    malformed = [
        (b"\xff\xfe\x00garbage", "not_utf8"),
        (b'{"eventTime": "2024-01-01T00:00:00Z", ', "invalid_json"),
        (b"[1, 2, 3]", "not_object"),
        (orjson.dumps(bad_uuid), "invalid_value"),
        (orjson.dumps(no_producer), "missing_field"),
        (orjson.dumps(bad_type), "invalid_value"),
        (b'{"x": "' + b"y" * 70_000 + b'"}', "too_large"),
    ]
    records: list[tuple[bytes, bytes]] = []
    for i, event in enumerate(good):
        records.append((b"k", orjson.dumps(event)))
        if i * 2 < len(malformed):
            records.extend((b"bad", m) for m, _ in malformed[i * 2:i * 2 + 2])
    records.extend((b"bad", m) for m, _ in malformed[len(good) * 2:])
    produce(kafka.bootstrap_servers, topic, records)
    config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=kafka.new_group(), dlq=dlq,
                          pipeline={"max_event_bytes": 65_536})
    with RelayThread(config):
        assert a.wait_for(lambda c: c.count == len(good), 30)
        dead = read_topic(kafka.bootstrap_servers, dlq, expected=len(malformed), timeout_s=20)
    assert sorted(r.value for r in dead) == sorted(m for m, _ in malformed)
    reasons = {r.value: r.headers["reason"].decode() for r in dead}
    for value, reason in malformed:
        assert reasons[value] == reason, (value[:40], reasons[value])
    assert all(r.headers["detail"] for r in dead)
    assert {canonical(e) for e in a.events()} == {canonical(e) for e in good}
    offsets = committed_offsets(kafka.bootstrap_servers, topic, config.kafka.group_id, 3)
    assert sum(o for o in offsets.values() if o > 0) == len(records), "nothing may stay uncommitted once dead-lettered"


def test_routing_and_rewrite_per_collector(kafka, collectors, topics):
    topic, dlq = topics
    a, b = collectors
    stream = sample_stream(40, seed=17)
    docs = [orjson.loads(v) for _, v in stream]
    prod = [d for d in docs if d["job"]["namespace"] == "spark-prod"]
    assert 0 < len(prod) < len(docs)
    # A credential in a dataSource URI that must never reach collector a.
    leaky = dict(docs[0], eventType="START", run={"runId": "0190a5c4-0000-7000-8000-000000000001"},
                 job={"namespace": "spark-prod", "name": "leaky.job"})
    leaky["inputs"] = [{"namespace": "postgres://etl:hunter2@db:5432", "name": "shop.public.orders"}]
    leaky_end = dict(leaky, eventType="COMPLETE", eventTime="2030-01-01T00:00:00Z")
    produce(kafka.bootstrap_servers, topic, stream + [(b"k", orjson.dumps(leaky)), (b"k", orjson.dumps(leaky_end))])
    config = relay_config(
        kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url}, group=kafka.new_group(), dlq=dlq)
    data = config.model_dump(mode="json", exclude_defaults=True)
    data["collectors"][0]["route"] = {"include": [{"job_namespace": "spark-prod"}]}
    data["collectors"][0]["rewrite"] = {"namespace_map": [{"from": "spark-prod", "to": "default/spark/prod"}],
                                        "redact_credentials": True}
    from relay.config import build_config

    config = build_config(data)
    with RelayThread(config) as relay:
        assert b.wait_for(lambda c: c.count == len(docs) + 2, 30)
        expected_a = len(prod) + 2
        assert a.wait_for(lambda c: c.count == expected_a, 30)
        assert relay.metric("lineage_relay_events_dropped_total", collector="a", reason="not_routed") == \
            len(docs) + 2 - expected_a
    assert {e["job"]["namespace"] for e in a.events()} == {"default/spark/prod"}
    assert any(b"postgres://db:5432" in r.raw for r in a.received)  # the leaky run arrived, redacted
    assert all(b"hunter2" not in r.raw for r in a.received)
    assert any(b"hunter2" in r.raw for r in b.received)  # b has no redaction configured
    assert_run_order(a.events())
    for e in a.events():
        validator().validate(e)
