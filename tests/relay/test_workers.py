"""``lineage-relay run --workers 2``: a supervisor and two relay processes in one consumer
group, against a real broker and a real collector on loopback."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, process_state, produce
from tests.support.relay import RelayProcess, eventually

pytestmark = pytest.mark.kafka

TERMINAL = {"COMPLETE", "FAIL", "ABORT"}
#: drain_timeout_s (default 20) + CLOSE_MARGIN_S + the supervisor's EXIT_MARGIN_S, and slack.
STOP_BOUND_S = 20 + 5 + 5 + 5


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def relay_args(kafka, topic, dlq, group, collector, workers="2"):
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic, "--group-id", group,
            "--dlq-topic", dlq, "--collector", f"a={collector.url}", "--workers", workers]
    for k, v in kafka.consumer_properties().items():
        args += ["--consumer-property", f"{k}={v}"]
    return args


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def worker_pids(path: Path) -> list[int]:
    [started] = [line for line in log_lines(path) if line["event"] == "workers_started"]
    return started["pids"]


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet."""
    try:
        return process_state(pid) == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def close_group(proc: RelayProcess) -> None:
    """Stop the supervisor, and SIGKILL its whole process group whatever happened (its own
    session: ``own_group``): a test that failed half-way leaves no worker behind."""
    pgid = proc.proc.pid if proc.proc is not None else None
    try:
        proc.close()
    finally:
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def consumed_by_worker(text: str) -> dict[str, float]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["worker"]: s.value for s in families["lineage_relay_events_consumed"].samples
            if s.name.endswith("_total")}


def assert_run_order(events: list[dict]) -> None:
    """Per run: the first event is START, exactly one terminal, nothing after it."""
    by_run: dict[str, list[str]] = defaultdict(list)
    for e in events:
        by_run[e["run"]["runId"]].append(e.get("eventType"))
    for run_id, types in by_run.items():
        assert types[0] == "START", f"run {run_id} began with {types}"
        terminals = [i for i, t in enumerate(types) if t in TERMINAL]
        assert terminals == [len(types) - 1], f"run {run_id} had terminals {types}"


def test_two_workers_share_the_partitions_deliver_in_order_and_stop_cleanly(kafka, tmp_path):
    topic, dlq, group = kafka.new_topic("workers", partitions=4), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(600, seed=41, duplicate_ratio=0.10, out_of_order_ratio=0.08)
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    assert len(stream) > 2000 and len(stream) - len(unique) >= 0.09 * len(stream)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        first = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r1.log",
                             own_group=True)
        try:
            first.start()  # inside: a start that fails leaves no supervisor or worker (close_group)
            base = f"http://127.0.0.1:{first.http_port}"
            assert collector.wait_for(lambda c: c.count >= len(unique), 90), f"got {collector.count}"
            # Every record consumed, by both workers (each got partitions), as the supervisor reports it.
            assert eventually(lambda: sum(consumed_by_worker(first.metrics_text()).values()) == len(stream), 30), \
                first.metrics_text()[-3000:]
            by_worker = consumed_by_worker(first.metrics_text())
            assert set(by_worker) == {"0", "1"} and all(by_worker.values()), by_worker
            ready = requests.get(base + "/readyz", timeout=5)
            assert ready.status_code == 200
            assert [(w["worker"], w["ready"]) for w in ready.json()["workers"]] == [(0, True), (1, True)]
            assert sum(w["partitions"] for w in ready.json()["workers"]) == 4
            health = requests.get(base + "/healthz", timeout=5)
            assert health.status_code == 200 and [w["status"] for w in health.json()["workers"]] == ["ok", "ok"]
            pids = worker_pids(tmp_path / "r1.log")
            began = time.monotonic()
            assert first.terminate(timeout_s=STOP_BOUND_S) == 0
            assert time.monotonic() - began < STOP_BOUND_S
            assert all(gone(pid) for pid in pids)
        finally:
            close_group(first)
        events = collector.events()
        got = Counter(canonical(e) for e in events)
        assert set(got) == unique and max(got.values()) == 1, "an event missing, or a duplicate forwarded"
        assert_run_order(events)
        lines = log_lines(tmp_path / "r1.log")
        stopped = [line for line in lines if line["event"] == "relay_stopped"]
        assert sorted(line["worker"] for line in stopped) == [0, 1]  # each worker's lines say which it is
        assert all("worker" in line for line in lines if line["event"] == "relay_started")
        # Both workers committed everything they consumed: a next run of the group re-delivers
        # nothing. (Not a second run itself: Tansu, the test broker, kept a member of two that
        # joined at once in the group after they left, and a new run then never finished joining.)
        offsets = committed_offsets(kafka.bootstrap_servers, topic, group, 4)
        assert sum(o for o in offsets.values() if o > 0) == len(stream), offsets


@contextmanager
def two_workers(kafka, tmp_path, name):
    """A supervisor of two workers on a new 2-partition topic, started (ready); yields it
    and its workers' pids, and kills its whole process group on the way out."""
    topic, dlq, group = kafka.new_topic(name, partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    with RecordingCollector() as collector:
        proc = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r.log",
                            own_group=True)
        try:
            proc.start()
            yield proc, worker_pids(tmp_path / "r.log")
        finally:
            close_group(proc)


def test_a_worker_killed_stops_the_others_and_the_supervisor_fails(kafka, tmp_path):
    with two_workers(kafka, tmp_path, "workers-crash") as (proc, pids):
        os.kill(pids[0], signal.SIGKILL)
        code = proc.proc.wait(STOP_BOUND_S)
        # Before close_group's SIGKILL: the supervisor stopped the other one itself.
        assert eventually(lambda: all(gone(pid) for pid in pids), 10), "a worker outlived its supervisor"
    assert code == 1
    [exited] = [line for line in log_lines(tmp_path / "r.log") if line["event"] == "worker_exited"]
    assert exited["worker"] == 0 and exited["pid"] == pids[0] and exited["signal"] == "SIGKILL"
    stopped = [line for line in log_lines(tmp_path / "r.log") if line["event"] == "relay_stopped"]
    assert [line["worker"] for line in stopped] == [1]  # the other one stopped gracefully


def test_workers_stop_on_their_own_when_the_supervisor_is_killed(kafka, tmp_path):
    with two_workers(kafka, tmp_path, "workers-orphan") as (proc, pids):
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)
        assert eventually(lambda: all(gone(pid) for pid in pids), STOP_BOUND_S), \
            [(pid, process_state(pid)) for pid in pids if not gone(pid)]
    lines = log_lines(tmp_path / "r.log")
    assert sorted(line["worker"] for line in lines if line["event"] == "supervisor_gone") == [0, 1]
    assert sorted(line["worker"] for line in lines if line["event"] == "relay_stopped") == [0, 1]


def test_a_config_read_from_a_pipe_reaches_every_worker_and_its_copy_is_removed(kafka, tmp_path):
    """``--config /dev/stdin`` (or ``<(envsubst < relay.yaml)``) can be read once: every worker
    used to read it again, find it empty, and fail ("kafka: Field required", exit 2) where one
    relay ran. The supervisor's copy (this user's alone) serves them, removed at the stop."""
    topic, dlq, group = kafka.new_topic("workers-pipe", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(40, seed=43)
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        config = {"kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                            "dlq_topic": dlq, "consumer_properties": kafka.consumer_properties()},
                  "collectors": [{"name": "a", "url": collector.url}], "workers": 2}
        proc = RelayProcess(["--config", "/dev/stdin"], log_path=tmp_path / "r.log", own_group=True,
                            stdin=json.dumps(config).encode())   # JSON is YAML
        try:
            proc.start()
            pids = worker_pids(tmp_path / "r.log")
            copies = {environ_of(pid).get("LINEAGE_RELAY_CONFIG_COPY") for pid in pids}
            [copy] = copies
            assert copy is not None and Path(copy).is_file() and Path(copy).stat().st_mode & 0o777 == 0o600
            assert collector.wait_for(lambda c: c.count >= len(unique), 60), f"got {collector.count}"
            assert proc.terminate(timeout_s=STOP_BOUND_S) == 0
            assert not Path(copy).exists(), "the copy of the configuration outlived the supervisor"
        finally:
            close_group(proc)
    assert {canonical(e) for e in collector.events()} == unique


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)
