"""The Grafana dashboard is valid JSON, queries only metrics the relay exports (names and
label names read from a real ``RelayMetrics`` registry), and shows every one of them."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.deployfiles import DASHBOARD, ROOT
from tests.deploy.metric_names import EXPORTED, METRIC, label_problems, unknown_metrics


def _panels(node: dict) -> list[dict]:
    found = []
    for panel in node.get("panels", []):
        found.append(panel)
        found.extend(_panels(panel))
    return found


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", []) if t.get("expr")]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        if var.get("type") == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_registry_has_the_metrics_the_readme_lists():
    assert {"lineage_relay_events_consumed_total", "lineage_relay_delivery_latency_seconds_bucket",
            "lineage_relay_consumer_lag", "lineage_relay_consumption_paused"} <= set(EXPORTED)


def test_dashboard_is_importable(dashboard):
    assert dashboard["title"] and dashboard["uid"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in names, "the importer picks the Prometheus data source"
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]


def test_every_queried_metric_exists(dashboard):
    assert unknown_metrics(_queries(dashboard)) == set()


def test_unknown_metric_is_caught():
    assert unknown_metrics(['sum(rate(lineage_relay_events_forwarded{collector="m"}[5m]))']) == {
        "lineage_relay_events_forwarded"}


def test_selector_and_grouping_labels_exist_on_the_metrics(dashboard):
    for expr in _queries(dashboard):
        assert label_problems(expr) == [], expr


def documented_metrics() -> set[str]:
    """The series README.md's "Metrics" section lists (``..._x`` = ``lineage_relay_x``;
    a histogram is queried through its ``_bucket`` series)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Metrics", 1)[1].split("\n#", 1)[0]
    names = set()
    for item in re.findall(r"`([^`]+)`", section):
        name = re.sub(r"^\.\.\._", "lineage_relay_", item.split("{", 1)[0])
        if name.startswith("lineage_relay_"):
            names.add(name if name in EXPORTED or name + "_bucket" not in EXPORTED else name + "_bucket")
    return names


def test_every_documented_metric_is_exported_and_has_a_panel(dashboard):
    documented = documented_metrics()
    assert len(documented) >= 12
    assert documented - set(EXPORTED) == set(), "README.md lists metrics the relay does not export"
    queried = {name for expr in _queries(dashboard) for name in METRIC.findall(expr)}
    assert documented - queried == set(), "add a panel to deploy/grafana/lineage-relay-dashboard.json"


def test_rates_are_taken_of_counters_only(dashboard):
    for expr in _queries(dashboard):
        for name in re.findall(r"\b(?:rate|increase)\(\s*(lineage_relay_[A-Za-z0-9_]+)", expr):
            assert name.endswith(("_total", "_bucket", "_sum", "_count")), f"{expr}: rate() of gauge {name}"


def test_stats_over_a_window_count_counter_series_new_in_it(dashboard):
    # A labelled counter's series appears at its first increment, already at 1 or more:
    # increase() sees no rise in it, and "Dead-lettered (1h)" showed 0 after a reason's
    # first dead letters. A stat's increase() over a window also counts, whole, the series
    # that were not there a window ago.
    for panel in _panels(dashboard):
        if panel.get("type") != "stat":
            continue
        for target in panel["targets"]:
            expr = target["expr"]
            for name, window in re.findall(r"increase\((lineage_relay_[A-Za-z0-9_]+)(?:\{[^}]*\})?\[(\w+)\]\)", expr):
                assert re.search(rf"{name}(\{{[^}}]*\}})? unless {name}(\{{[^}}]*\}})? offset {window}\b", expr), \
                    f"{panel['title']}: {expr}"
