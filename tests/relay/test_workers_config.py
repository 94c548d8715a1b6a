"""``workers``: validated at start-up, ``auto`` resolved from the CPUs this process may use,
decoding inline by default with more than one worker; the supervisor's merged /metrics."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import relay.cli
import relay.config
from relay.app import Relay
from relay.cli import _add_relay_flags, config_from_args, main
from relay.config import build_config, resolve_workers
from relay.errors import ConfigError
from relay.metrics import RelayMetrics
from relay.source.consumer_config import consumer_config
from relay.stages.decode_worker import package_env
from relay.worker_link import WorkerLink
from relay.worker_metrics import merge_expositions

BASE = {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "collectors": [{"name": "a", "url": "http://127.0.0.1:1"}]}


def run_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _add_relay_flags(parser)
    return parser.parse_args(["--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1", *extra])


@pytest.mark.parametrize("value", [0, 65, "many", 1.5, True])
def test_a_bad_workers_value_is_refused_naming_the_key_and_the_fix(value):
    with pytest.raises(ConfigError) as err:
        build_config({**BASE, "workers": value})
    assert "workers: must be a whole number from 1 to 64, or auto" in str(err.value)
    assert "fix:" in str(err.value)


@pytest.mark.parametrize("flag", ["0", "many"])
def test_run_refuses_a_bad_workers_flag_at_start_up(flag, capsys):
    code = main(["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1",
                 "--workers", flag])
    assert code == 2
    assert "workers: must be a whole number from 1 to 64" in capsys.readouterr().err


def test_workers_flag_overrides_the_file_and_auto_resolves(tmp_path):
    path = tmp_path / "relay.yaml"
    path.write_text("kafka: {bootstrap_servers: '127.0.0.1:1'}\ncollectors: [{name: a, url: 'http://127.0.0.1:1'}]\n"
                    "workers: 3\n")
    assert config_from_args(run_args("--config", str(path))).workers == 3
    assert config_from_args(run_args("--config", str(path), "--workers", "2")).workers == 2
    auto = config_from_args(run_args("--workers", "auto"))
    assert auto.workers == "auto"  # resolved at start-up: see the tests with eight_cpus below


@pytest.fixture
def eight_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))


@pytest.fixture
def no_cgroup_quota(monkeypatch):
    """The host's own quota out of it (resolve_workers reads /sys/fs/cgroup by default)."""
    monkeypatch.setattr(relay.config, "_cgroup_quota", lambda *_args: None)


@pytest.mark.parametrize("cpu_max, expected", [
    ("max 100000\n", (8, "affinity")),          # no quota: the affinity
    ("200000 100000\n", (2, "cgroup v2")),
    ("150000 100000\n", (2, "cgroup v2")),      # 1.5 CPUs: rounded up
    ("50000 100000\n", (1, "cgroup v2")),       # half a CPU: still one worker
    ("1600000 100000\n", (8, "affinity")),      # a quota above the affinity: the affinity
    ("garbage\n", (8, "affinity")),
])
def test_auto_is_the_affinity_capped_by_the_cgroup_v2_quota(tmp_path, eight_cpus, cpu_max, expected):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert resolve_workers("auto", cpu_max=path, cgroup_v1=()) == expected
    assert resolve_workers("auto", cpu_max=tmp_path / "absent", cgroup_v1=()) == (8, "affinity")
    assert resolve_workers(5, cpu_max=path, cgroup_v1=()) == (5, "config")


@pytest.mark.parametrize("quota_us, expected", [
    ("-1\n", (8, "affinity")),                  # -1: no limit
    ("300000\n", (3, "cgroup v1")),
    ("250000\n", (3, "cgroup v1")),             # 2.5 CPUs: rounded up
])
@pytest.mark.parametrize("directory", ["cpu", "cpu,cpuacct"])
def test_auto_without_cgroup_v2_reads_the_cgroup_v1_cfs_quota(tmp_path, eight_cpus, quota_us, expected, directory):
    v1 = tmp_path / directory
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text(quota_us)
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    dirs = (tmp_path / "cpu", tmp_path / "cpu,cpuacct")
    assert resolve_workers("auto", cpu_max=tmp_path / "absent", cgroup_v1=dirs) == expected


def test_the_supervisor_logs_how_many_workers_and_where_that_came_from(monkeypatch, eight_cpus, no_cgroup_quota,
                                                                     capsys):
    import relay.workers

    counts: list[int] = []

    async def supervise(config, argv, count):
        counts.append(count)
        return 0

    monkeypatch.setattr(relay.workers, "supervise", supervise)
    assert main(["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1",
                 "--workers", "auto"]) == 0
    [line] = [orjson.loads(x) for x in capsys.readouterr().err.splitlines() if "workers_resolved" in x]
    assert (line["setting"], line["workers"], line["source"]) == ("auto", 8, "affinity")
    assert counts == [8]


def test_auto_resolved_to_one_is_logged_too_and_runs_one_relay(monkeypatch, no_cgroup_quota, capsys):
    import relay.workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    served: list = []

    async def serve(config, worker=None):
        served.append((config, worker))

    async def supervise(config, argv, count):
        raise AssertionError("one worker needs no supervisor")

    monkeypatch.setattr(relay.cli, "serve", serve)
    monkeypatch.setattr(relay.workers, "supervise", supervise)
    assert main(["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1",
                 "--workers", "auto"]) == 0
    [line] = [orjson.loads(x) for x in capsys.readouterr().err.splitlines() if "workers_resolved" in x]
    assert (line["setting"], line["workers"], line["source"]) == ("auto", 1, "affinity")
    [(config, worker)] = served
    assert worker is None and not config.pipeline.decode_worker  # what the line explains


def test_serve_as_a_worker_runs_the_relay_with_its_own_group_instance_id(monkeypatch):
    import relay.app
    import relay.process
    import relay.server

    got: list = []

    class FakeRelay:
        def __init__(self, config):
            got.append(config)

        def request_stop(self):
            pass

        async def run(self):
            return None

    class FakeRunner:
        async def cleanup(self):
            pass

    async def listen(_app, _host, _port):
        return FakeRunner(), 4321

    monkeypatch.setattr(relay.app, "Relay", FakeRelay)
    monkeypatch.setattr(relay.process, "tune_process", lambda: None)
    monkeypatch.setattr(relay.server, "build_app", lambda _relay: None)
    monkeypatch.setattr(relay.server, "listen", listen)
    config = build_config({**BASE, "kafka": {**BASE["kafka"], "consumer_properties": {"group.instance.id": "pod-a"}}})
    report_r, report_w = os.pipe()
    lifeline_r, lifeline_w = os.pipe()
    try:
        asyncio.run(relay.cli.serve(config, WorkerLink(3, report_w, lifeline_r)))
        assert os.read(report_r, 64) == b"4321\n"  # the port reported to the supervisor
    finally:
        for fd in (report_r, lifeline_r, lifeline_w):
            os.close(fd)
    [relayed] = got
    assert relayed.kafka.consumer_properties["group.instance.id"] == "pod-a-3"


def test_with_several_workers_each_decodes_inline_unless_decode_worker_is_given():
    assert Relay(build_config(BASE)).decoder is not None  # one worker: the decode child, as before
    assert Relay(build_config({**BASE, "workers": 2})).decoder is None
    explicit = build_config({**BASE, "workers": 2, "pipeline": {"decode_worker": True}})
    assert explicit.pipeline.decode_worker and Relay(explicit).decoder is not None


def test_decode_knobs_without_decode_worker_under_several_workers_are_refused():
    with pytest.raises(ConfigError, match=r"pipeline\.decode_processes: .*workers above 1.*fix: set "
                                          r"pipeline\.decode_worker: true"):
        build_config({**BASE, "workers": 2, "pipeline": {"decode_processes": 2}})


def test_auto_counts_as_several_workers_in_validation_whatever_the_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    with pytest.raises(ConfigError, match=r"pipeline\.decode_processes: .*workers above 1 or auto.*fix: set "
                                          r"pipeline\.decode_worker: true"):
        build_config({**BASE, "workers": "auto", "pipeline": {"decode_processes": 2}})
    assert not build_config({**BASE, "workers": "auto"}).pipeline.decode_worker


def test_each_worker_has_its_own_group_instance_id():
    config = build_config({**BASE, "kafka": {**BASE["kafka"], "consumer_properties": {"group.instance.id": "x"}}})

    def instance_id(cfg) -> str:
        k = cfg.kafka
        return consumer_config(k.bootstrap_servers, k.group_id, k.consumer_properties)["group.instance.id"]

    assert instance_id(WorkerLink(1, -1, -1).relay_config(config)) == "x-1"
    assert instance_id(WorkerLink(0, -1, -1).relay_config(config)) == "x-0"
    assert instance_id(config) == "x"  # a single relay: as configured
    assert WorkerLink(1, -1, -1).relay_config(build_config(BASE)) == build_config(BASE)  # none: none


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_group_instance_id_is_not_suffixed(blank):
    # A suffix would make it "-1": static membership turned on where the configuration has it off.
    config = build_config({**BASE, "kafka": {**BASE["kafka"], "consumer_properties": {"group.instance.id": blank}}})
    assert WorkerLink(1, -1, -1).relay_config(config) == config


def test_check_config_and_version_do_not_load_the_supervisor(tmp_path):
    path = tmp_path / "relay.yaml"
    path.write_text("kafka: {bootstrap_servers: '127.0.0.1:1'}\ncollectors: [{name: a, url: 'http://127.0.0.1:1'}]\n")
    code = ("import sys\nfrom relay.cli import main\nassert main(['check-config', sys.argv[1]]) == 0\n"
            "assert 'relay.workers' not in sys.modules, 'the supervisor loaded'\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                          env=package_env())
    assert done.returncode == 0, done.stderr


def exposition(consumed: int, forwarded_s: list[float]) -> str:
    metrics = RelayMetrics()
    metrics.consumed.inc(consumed)
    collector = metrics.for_collector('mar"quez\\')  # a label value that needs escaping
    for latency in forwarded_s:
        collector.delivered.record(latency)
    metrics.dead_lettered.labels(reason="invalid_json").inc()
    return generate_latest(metrics.registry).decode()


def test_merged_metrics_label_every_sample_with_its_worker():
    texts = {0: exposition(5, [0.01, 0.2]), 1: exposition(7, [3.0])}
    merged = merge_expositions(texts, configured=3, alive=2, unscraped=1).decode()
    # One HELP and one TYPE per family, each sample of each worker under it.
    for name in ("lineage_relay_events_consumed_total", "lineage_relay_delivery_latency_seconds"):
        assert merged.count(f"# TYPE {name} ") == 1 and merged.count(f"# HELP {name} ") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    consumed = families["lineage_relay_events_consumed"]
    assert consumed.type == "counter"
    assert {s.labels["worker"]: s.value for s in consumed.samples if s.name.endswith("_total")} == {"0": 5, "1": 7}
    assert {s.labels["worker"] for s in families["lineage_relay_events_consumed_created"].samples} == {"0", "1"}
    latency = families["lineage_relay_delivery_latency_seconds"]
    assert latency.type == "histogram"
    by = {(s.name.rsplit("_", 1)[1], s.labels["worker"], s.labels.get("le")): s.value for s in latency.samples}
    assert by[("count", "0", None)] == 2 and by[("count", "1", None)] == 1
    assert by[("bucket", "0", "0.25")] == 2 and by[("bucket", "1", "0.25")] == 0 and by[("bucket", "1", "+Inf")] == 1
    assert by[("sum", "1", None)] == 3.0
    forwarded = families["lineage_relay_events_forwarded"]
    assert {s.labels["collector"] for s in forwarded.samples} == {'mar"quez\\'}  # escaped, read back intact
    own = {name: families[name].samples[0].value for name in
           ("lineage_relay_workers", "lineage_relay_workers_alive", "lineage_relay_workers_unscraped")}
    assert own == {"lineage_relay_workers": 3, "lineage_relay_workers_alive": 2, "lineage_relay_workers_unscraped": 1}


def test_a_worker_left_out_of_a_scrape_only_counts_as_unscraped():
    merged = merge_expositions({1: exposition(2, [])}, configured=2, alive=2, unscraped=1).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert {s.labels["worker"] for s in families["lineage_relay_events_consumed"].samples} == {"1"}
    assert families["lineage_relay_workers_unscraped"].samples[0].value == 1
