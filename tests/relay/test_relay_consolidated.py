"""Consolidated delivery through the relay, against a real broker and a real HTTP collector."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from relay.config import build_config
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import SCHEMA_URL, iso_time, sample_stream, spark_run
from relay.events import LineageEvent
from relay.stages.decode import decode_record
from relay.stages.merge import consolidate
from tests.support.kafka import committed_offsets, produce, read_to_end
from tests.support.relay import RelayThread, eventually, relay_config
from tests.support.runs import TERMINAL, by_run, finished_runs, normalised
from tests.support.spec import validator

pytestmark = pytest.mark.kafka

CONSOLIDATED = {"mode": "consolidated",
                "consolidation": {"settle_s": 0.3, "parent_hold_s": 0.3, "missing_start": {"timeout_s": 20}}}


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def committed(kafka, topic: str, group: str, partitions: int) -> int:
    return sum(o for o in committed_offsets(kafka.bootstrap_servers, topic, group, partitions).values() if o > 0)


def expected_views(stream: list[tuple[bytes, bytes]]) -> dict[str, tuple[bytes, bytes]]:
    """Per run: the START as produced and the consolidated terminal (the union of the run)."""
    decoded: dict[str, list[LineageEvent]] = defaultdict(list)
    for _, value in stream:
        event = decode_record(value, max_bytes=1 << 24)
        decoded[event.run_id].append(event)
    return {run_id: (normalised(next(e.doc for e in events if e.event_type == "START")),
                     normalised(consolidate(events)))
            for run_id, events in decoded.items()}


def test_consolidated_collector_sees_each_run_as_start_and_one_terminal_with_the_union(kafka):
    topic, dlq = kafka.new_topic("cons", partitions=3), kafka.new_topic("dlq")
    stream = sample_stream(120, seed=31, duplicate_ratio=0.1, out_of_order_ratio=0.1, running_per_run=(1, 3))
    expected = expected_views(stream)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as consolidated, RecordingCollector() as passthrough:
        config = relay_config(kafka.bootstrap_servers, topic, {"c": consolidated.url}, group=kafka.new_group(),
                              dlq=dlq, collector=CONSOLIDATED)
        data = config.model_dump(mode="json", exclude_defaults=True)
        data["collectors"].append({"name": "p", "url": passthrough.url})  # beside it, unchanged
        config = build_config(data)
        with RelayThread(config) as relay:
            assert consolidated.wait_for(lambda c: c.count >= 2 * len(expected), 60), consolidated.count
            assert passthrough.wait_for(lambda c: c.count >= len({canonical(orjson.loads(v)) for _, v in stream}), 60)
            # Everything consumed was settled, so everything gets committed: then nothing more is coming.
            assert eventually(lambda: committed(kafka, topic, config.kafka.group_id, 3) == len(stream), 30), \
                "not every offset was committed"
            assert relay.metric("lineage_relay_open_runs", collector="c") == 0
            assert relay.metric("lineage_relay_starts_synthesized_total", collector="c") == 0
    spec = validator()
    runs = by_run(consolidated.events())
    assert set(runs) == set(expected)
    for run_id, events in runs.items():
        assert [e["eventType"] for e in events][0] == "START", (run_id, [e["eventType"] for e in events])
        assert len(events) == 2 and events[1]["eventType"] in TERMINAL, [e["eventType"] for e in events]
        start, terminal = expected[run_id]
        assert normalised(events[0]) == start
        assert normalised(events[1]) == terminal, f"run {run_id}: the terminal is not the union of the run"
        for event in events:
            spec.validate(event)
    # The changelog got the runs' state, and every finished run is recorded as such.
    records = read_to_end(kafka.bootstrap_servers, f"{config.kafka.group_id}.run-state")
    assert {r.key.decode().partition("/")[2] for r in records} >= set(expected)


def test_a_child_whose_start_comes_first_reaches_the_collector_after_its_parent(kafka):
    topic, dlq = kafka.new_topic("parent"), kafka.new_topic("dlq")
    t0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
    parent_run = "0190a5c4-0000-7000-8000-00000000a001"

    def airflow(event_type: str, seconds: float) -> dict:
        return {"eventTime": iso_time(t0 + timedelta(seconds=seconds)), "schemaURL": SCHEMA_URL,
                "producer": "https://github.com/apache/airflow/tree/providers-openlineage/1.8.0",
                "eventType": event_type, "run": {"runId": parent_run, "facets": {}},
                "job": {"namespace": "airflow-prod", "name": "orders_dag.load", "facets": {}},
                "inputs": [], "outputs": []}

    child = spark_run("spark-prod", "orders_etl.load", start=t0 + timedelta(seconds=5), rng=random.Random(4),
                      with_running=1, parent=("airflow-prod", "orders_dag.load", parent_run))
    # The child's START and RUNNING are in the topic before the parent's START.
    ordered = [child[0], child[1], airflow("START", 0), child[2], airflow("COMPLETE", 300)]
    produce(kafka.bootstrap_servers, topic, [(b"run:airflow-prod/orders_dag", orjson.dumps(e)) for e in ordered])
    with RecordingCollector() as collector:
        overrides = {**CONSOLIDATED, "consolidation": {**CONSOLIDATED["consolidation"], "parent_hold_s": 20}}
        config = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(),
                              dlq=dlq, collector=overrides)
        with RelayThread(config):
            assert collector.wait_for(lambda c: c.count >= 4, 30), collector.count
    sent = [(e["run"]["runId"], e["eventType"]) for e in collector.events()]
    child_run = child[0]["run"]["runId"]
    assert sent.index((parent_run, "START")) < sent.index((child_run, "START")), sent
    assert sorted(sent) == sorted([(parent_run, "START"), (parent_run, "COMPLETE"),
                                   (child_run, "START"), (child_run, "COMPLETE")])
    for event in collector.events():
        validator().validate(event)


def test_coalesce_collector_gets_each_runs_runnings_as_one_between_start_and_terminal(kafka):
    topic, dlq = kafka.new_topic("coal", partitions=2), kafka.new_topic("dlq")
    stream = sample_stream(40, seed=33, duplicate_ratio=0.1, out_of_order_ratio=0.1, running_per_run=(1, 3))
    expected = expected_views(stream)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        config = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(), dlq=dlq,
                              collector={"mode": "coalesce", "consolidation": {"coalesce_window_s": 60}})
        with RelayThread(config):
            assert collector.wait_for(lambda c: finished_runs(c.events()) == len(expected), 60)
            assert eventually(lambda: committed(kafka, topic, config.kafka.group_id, 2) == len(stream), 30)
    runs = by_run(collector.events())
    assert set(runs) == set(expected)
    with_running = 0
    for run_id, events in runs.items():
        types = [e["eventType"] for e in events]
        # RUNNINGs that reach the relay after the run's terminal are dropped (after_terminal).
        assert types in (["START", "RUNNING", types[-1]], ["START", types[-1]]) and types[-1] in TERMINAL, types
        with_running += "RUNNING" in types
        assert normalised(events[0]) == expected[run_id][0]
        for event in events:
            validator().validate(event)
    assert with_running >= len(expected) - round(len(expected) * 0.1)  # all but the runs whose terminal came first
