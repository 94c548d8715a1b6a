"""``workers``: validated at start-up, ``auto`` resolved from the CPUs this process may use,
decoding inline by default with more than one worker; the supervisor's merged /metrics."""

from __future__ import annotations

import argparse
import os

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.app import Relay
from relay.cli import _add_relay_flags, config_from_args, main
from relay.config import build_config, resolve_workers
from relay.errors import ConfigError
from relay.metrics import RelayMetrics
from relay.worker_metrics import merge_expositions

BASE = {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "collectors": [{"name": "a", "url": "http://127.0.0.1:1"}]}
CPUS = len(os.sched_getaffinity(0))


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
    assert config_from_args(run_args("--config", str(path))).worker_count == 3
    assert config_from_args(run_args("--config", str(path), "--workers", "2")).workers == 2
    auto = config_from_args(run_args("--workers", "auto"))
    assert auto.workers == "auto" and 1 <= auto.worker_count <= CPUS


@pytest.mark.parametrize("cpu_max, expected", [
    ("max 100000\n", CPUS),                # no quota: the affinity
    ("200000 100000\n", min(CPUS, 2)),
    ("150000 100000\n", min(CPUS, 2)),     # 1.5 CPUs: rounded up
    ("50000 100000\n", 1),                 # half a CPU: still one worker
    ("garbage\n", CPUS),
])
def test_auto_is_the_affinity_capped_by_the_cgroup_quota(tmp_path, cpu_max, expected):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert resolve_workers("auto", cpu_max=path) == expected
    assert resolve_workers("auto", cpu_max=tmp_path / "absent") == CPUS
    assert resolve_workers(5, cpu_max=path) == 5


def test_with_several_workers_each_decodes_inline_unless_decode_worker_is_given():
    assert Relay(build_config(BASE)).decoder is not None  # one worker: the decode child, as before
    assert Relay(build_config({**BASE, "workers": 2})).decoder is None
    explicit = build_config({**BASE, "workers": 2, "pipeline": {"decode_worker": True}})
    assert explicit.pipeline.decode_worker and Relay(explicit).decoder is not None


def test_decode_knobs_without_decode_worker_under_several_workers_are_refused():
    with pytest.raises(ConfigError, match=r"pipeline\.decode_processes: .*workers above 1.*fix: set "
                                          r"pipeline\.decode_worker: true"):
        build_config({**BASE, "workers": 2, "pipeline": {"decode_processes": 2}})


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
