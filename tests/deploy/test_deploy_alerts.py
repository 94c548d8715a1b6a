"""The Prometheus alerting rules (deploy/prometheus): they query only series and labels the
relay exports, each says how bad it is and what it means, and ``promtool`` (Prometheus' own
rule checker) accepts them and runs their unit tests: each alert fires on the series it is
about, not before its ``for``, and not on healthy series beside it."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.deploy.deployfiles import ALERT_RULES, ALERT_TESTS, ROOT
from tests.deploy.metric_names import label_problems, unknown_metrics
from tests.support.tools import required_tool

SEVERITIES = {"critical", "warning"}


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERT_RULES.read_text())["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def promtool() -> str:
    return required_tool(("promtool",), "promtool", "apt-get install -y prometheus")


def test_rules_query_only_what_the_relay_exports():
    rules = alerts()
    assert len(rules) >= 8
    assert unknown_metrics([rule["expr"] for rule in rules]) == set()
    for rule in rules:
        assert label_problems(rule["expr"]) == [], rule["alert"]


def test_label_problems_are_caught():
    assert label_problems('sum by (job, colector) (rate(lineage_relay_events_forwarded_total[5m]))') == [
        "no metric of the expression has label 'colector'"]
    assert label_problems('lineage_relay_events_held{reason="x"}') == [
        "lineage_relay_events_held has no label 'reason'"]


def test_every_alert_says_how_bad_it_is_and_what_it_means():
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names))
    readme = (ROOT / "deploy" / "README.md").read_text()
    for rule in alerts():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert f"`{rule['alert']}`" in readme, f"{rule['alert']} has no entry in deploy/README.md"


def test_promtool_accepts_the_rules(promtool):
    out = subprocess.run([promtool, "check", "rules", str(ALERT_RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_every_alert_has_a_unit_test_that_fires_it():
    fired = {case["alertname"] for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
             for case in test["alert_rule_test"] if case.get("exp_alerts")}
    quiet = {case["alertname"] for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
             for case in test["alert_rule_test"] if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alerts()}
    assert fired == names
    assert len(quiet) >= len(names) // 2  # and most have a case where they must stay quiet


def test_promtool_unit_tests_pass(promtool):
    out = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], capture_output=True, text=True, timeout=120,
                         cwd=ALERT_TESTS.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_can_fail(promtool, tmp_path):
    # The same tests against rules whose dead-letter alert lost its reason: they must fail.
    broken = ALERT_RULES.read_text().replace(
        "sum by (job, reason) (\n            (lineage_relay_events_dead_lettered_total",
        "sum by (job) (\n            (lineage_relay_events_dead_lettered_total")
    assert broken != ALERT_RULES.read_text()
    (tmp_path / ALERT_RULES.name).write_text(broken)
    (tmp_path / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    out = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode != 0 and "LineageRelayDeadLetters" in out.stdout + out.stderr


def test_counter_alerts_are_tested_on_series_that_appear_already_counted():
    # The relay's labelled counters (dead letters by reason, offset resets by topic, ...)
    # have no series until their first increment, which Prometheus first scrapes at 1 or
    # more: increase() sees no rise there, and an alert on it alone never fired for a
    # reason's first dead letters or an offset reset at start-up. Every alert on increase()
    # has a unit test whose series of that counter begins missing ('_').
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    for rule in alerts():
        counters = set(re.findall(r"increase\((lineage_relay_[A-Za-z0-9_]+_total)\[", rule["expr"]))
        for counter in counters:
            appearing = [test for test in tests for series in test["input_series"]
                         if series["series"].startswith(counter + "{") and series["values"].startswith("_")
                         and any(case["alertname"] == rule["alert"] and case.get("exp_alerts")
                                 for case in test["alert_rule_test"])]
            assert appearing, f"{rule['alert']}: no unit test where {counter} appears already counted"
