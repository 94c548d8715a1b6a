"""``lineage-relay replay`` against a real Kafka-protocol broker and real HTTP collectors:
it back-fills one collector with exactly the events of a range, in run order."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from relay.cli import main as cli
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.events import LineageEvent, SourceRef
from relay.ops.delivery import plan
from relay.ops.progress import ProgressBar
from relay.stages.decode import decode_record
from tests.support.kafka import ReadRecord, produce, read_topic
from tests.support.relay import relay_config

RANK = {"START": 0, "COMPLETE": 2, "FAIL": 2, "ABORT": 2}


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def write_config(tmp_path: Path, kafka, topic: str, collectors: dict[str, str], **collector_extra: Any) -> str:
    config = relay_config(kafka.bootstrap_servers, topic, collectors, group=kafka.new_group(),
                          dlq=f"{topic}.dlq")
    data = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    for entry in data["collectors"]:
        entry.update(collector_extra.get(entry["name"], {}))
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_value(out: str, name: str) -> int:
    match = re.search(rf"^\s+{re.escape(name)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no {name!r} in summary:\n{out}"
    return int(match.group(1))


def run_types(events: list[dict]) -> dict[str, list[str]]:
    by_run: dict[str, list[str]] = defaultdict(list)
    for e in events:
        by_run[e["run"]["runId"]].append(e["eventType"])
    return by_run


def assert_run_order(events: list[dict], *, whole_runs: bool) -> None:
    """START before everything, terminal after everything, for each run; with
    ``whole_runs`` each run also begins with START and ends with its one terminal."""
    for run_id, types in run_types(events).items():
        ranks = [RANK.get(t, 1) for t in types]
        assert ranks == sorted(ranks), f"run {run_id} delivered as {types}"
        assert ranks.count(2) <= 1, f"run {run_id} got several terminals: {types}"
        if whole_runs:
            assert types[0] == "START" and ranks[-1] == 2, f"run {run_id} delivered as {types}"


def all_records(kafka, topic: str, count: int, partitions: int) -> list[ReadRecord]:
    records = read_topic(kafka.bootstrap_servers, topic, expected=count, partitions=partitions)
    assert len(records) == count
    return records


@pytest.fixture
def backfill():
    with RecordingCollector() as collector:
        yield collector


@pytest.mark.kafka
def test_replay_by_offsets_backfills_exactly_the_range_in_run_order(kafka, tmp_path, capsys, backfill):
    topic = kafka.new_topic("ol", partitions=3)
    stream = sample_stream(60, seed=21, duplicate_ratio=0.1, out_of_order_ratio=0.25)
    produce(kafka.bootstrap_servers, topic, stream)
    records = all_records(kafka, topic, len(stream), 3)
    ends = {p: 1 + max(r.offset for r in records if r.partition == p) for p in range(3)}
    first = {p: 3 for p in range(3)}
    last = {p: ends[p] - 5 for p in range(3)}  # inclusive
    in_range = [r for r in records if first[r.partition] <= r.offset <= last[r.partition]]
    expected = {canonical(orjson.loads(r.value)) for r in in_range}
    # The range holds runs whose terminal precedes their START in the topic.
    position = {(orjson.loads(r.value)["run"]["runId"], orjson.loads(r.value)["eventType"]): r.offset
                for r in in_range}
    assert any(position.get((run, t), -1) < position.get((run, "START"), -1)
               for run, t in position if t in RANK and t != "START")

    config = write_config(tmp_path, kafka, topic, {"marquez": "http://127.0.0.1:9", "backfill": backfill.url})
    code, out, err = run_cli(
        capsys, "replay", "--config", config, "--collector", "backfill",
        "--from-offset", ",".join(f"{p}:{o}" for p, o in first.items()),
        *[arg for p, o in last.items() for arg in ("--to-offset", f"{p}:{o}")])

    assert code == 0, out + err
    got = [canonical(e) for e in backfill.events()]
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert set(got) == expected
    assert_run_order(backfill.events(), whole_runs=False)
    assert summary_value(out, "records read") == len(in_range)
    assert summary_value(out, "delivered") == len(expected)
    assert summary_value(out, "duplicates skipped") == len(in_range) - len(expected)
    assert summary_value(out, "failed") == 0
    assert re.search(r"replay: reading \[#+\] \d+/\d+ 100%", err), err
    assert re.search(rf"replay: delivering \[#+\] {len(expected)}/{len(expected)} 100% .*/s ETA", err), err


def produce_at(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], when: datetime) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, timestamp=int(when.timestamp() * 1000))
    assert producer.flush(30) == 0


@pytest.mark.kafka
def test_replay_by_timestamps_takes_the_records_of_the_window(kafka, tmp_path, capsys):
    topic = kafka.new_topic("ol", partitions=2)
    t0 = datetime(2024, 5, 1, tzinfo=UTC)
    batches = [sample_stream(8, seed=seed, out_of_order_ratio=0.3) for seed in (31, 32, 33)]
    for i, batch in enumerate(batches):
        produce_at(kafka.bootstrap_servers, topic, batch, t0 + timedelta(hours=i))
    all_records(kafka, topic, sum(map(len, batches)), 2)

    def unique(batch: list[tuple[bytes, bytes]]) -> set[bytes]:
        return {canonical(orjson.loads(v)) for _, v in batch}

    with RecordingCollector() as middle, RecordingCollector() as latest:
        config = write_config(tmp_path, kafka, topic, {"middle": middle.url, "latest": latest.url})
        # [01:00, 02:00): the start is inclusive, the end exclusive.
        code, out, err = run_cli(capsys, "replay", "--config", config, "--collector", "middle",
                                 "--from-time", "2024-05-01T01:00:00Z", "--to-time", "2024-05-01T03:00:00+01:00")
        assert code == 0, out + err
        code, out2, err2 = run_cli(capsys, "replay", "--config", config, "--collector", "latest",
                                   "--from-time", "2024-05-01T01:30:00Z", "--to-end")
        assert code == 0, out2 + err2
        assert {canonical(e) for e in middle.events()} == unique(batches[1])
        assert middle.count == len(unique(batches[1]))
        assert {canonical(e) for e in latest.events()} == unique(batches[2])
        assert latest.count == len(unique(batches[2]))
        assert_run_order(middle.events(), whole_runs=True)
        assert_run_order(latest.events(), whole_runs=True)
    assert "replay: reading" in err and "100%" in err


@pytest.mark.kafka
def test_replay_routes_rewrites_and_reports_failures(kafka, tmp_path, capsys, backfill):
    topic = kafka.new_topic("ol")
    stream = sample_stream(20, seed=41)
    produce(kafka.bootstrap_servers, topic, stream)
    docs = [orjson.loads(v) for _, v in stream]
    prod = [d for d in docs if d["job"]["namespace"] == "spark-prod"]
    assert 0 < len(prod) < len(docs)
    victim = prod[len(prod) // 2]
    backfill.reject_when(lambda doc: 400 if doc["eventTime"] == victim["eventTime"]
                         and doc["run"]["runId"] == victim["run"]["runId"] else None)
    config = write_config(tmp_path, kafka, topic, {"backfill": backfill.url}, backfill={
        "route": {"include": [{"job_namespace": "spark-prod"}]},
        "rewrite": {"namespace_map": [{"from": "spark-prod", "to": "default/spark/prod"}]}})

    code, out, _ = run_cli(capsys, "replay", "--config", config, "--collector", "backfill",
                           "--from-offset", "0:0", "--to-end")

    assert code == 1, "a failed event makes the exit status nonzero"
    assert summary_value(out, "routed away") == len(docs) - len(prod)
    assert summary_value(out, "delivered") == len(prod) - 1
    assert summary_value(out, "failed") == 1
    assert re.search(rf"FAILED {topic}/0/\d+: collector_rejected: HTTP 400", out), out
    assert backfill.count == len(prod) - 1
    assert {e["job"]["namespace"] for e in backfill.events()} == {"default/spark/prod"}


@pytest.mark.kafka
def test_replay_refuses_a_range_over_max_events_and_dry_run_sends_nothing(kafka, tmp_path, capsys, backfill):
    topic = kafka.new_topic("ol")
    stream = sample_stream(10, seed=51)
    produce(kafka.bootstrap_servers, topic, stream)
    config = write_config(tmp_path, kafka, topic, {"backfill": backfill.url})
    base = ["replay", "--config", config, "--collector", "backfill", "--from-offset", "0:0", "--to-end"]

    code, out, err = run_cli(capsys, *base, "--max-events", str(len(stream) - 1))
    assert code == 2 and out == ""
    assert f"over --max-events {len(stream) - 1}" in err

    code, out, _ = run_cli(capsys, *base, "--dry-run")
    assert code == 0
    assert summary_value(out, "would deliver") == len(stream)
    assert backfill.count == 0 and backfill.attempts == []

    code, _, err = run_cli(capsys, "replay", "--config", config, "--collector", "nope",
                           "--from-offset", "0:0", "--to-end")
    assert code == 2 and "'nope' is not in the configuration; configured: backfill" in err
    code, _, err = run_cli(capsys, *base[:5], "--from-time", "2024-05-01T10:00", "--to-end")
    assert code == 2 and "add a UTC offset" in err
    # Credentials that cannot be read: "could not run" (2), with the key, not a traceback (1).
    (tmp_path / "unset").mkdir()
    unset = write_config(tmp_path / "unset", kafka, topic, {"backfill": backfill.url},
                         backfill={"token_env": "LR_UNSET_TOKEN"})
    code, _, err = run_cli(capsys, "replay", "--config", unset, *base[3:])
    assert code == 2 and "collectors.backfill.token_env: environment variable LR_UNSET_TOKEN is not set" in err


# -- pure parts ---------------------------------------------------------------------------
def _event(run: str, event_type: str, second: int, offset: int) -> LineageEvent:
    doc = {"eventTime": f"2024-05-01T00:00:{second:02d}Z", "eventType": event_type, "producer": "https://x",
           "schemaURL": "https://x", "run": {"runId": run}, "job": {"namespace": "n", "name": "j"}}
    event = decode_record(orjson.dumps(doc), max_bytes=10_000, source=SourceRef("t", 0, offset))
    assert isinstance(event, LineageEvent)
    return event


def test_plan_orders_each_run_and_keeps_one_terminal():
    a, b = "0190a5c4-0000-7000-8000-00000000000a", "0190a5c4-0000-7000-8000-00000000000b"
    events = [_event(a, "COMPLETE", 9, 0), _event(b, "RUNNING", 5, 1), _event(a, "RUNNING", 5, 2),
              _event(a, "START", 1, 3), _event(a, "FAIL", 8, 4), _event(a, "RUNNING", 3, 5)]
    result = plan(events)
    assert [[(e.run_id[-1], e.event_type) for e in chain] for chain in result.chains] == [
        [("a", "START"), ("a", "RUNNING"), ("a", "RUNNING"), ("a", "FAIL")],
        [("b", "RUNNING")]]
    assert [(e.event_type, reason) for e, reason in result.dropped] == [("COMPLETE", "after_terminal")]
    unordered = plan(events, ordered=False)
    assert [e.source.offset for e in unordered.chains[0]] == [0, 2, 3, 4, 5] and not unordered.dropped


def test_redrive_sends_a_terminal_the_relay_would_drop_after_its_run_never_beside_it():
    """An operator chose each dead letter, so redrive drops none; a second terminal goes at
    the end of its run's chain, not in a chain of its own that another worker would send
    alongside the run's START."""
    from relay.ops.redrive_targets import _chains

    a, b = "0190a5c4-0000-7000-8000-00000000000a", "0190a5c4-0000-7000-8000-00000000000b"
    events = [_event(a, "START", 1, 0), _event(a, "COMPLETE", 5, 1), _event(b, "START", 2, 2),
              _event(a, "FAIL", 6, 3)]
    chains = _chains(events, ordered=True)
    assert [[(e.run_id[-1], e.event_type) for e in chain] for chain in chains] == [
        [("a", "START"), ("a", "COMPLETE"), ("a", "FAIL")], [("b", "START")]]


def test_operator_commands_give_up_on_an_event_when_retries_are_otherwise_unlimited():
    """The relay retries for ever (it pauses its partitions instead); replay and redrive run
    while the collector is down must end."""
    from relay.config import CollectorConfig
    from relay.ops.delivery import OPS_MAX_ATTEMPTS, collector_config

    unlimited = CollectorConfig(name="c", url="http://127.0.0.1:9")
    assert unlimited.retry.max_attempts is None
    assert collector_config(unlimited, None).retry.max_attempts == OPS_MAX_ATTEMPTS
    assert collector_config(unlimited, 3).retry.max_attempts == 3
    bounded = CollectorConfig(name="c", url="http://127.0.0.1:9", retry={"max_attempts": 4})
    assert collector_config(bounded, None).retry.max_attempts == 4
    # The rest of the retry policy is the collector's own: an event it keeps failing on is
    # given up as in the relay (the override used to reset it to the default).
    tuned = CollectorConfig(name="c", url="http://127.0.0.1:9", retry={"poison_after_attempts": 3,
                                                                       "initial_backoff_s": 0.5})
    assert collector_config(tuned, None).retry.poison_after_attempts == 3
    assert collector_config(tuned, 2).retry.model_dump() == {**tuned.retry.model_dump(), "max_attempts": 2}


def test_progress_prints_every_tenth_off_a_terminal_and_redraws_on_one():
    now = [0.0]
    log = io.StringIO()
    bar = ProgressBar("copy", 200, stream=log, clock=lambda: now[0], tty=False)
    for _ in range(200):
        now[0] += 0.01
        bar.advance()
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("copy [##") and " 20/200  10% 100/s ETA 0:00:01" in lines[0]
    assert lines[-1].endswith("200/200 100% 100/s ETA 0:00:00")

    tty = io.StringIO()
    bar = ProgressBar("copy", 0, stream=tty, clock=lambda: now[0], tty=True)
    bar.add_total(3)
    for _ in range(3):
        now[0] += 1
        bar.advance()
    bar.close()
    assert tty.getvalue().count("\r") == 4 and tty.getvalue().endswith("3/3 100% 1/s ETA 0:00:00\n")
