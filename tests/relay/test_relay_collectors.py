"""Collector kinds through the relay, against a real broker and loopback stand-ins that
check what the real services check (tests/support/kind_servers.py): path, credentials,
body shape, event kinds. Routing by namespace decides who gets what; a rotated token
file is picked up without restart; no token shows in logs or /metrics."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import chain, zip_longest

import orjson
import pytest
from prometheus_client import generate_latest

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import (
    PRODUCER_URI,
    SCHEMA_URL,
    dataset_event,
    iso_time,
    job_event,
    message_key,
    spark_run,
)
from relay.logs import JsonFormatter
from tests.support.busy_collector import BusyCollector
from tests.support.kafka import committed_offsets, produce, read_topic
from tests.support.kind_servers import (
    DATAHUB,
    MARQUEZ,
    OPENMETADATA,
    KindServer,
    atlan,
    kind_of,
)
from tests.support.relay import RelayProcess, RelayThread, eventually
from tests.support.runs import TERMINAL, by_run
from tests.support.spec import validator

pytestmark = pytest.mark.kafka

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
NAMESPACES = ("ns-marquez", "ns-atlan", "ns-datahub", "ns-om")


def runs_in(namespace: str, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    events: list[dict] = []
    for i in range(count):
        events += spark_run(namespace, f"etl.job_{i}", start=T0 + timedelta(seconds=i), rng=rng,
                            with_running=rng.randint(0, 2), fail=i == 1)
    return events


def records(events: list[dict]) -> list[tuple[bytes, bytes]]:
    return [(message_key(e).encode(), orjson.dumps(e)) for e in events]


def test_each_kind_gets_what_its_route_and_contract_admit(kafka, tmp_path, monkeypatch, caplog):
    topic, dlq, group = kafka.new_topic("kinds", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    run_events = {ns: runs_in(ns, 4, seed) for seed, ns in enumerate(NAMESPACES)}
    static = [dataset_event("s3://warehouse", "orders", event_time=T0),
              dataset_event("s3://warehouse", "customers", event_time=T0),
              job_event("ns-jobs", "nightly.sql", event_time=T0, inputs=[("s3://raw", "orders")],
                        outputs=[("s3://warehouse", "orders")], sql="select 1")]
    # Namespaces interleaved; each run's events stay in order.
    mixed = [e for e in chain.from_iterable(zip_longest(*run_events.values())) if e is not None]
    stream = records(mixed + static)
    assert len({v for _, v in stream}) == sum(map(len, run_events.values())) + len(static)
    produce(kafka.bootstrap_servers, topic, stream)

    secrets = {"atlan": "atlan-key-1a2b3c", "datahub": "datahub-pat-4d5e6f", "om": "om-jwt-7a8b9c"}
    monkeypatch.setenv("DATAHUB_TOKEN", secrets["datahub"])
    jwt = tmp_path / "om-jwt"
    jwt.write_text(secrets["om"] + "\n")
    fast = {"initial_backoff_s": 0.05, "max_backoff_s": 1.0}
    with KindServer(MARQUEZ) as marquez, KindServer(atlan("spark"), token=secrets["atlan"]) as atlan_, \
            KindServer(DATAHUB, token=secrets["datahub"]) as datahub, \
            KindServer(OPENMETADATA, token=secrets["om"]) as om, RecordingCollector() as generic:
        collectors = [
            {"name": "marquez", "type": "marquez", "url": marquez.url, "retry": fast,
             "route": {"include": [{"job_namespace": "ns-marquez"}, {"kinds": ["dataset", "job"]}]}},
            {"name": "atlan", "type": "atlan", "url": atlan_.url, "connector": "spark",
             "token": secrets["atlan"], "retry": fast, "route": {"include": [{"job_namespace": "ns-atlan"}]},
             "consolidation": {"settle_s": 0.3, "parent_hold_s": 0.3, "missing_start": {"timeout_s": 20}}},
            {"name": "datahub", "type": "datahub", "url": datahub.url, "token_env": "DATAHUB_TOKEN", "retry": fast,
             "route": {"include": [{"job_namespace": "ns-datahub"}]}},
            {"name": "om", "type": "openmetadata", "url": om.url, "token_file": str(jwt), "retry": fast,
             "batch": {"max_events": 50, "linger_ms": 20},
             "route": {"include": [{"job_namespace": "ns-om"}]}},
            {"name": "everything", "url": generic.url, "retry": fast},
        ]
        config = build_config({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                      "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
            "collectors": collectors, "http": {"port": None}, "drain_timeout_s": 10})
        caplog.set_level(logging.DEBUG)
        with RelayThread(config) as relay:
            assert generic.wait_for(lambda c: c.count == len(stream), 60), generic.count
            assert marquez.wait_for(lambda s: len(s.received()) == len(run_events["ns-marquez"]) + 3, 30)
            assert datahub.wait_for(lambda s: len(s.received()) == len(run_events["ns-datahub"]), 30)
            assert om.wait_for(lambda s: len(s.received()) == len(run_events["ns-om"]), 30)
            assert atlan_.wait_for(lambda s: len(s.received()) == 2 * 4, 60), len(atlan_.received())
            assert eventually(lambda: sum(o for o in committed_offsets(
                kafka.bootstrap_servers, topic, group, 2).values() if o > 0) == len(stream), 30)
            metrics_text = generate_latest(relay.relay.metrics.registry).decode()
            dropped = {name: {reason: relay.metric("lineage_relay_events_dropped_total", collector=name, reason=reason)
                              for reason in ("unsupported_event_kind", "not_routed")}
                       for name in ("marquez", "atlan", "datahub", "om")}

    # Routing by namespace: each got its own runs and nothing else.
    def namespaces(server) -> Counter:
        return Counter(e["job"]["namespace"] if kind_of(e) != "dataset" else "dataset" for e in server.received())

    assert namespaces(marquez) == {"ns-marquez": len(run_events["ns-marquez"]), "dataset": 2, "ns-jobs": 1}
    assert namespaces(datahub) == {"ns-datahub": len(run_events["ns-datahub"])}
    assert namespaces(om) == {"ns-om": len(run_events["ns-om"])}
    assert set(namespaces(atlan_)) == {"ns-atlan"}
    # Kinds that take RunEvents only never saw the others: each counted under its reason,
    # before any route rule (a rule naming only kinds the collector does not take, such as
    # datahub with kinds: [dataset, job], is refused at start-up: see test_config).
    for name in ("datahub", "om", "atlan"):
        assert dropped[name]["unsupported_event_kind"] == len(static), name
    assert dropped["marquez"]["unsupported_event_kind"] == 0
    assert dropped["marquez"]["not_routed"] == len(mixed) - len(run_events["ns-marquez"])
    # Atlan's contract: each run as its START and one terminal event (consolidated by default).
    spec = validator()
    for run_id, events in by_run(atlan_.received()).items():
        assert [e["eventType"] for e in events][0] == "START" and len(events) == 2, run_id
        assert events[1]["eventType"] in TERMINAL
        for event in events:
            spec.validate(event)
    # OpenMetadata got batches ({"events": [...]}) on its batch path, never single events.
    assert {r.path for r in om.seen()} == {OPENMETADATA.batch_path}
    assert sum(r.events for r in om.seen()) == len(run_events["ns-om"]) and len(om.seen()) < len(run_events["ns-om"])
    # Paths and credentials were right the first time: nothing refused, nothing dead-lettered.
    for server, header in ((marquez, None), (atlan_, f"Bearer {secrets['atlan']}"),
                           (datahub, f"Bearer {secrets['datahub']}"), (om, f"Bearer {secrets['om']}")):
        assert {r.status for r in server.seen()} <= {200, 201}, server.seen()[:3]
        assert {r.authorization for r in server.seen()} == {header}
    assert read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=1) == []
    # No token anywhere in what the relay logged or exposed.
    logged = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert "delivery" in logged or "relay_started" in logged
    for secret in secrets.values():
        assert secret not in logged and secret not in metrics_text


def test_a_rotated_token_file_is_used_without_restart_and_never_shown(kafka, tmp_path):
    topic, dlq, group = kafka.new_topic("rotate"), kafka.new_topic("dlq"), kafka.new_group()
    old, new = "jwt-old-0c0ffee0", "jwt-new-5ca1ab1e"
    token_file = tmp_path / "token"
    token_file.write_text(old)
    first = records(runs_in("ns-om", 3, seed=1))
    second = records(runs_in("ns-om", 3, seed=2))
    produce(kafka.bootstrap_servers, topic, first)
    with KindServer(DATAHUB, token=old) as server:
        config = tmp_path / "relay.yaml"
        config.write_text(
            "kafka:\n"
            f"  bootstrap_servers: {kafka.bootstrap_servers}\n  topics: [{topic}]\n  group_id: {group}\n"
            f"  dlq_topic: {dlq}\n  consumer_properties: {{session.timeout.ms: 6000, heartbeat.interval.ms: 500}}\n"
            "collectors:\n"
            f"  - name: datahub\n    type: datahub\n    url: {server.url}\n    token_file: {token_file}\n"
            "    retry: {initial_backoff_s: 0.05, max_backoff_s: 0.5}\n")
        proc = RelayProcess(["--config", str(config), "--log-level", "debug"], log_path=tmp_path / "relay.log")
        proc.start()
        try:
            assert server.wait_for(lambda s: len(s.received()) == len(first), 30)
            # Rotation: the service now takes only the new token, and the mounted file changes.
            server.token = new
            token_file.write_text(new + "\n")
            produce(kafka.bootstrap_servers, topic, second)
            assert server.wait_for(lambda s: len(s.received()) == len(first) + len(second), 30), \
                len(server.received())
            # The server keeps an event before it answers; the relay counts it once it read the answer.
            forwarded = f'lineage_relay_events_forwarded_total{{collector="datahub"}} {float(len(first) + len(second))}'
            assert eventually(lambda: forwarded in proc.metrics_text(), 10), proc.metrics_text()
            metrics = proc.metrics_text()
        finally:
            assert proc.terminate(30) == 0
    accepted = [r.authorization for r in server.seen() if r.status == 201]
    assert accepted[:len(first)] == [f"Bearer {old}"] * len(first)
    assert accepted[len(first):] == [f"Bearer {new}"] * len(second)
    assert read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=1) == []
    log = (tmp_path / "relay.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(line["event"] == "relay_started" for line in lines)
    for secret in (old, new):
        assert secret not in log and secret not in metrics


def test_an_adaptive_collector_that_sheds_load_gets_every_event_in_run_order_and_the_other_is_not_held_up(kafka):
    topic, dlq, group = kafka.new_topic("adaptive", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    events = runs_in("ns-busy", 60, seed=7)
    produce(kafka.bootstrap_servers, topic, records(events))
    with BusyCollector(workers=4, service_s=0.005, shed=True) as busy, RecordingCollector() as steady:
        config = build_config({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                      "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES)},
            "collectors": [
                {"name": "busy", "url": busy.url, "adaptive_concurrency": {"min": 1},
                 "retry": {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}},
                {"name": "steady", "url": steady.url}],
            "http": {"port": None}})
        with RelayThread(config) as relay:
            assert eventually(lambda: busy.ok == len(events) and steady.count == len(events), 60), \
                (busy.ok, steady.count, len(events))
            registry = relay.relay.metrics.registry
            limit = registry.get_sample_value("lineage_relay_collector_concurrency_limit", {"collector": "busy"})
            assert limit is not None and 1 <= limit <= 8, limit  # learnt: about what it takes at once
            # The other collector's limit is its fixed ceiling.
            assert registry.get_sample_value("lineage_relay_collector_concurrency_limit",
                                             {"collector": "steady"}) == 32
    received = [orjson.loads(body) for body in busy.received]
    for run in by_run(received).values():
        assert run[0]["eventType"] == "START"
        assert sum(e["eventType"] in TERMINAL for e in run) == 1
        assert run[-1]["eventType"] in TERMINAL
    assert sorted(map(orjson.dumps, received)) == sorted(orjson.dumps(e) for e in events)
    # Over 4 at once it refuses; the relay's limit keeps that rare: 28-30 refusals here,
    # where the fixed 32 ran into 246 (more than there are events).
    assert busy.shed_count <= len(events) // 2, (busy.shed_count, len(events))


def test_a_collector_that_raises_gets_its_event_dead_lettered_and_the_partition_goes_on(kafka, caplog):
    """A plugged-in kind that raises instead of returning a verdict (a bug): the event is
    dead-lettered with reason ``relay_error`` and the traceback logged, the run's next
    events and every other run are delivered, and every offset is committed. A worker that
    died with the exception used to hold that offset, and the partition's commits, for good."""
    topic, dlq, group = kafka.new_topic("raises"), kafka.new_topic("raises-dlq"), kafka.new_group()
    rng = random.Random(5)
    runs = [spark_run("ns", f"job-{i}", start=T0 + timedelta(minutes=i), rng=rng, with_running=1) for i in range(6)]
    broken = runs[2][1]  # the RUNNING of the third run
    assert broken["eventType"] == "RUNNING"
    broken["run"]["facets"]["note"] = {"_producer": "https://example.com", "_schemaURL": "https://example.com/x",
                                       "text": "explode"}
    events = list(chain.from_iterable(runs))
    produce(kafka.bootstrap_servers, topic, records(events))
    config = build_config({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                  "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
        "collectors": [{"name": "inbox", "type": "tests.support.plugin_kind.InboxKind", "url": "http://unused",
                        "mailbox": "lineage", "concurrency": 2}],
        "http": {"port": None}, "drain_timeout_s": 10})
    with caplog.at_level(logging.ERROR, logger="relay.dispatch"), RelayThread(config) as relay:
        inbox = relay.relay.lanes[0].collector
        assert eventually(lambda: len(inbox.events) == len(events) - 1, 30), "every other event delivered"
        assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1)[0] == len(events), 30)
    dead = read_topic(kafka.bootstrap_servers, dlq, expected=1)
    assert len(dead) == 1 and orjson.loads(dead[0].value) == broken
    assert dead[0].headers["reason"] == b"relay_error" and dead[0].headers["collector"] == b"inbox"
    assert b"RuntimeError: inbox exploded" in dead[0].headers["detail"]
    delivered = [orjson.loads(b) for b in inbox.events]
    third = [e["eventType"] for e in delivered if e["run"]["runId"] == broken["run"]["runId"]]
    assert third == ["START", "COMPLETE"]
    errors = [r for r in caplog.records if r.getMessage() == "delivery_error"]
    assert len(errors) == 1 and errors[0].exc_info is not None


def ol_run(name: str, *steps: tuple[str, tuple[str, ...]], namespace: str = "spark-prod",
           minute: int = 0) -> list[dict]:
    """A run's events: ``(eventType, output dataset namespaces)`` each, no inputs."""
    run_id = str(uuid.uuid5(uuid.NAMESPACE_OID, name))
    return [{"eventType": event_type, "eventTime": iso_time(T0 + timedelta(minutes=minute, seconds=i)),
             "producer": PRODUCER_URI, "schemaURL": SCHEMA_URL, "run": {"runId": run_id},
             "job": {"namespace": namespace, "name": name}, "inputs": [],
             "outputs": [{"namespace": ns, "name": f"{name}_out"} for ns in outputs]}
            for i, (event_type, outputs) in enumerate(steps)]


def test_a_route_by_dataset_namespace_takes_whole_runs_start_first_without_waiting(kafka):
    """README's route: Spark runs that touch ``s3://warehouse*``, START/COMPLETE/FAIL. A
    START names no output, its COMPLETE does: the START waits for it (its offset
    uncommitted) and goes first, at once; a run writing elsewhere sends nothing. The START
    used to be not routed and the COMPLETE held for it: dead-lettered after hold_timeout_s."""
    topic, dlq, group = kafka.new_topic("by-run", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    nothing: tuple[str, ...] = ()
    warehouse = ol_run("warehouse_load", ("START", nothing), ("COMPLETE", ("s3://warehouse",)))
    with_running = ol_run("warehouse_merge", ("START", nothing), ("RUNNING", nothing),
                          ("COMPLETE", ("s3://warehouse",)), minute=1)
    overtaken = ol_run("warehouse_late", ("START", nothing), ("COMPLETE", ("s3://warehouse",)), minute=2)
    lake = ol_run("lake_only", ("START", nothing), ("RUNNING", ("s3://lake",)), ("COMPLETE", ("s3://lake",)),
                  minute=3)
    airflow = ol_run("airflow_task", ("START", nothing), ("COMPLETE", ("s3://warehouse",)), namespace="airflow",
                     minute=4)
    events = warehouse + with_running + overtaken[::-1] + lake + airflow  # a COMPLETE ahead of its START
    stream = records(events)
    produce(kafka.bootstrap_servers, topic, stream)
    hold_timeout_s = 60
    with RecordingCollector() as collector:
        config = build_config({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                      "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
            "collectors": [{"name": "warehouse", "url": collector.url, "route": {"include": [
                {"job_namespace": "spark-*", "dataset_namespace": "s3://warehouse*",
                 "event_types": ["START", "COMPLETE", "FAIL"]}]}}],
            "pipeline": {"ordering": {"hold_timeout_s": hold_timeout_s, "on_hold_timeout": "dead_letter"}},
            "http": {"port": None}, "drain_timeout_s": 10})
        with RelayThread(config) as relay:
            began = time.monotonic()
            assert collector.wait_for(lambda c: c.count >= 6, hold_timeout_s / 2), collector.events()
            assert time.monotonic() - began < hold_timeout_s / 2
            # Everything settled (delivered, or not routed): every offset committed.
            assert eventually(lambda: sum(o for o in committed_offsets(
                kafka.bootstrap_servers, topic, group, 2).values() if o > 0) == len(stream), 30)
            lane = relay.relay.lanes[0]
            assert lane.held == 0 and lane.pending == 0
            not_routed = relay.metric("lineage_relay_events_dropped_total", collector="warehouse",
                                      reason="not_routed")
    got = [(e["job"]["name"], e["eventType"]) for e in collector.events()]
    by_job = {name: [t for n, t in got if n == name] for name, _ in got}
    assert by_job == {"warehouse_load": ["START", "COMPLETE"], "warehouse_merge": ["START", "COMPLETE"],
                      "warehouse_late": ["START", "COMPLETE"]}
    assert not_routed == 1 + len(lake) + len(airflow)  # warehouse_merge's RUNNING, and the rest
    assert read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=1) == []
