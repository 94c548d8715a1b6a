"""Run state that survives: a second relay process joins the group while runs are open
(rebalance), then the first is killed with open runs (kill -9)."""

from __future__ import annotations

import re

import orjson
import pytest
import requests

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import produce
from tests.support.relay import RelayProcess, RelayThread, eventually, relay_config
from tests.support.runs import TERMINAL, by_run, finished_runs, normalised
from tests.support.spec import validator

pytestmark = pytest.mark.kafka

CONSOLIDATION = {"settle_s": 1.0, "parent_hold_s": 1.0, "missing_start": {"timeout_s": 30}}


def wait_until(predicate, timeout_s: float, what: str) -> None:
    assert eventually(predicate, timeout_s), f"timed out waiting for {what}"


def metric(proc: RelayProcess, name: str, **labels: str) -> float:
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}{{{re.escape(selector)}}} (\S+)$", proc.metrics_text(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def partitions_owned(proc: RelayProcess) -> int:
    return requests.get(f"http://127.0.0.1:{proc.http_port}/readyz", timeout=5).json()["partitions"]


def test_kill_9_with_open_runs_survivor_gives_the_same_view_as_one_uninterrupted_relay(kafka, tmp_path):
    topic, dlq, group = kafka.new_topic("rs", partitions=4), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(90, seed=41, duplicate_ratio=0.05, out_of_order_ratio=0.1, running_per_run=(1, 3))
    run_ids = {orjson.loads(v)["run"]["runId"] for _, v in stream}
    first_half, second_half = stream[: len(stream) // 2], stream[len(stream) // 2:]
    config = tmp_path / "relay.yaml"
    config.write_text(orjson.dumps({"collectors": [{"name": "x", "url": "http://placeholder:1",
                                                    "consolidation": CONSOLIDATION}]}).decode())
    with RecordingCollector(latency_s=0.005) as pair, RecordingCollector() as single:
        args = ["--config", str(config), "--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic,
                "--group-id", group, "--dlq-topic", dlq, "--collector", f"x={pair.url}",
                "--collector-mode", "x=consolidated"]
        for key, value in kafka.consumer_properties().items():
            args += ["--consumer-property", f"{key}={value}"]
        doomed = RelayProcess(args, log_path=tmp_path / "a.log").start()
        survivor = None
        try:
            produce(kafka.bootstrap_servers, topic, first_half)
            holding = lambda: metric(doomed, "lineage_relay_open_runs", collector="x") > 0  # noqa: E731
            wait_until(lambda: finished_runs(pair.events()) >= 5 and holding(), 60, "the first relay to deliver and hold runs")
            # A second replica joins: partitions with open runs move to it (rebalance).
            survivor = RelayProcess(args, log_path=tmp_path / "b.log").start()
            restored = lambda: metric(survivor, "lineage_relay_runs_restored_total", collector="x")  # noqa: E731
            wait_until(lambda: partitions_owned(doomed) and restored() > 0, 60, "partitions to move with their runs")
            moved = restored()
            wait_until(holding, 10, "the first relay to still hold open runs of its remaining partitions")
            doomed.kill9()
            produce(kafka.bootstrap_servers, topic, second_half)
            wait_until(lambda: finished_runs(pair.events()) == len(run_ids), 120, "every run to finish at the pair's collector")
            assert restored() > moved, (moved, restored())  # then the dead one's runs
        finally:
            doomed.close()
            if survivor is not None:
                assert survivor.terminate(30) == 0
                survivor.close()
        reference = relay_config(kafka.bootstrap_servers, topic, {"x": single.url}, group=kafka.new_group(),
                                 dlq=dlq, collector={"mode": "consolidated", "consolidation": CONSOLIDATION})
        with RelayThread(reference):
            wait_until(lambda: finished_runs(single.events()) == len(run_ids), 60, "the uninterrupted relay")

    spec = validator()
    got, want = by_run(pair.events()), by_run(single.events())
    assert set(got) == set(want) == run_ids, "a run was lost"
    for run_id, events in got.items():
        types = [e["eventType"] for e in events]
        assert [e["eventType"] for e in want[run_id]] == ["START", types[-1]]
        assert types[0] == "START", (run_id, types)
        first_terminal = next(i for i, t in enumerate(types) if t in TERMINAL)
        assert "START" not in types[first_terminal:], f"run {run_id}: a START after the terminal: {types}"
        # Duplicates of an output may follow a crash (at-least-once); never anything different.
        assert {normalised(e) for e in events} == {normalised(e) for e in want[run_id]}, run_id
        for event in events:
            spec.validate(event)
