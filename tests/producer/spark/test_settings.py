"""Every ``spark.openlineage.*`` setting also read from openlineage.yml and ``OPENLINEAGE__*``
(named as the Java env parser names them), Spark conf over openlineage.yml over the
variables, as the official integration's ArgumentParser merges them; tags and owners merged
by key and type as its JobConfig/RunConfig; a bad value refused naming its source and key,
before anything is registered."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from producer.errors import ConfigError
from producer.spark import disable_lineage, enable_lineage
from tests.producer.spark.support import Recorder, application_start, drain
from tests.producer.spark.test_enable import FakeSession

YAML = """\
overriddenAppName: Orders ETL
capturedProperties: [spark.master, custom.prop]
job:
  tags: ["env:prod", "pii", "cost:42:BILLING"]
  owners: {team: data}
run:
  tags: "set:up:SERVICE;attempt:1"
columnLineage: {enabled: false, datasetLineageEnabled: false}
jobName: {appendDatasetName: false, replaceDotWithUnderscore: true}
python: {readOnlyActions: true, maxPlanBytes: 1024}
"""
ENV = {
    "OPENLINEAGE__OVERRIDDEN_APP_NAME": "Orders ETL",
    "OPENLINEAGE__CAPTURED_PROPERTIES": "spark.master,custom.prop",
    "OPENLINEAGE__JOB__TAGS": "env:prod;pii;cost:42:BILLING",
    "OPENLINEAGE__JOB__OWNERS__TEAM": "data",
    "OPENLINEAGE__RUN__TAGS": '["set:up:SERVICE", "attempt:1"]',
    "OPENLINEAGE__COLUMN_LINEAGE__ENABLED": "false",
    "OPENLINEAGE__COLUMN_LINEAGE__DATASET_LINEAGE_ENABLED": "false",
    "OPENLINEAGE__JOB_NAME__APPEND_DATASET_NAME": "false",
    "OPENLINEAGE__JOB_NAME__REPLACE_DOT_WITH_UNDERSCORE": "true",
    "OPENLINEAGE__PYTHON__READ_ONLY_ACTIONS": "true",
    "OPENLINEAGE__PYTHON__MAX_PLAN_BYTES": "1024",
}
CONF = {"spark.app.name": "app", "spark.master": "local[1]", "custom.prop": "x"}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No openlineage.yml or OPENLINEAGE__ variable but the test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(var)
    return tmp_path


def _yaml(monkeypatch, tmp_path, text):
    path = tmp_path / "conf" / "openlineage.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(path))
    return path


def _source(name, monkeypatch, tmp_path):
    if name == "yml":
        _yaml(monkeypatch, tmp_path, YAML)
    else:
        for var, value in ENV.items():
            monkeypatch.setenv(var, value)


def _start(conf):
    """The capture and the application's START event, as sent."""
    return application_start(FakeSession(conf))


def _tags(facet):
    return [(t["key"], t["value"], t["source"]) for t in facet["tags"]]


@pytest.mark.parametrize("source", ["yml", "env"])
def test_every_setting_takes_effect_from_openlineage_yml_and_env(clean_env, monkeypatch, source):
    _source(source, monkeypatch, clean_env)
    lineage, start = _start(CONF)
    assert start["job"]["name"] == "orders_etl"
    assert _tags(start["job"]["facets"]["tags"]) == [("env", "prod", "CONFIG"), ("pii", "true", "CONFIG"),
                                                    ("cost", "42", "BILLING")]
    assert start["job"]["facets"]["ownership"]["owners"] == [{"name": "data", "type": "team"}]
    assert _tags(start["run"]["facets"]["tags"]) == [("set", "up", "SERVICE"), ("attempt", "1", "CONFIG")]
    assert start["run"]["facets"]["spark_properties"]["properties"] == {"spark.master": "local[1]", "custom.prop": "x"}
    s = lineage.settings
    assert (s.column_lineage, s.dataset_lineage, s.append_dataset_name, s.replace_dot_with_underscore) == (
        False, False, False, True)
    assert (lineage.read_only_actions, lineage.max_plan_bytes) == (True, 1024)


def test_spark_conf_over_openlineage_yml_over_env(clean_env, monkeypatch):
    monkeypatch.setenv("OPENLINEAGE__OVERRIDDEN_APP_NAME", "from env")
    monkeypatch.setenv("OPENLINEAGE__PYTHON__MAX_PLAN_BYTES", "1")
    monkeypatch.setenv("OPENLINEAGE__COLUMN_LINEAGE__DATASET_LINEAGE_ENABLED", "false")
    monkeypatch.setenv("OPENLINEAGE__JOB__TAGS", "env:dev;from_env")
    monkeypatch.setenv("OPENLINEAGE__JOB__OWNERS__TEAM", "env-team")
    monkeypatch.setenv("OPENLINEAGE__JOB__OWNERS__PERSON", "Env Person")
    _yaml(monkeypatch, clean_env, "overriddenAppName: from yml\npython: {maxPlanBytes: 2}\n"
                                  "columnLineage: {datasetLineageEnabled: true}\n"
                                  "job:\n  tags: [env:staging, from_yml]\n  owners: {team: yml-team}\n")
    lineage, start = _start(CONF)
    assert start["job"]["name"] == "from_yml" and lineage.max_plan_bytes == 2
    assert lineage.settings.dataset_lineage is True
    # Tags merged by key and owners by type, the higher source winning (the official JobConfig merge).
    assert _tags(start["job"]["facets"]["tags"]) == [("env", "staging", "CONFIG"), ("from_env", "true", "CONFIG"),
                                                    ("from_yml", "true", "CONFIG")]
    assert start["job"]["facets"]["ownership"]["owners"] == [{"name": "Env Person", "type": "person"},
                                                             {"name": "yml-team", "type": "team"}]
    lineage, start = _start({**CONF, "spark.openlineage.appName": "from spark",
                             "spark.openlineage.python.maxPlanBytes": "3",
                             "spark.openlineage.columnLineage.datasetLineageEnabled": "false",
                             "spark.openlineage.job.tags": "env:prod", "spark.openlineage.job.owners.team": "spark"})
    assert start["job"]["name"] == "from_spark" and lineage.max_plan_bytes == 3
    assert lineage.settings.dataset_lineage is False
    assert ("env", "prod", "CONFIG") in _tags(start["job"]["facets"]["tags"])
    assert {"name": "spark", "type": "team"} in start["job"]["facets"]["ownership"]["owners"]


def test_the_keyword_arguments_still_win(clean_env, monkeypatch):
    _source("yml", monkeypatch, clean_env)
    spark, sender = FakeSession(CONF), Recorder()
    lineage = enable_lineage(spark, producer=sender, app_name="kw", column_lineage=True, read_only_actions=False,
                             captured_properties=["spark.app.name"])
    try:
        assert sender.events[0]["job"]["name"] == "kw"
        assert (lineage.settings.column_lineage, lineage.read_only_actions) == (True, False)
        assert lineage.settings.captured_properties == {"spark.app.name": "app"}
    finally:
        disable_lineage(spark)


def test_the_newer_ownership_key_replaces_owners_within_a_source(clean_env, monkeypatch):
    _yaml(monkeypatch, clean_env, "job:\n  owners: {team: old}\n  ownership: {team: new, person: Ann}\n")
    _lineage, start = _start(CONF)
    assert start["job"]["facets"]["ownership"]["owners"] == [{"name": "Ann", "type": "person"},
                                                             {"name": "new", "type": "team"}]


@pytest.mark.parametrize(("where", "value", "message"), [
    ("yml", "columnLineage:\n  datasetLineageEnabled: maybe\n",
     "{yml}: columnLineage.datasetLineageEnabled: expected true or false, got 'maybe' fix: set it to true or false"),
    ("yml", "python:\n  maxPlanBytes: 10MB\n",
     "{yml}: python.maxPlanBytes: expected a number of bytes, got '10MB' fix: a whole number"),
    ("yml", "job:\n  tags:\n    - {key: env, value: prod}\n",
     "{yml}: job.tags[0]: expected a tag as 'key:value:source' text, got a mapping "
     "(the official integration reads no other form) fix: write it as \"env:prod\""),
    ("yml", "jobName: false\n", "{yml}: jobName: expected a mapping holding appendDatasetName"),
    ("yml", "job:\n  owners: data\n", "{yml}: job.owners: expected owners by type"),
    ("env", {"OPENLINEAGE__PYTHON__READ_ONLY_ACTIONS": "yes"},
     "env OPENLINEAGE__PYTHON__READ_ONLY_ACTIONS: expected true or false, got 'yes' fix:"),
    ("env", {"OPENLINEAGE__COLUMN_LINEAGE": '{"enabled": "off"}'},
     "env OPENLINEAGE__COLUMN_LINEAGE: enabled: expected true or false, got 'off' fix:"),
    ("env", {"OPENLINEAGE__CAPTURED_PROPERTIES": '{"a": 1}'},
     "env OPENLINEAGE__CAPTURED_PROPERTIES: expected a comma-separated list of names"),
    ("spark", {"spark.openlineage.jobName.appendDatasetName": "no"},
     "spark.openlineage.jobName.appendDatasetName: expected true or false, got 'no' fix:"),
])
def test_a_bad_value_fails_at_start_naming_its_source_key_and_fix(clean_env, monkeypatch, where, value, message):
    conf = dict(CONF)
    yml = None
    if where == "yml":
        yml = _yaml(monkeypatch, clean_env, value)
    elif where == "env":
        for var, raw in value.items():
            monkeypatch.setenv(var, raw)
    else:
        conf.update(value)
    spark = FakeSession(conf)
    with pytest.raises(ConfigError) as info:
        enable_lineage(spark, producer=Recorder())
    assert str(info.value).startswith(message.format(yml=yml))
    assert spark.calls == [], "nothing registered: the job goes on without capture only if it catches this"


def test_a_higher_source_hides_a_bad_value_below(clean_env, monkeypatch):
    """As in one merged config: a value a higher source overrides is never used, so never refused."""
    monkeypatch.setenv("OPENLINEAGE__PYTHON__READ_ONLY_ACTIONS", "yes")
    _yaml(monkeypatch, clean_env, "python: {readOnlyActions: false}\n")
    lineage, _start_event = _start(CONF)
    assert lineage.read_only_actions is False


@pytest.mark.spark
@pytest.mark.parametrize("source", ["yml", "env"])
def test_action_settings_from_openlineage_yml_and_env_shape_the_action_events(
        spark, clean_env, monkeypatch, source):
    """jobName.appendDatasetName, columnLineage.datasetLineageEnabled and python.readOnlyActions
    from the other sources, seen in what a real PySpark job's actions send."""
    settings = {"jobName.appendDatasetName": "false", "columnLineage.datasetLineageEnabled": "false",
                "python.readOnlyActions": "true"}
    if source == "yml":
        _yaml(monkeypatch, clean_env, "jobName: {appendDatasetName: false}\n"
                                      "columnLineage: {datasetLineageEnabled: false}\n"
                                      "python: {readOnlyActions: true}\n")
    else:
        for key, value in settings.items():
            var = "OPENLINEAGE__" + "__".join(
                "".join(f"_{c}" if c.isupper() else c.upper() for c in part) for part in key.split("."))
            monkeypatch.setenv(var, value)
    orders, customers = str(clean_env / "orders"), str(clean_env / "customers")
    spark.range(6).selectExpr("id", "id % 3 AS cust", "id * 10 AS amount").write.parquet(orders)
    spark.range(3).selectExpr("id AS cust", "concat('c', id) AS name").write.parquet(customers)
    real = spark.sparkContext.getConf().getAll()
    monkeypatch.setattr(spark.sparkContext, "getConf", lambda: SimpleNamespace(getAll=lambda: real))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name="other_sources")
    try:
        o, c = spark.read.parquet(orders), spark.read.parquet(customers)
        o.join(c, "cust").where("amount > 0").select("id", "name").write.parquet(str(clean_env / "out"))
        spark.read.parquet(orders).count()
        drain(spark)
    finally:
        disable_lineage(spark)
    actions = [e for e in recorder.events if e["job"]["name"] != "other_sources"]
    [write] = [e for e in actions if e["eventType"] == "COMPLETE" and e.get("outputs")]
    # No output suffix in the job name (appendDatasetName false).
    assert write["job"]["name"].count(".") == 1, write["job"]["name"]
    facet = write["outputs"][0]["facets"]["columnLineage"]
    assert not facet.get("dataset")   # datasetLineageEnabled false: in the fields instead
    assert all(any(t["subtype"] == "JOIN" for e in f["inputFields"] for t in e["transformations"])
               for f in facet["fields"].values())
    # The count (no output) is reported too (readOnlyActions true).
    assert any(e["eventType"] == "COMPLETE" and not e.get("outputs") for e in actions)


@pytest.mark.parametrize("conf_flag", [
    {"spark.openlineage.facets.spark_properties.disabled": "FALSE"},    # not exactly "false"
    {"spark.openlineage.facets.spark_properties.disabled": "no"},
    {"spark.openlineage.facets.sparkProperties.disabled": "false"},     # another facet's name
])
def test_a_facet_a_lower_source_left_out_stays_out_but_for_an_exact_false(clean_env, monkeypatch, caplog, conf_flag):
    """As the official FacetsConfig: a flag is exactly true or false (anything else is logged and
    ignored), keyed by the name as written."""
    from producer.spark import facets_config
    from producer.spark.settings import SparkSettings

    monkeypatch.setattr(facets_config, "_logged", set())
    caplog.set_level(logging.WARNING, "producer.spark")
    _yaml(monkeypatch, clean_env, "facets:\n  spark_properties:\n    disabled: true\n")
    assert "spark_properties" in SparkSettings.read(conf_flag).disabled_facets()
    lineage, start = _start({**CONF, **conf_flag})
    assert "spark_properties" not in start["run"]["facets"]
    SparkSettings.read(conf_flag).disabled_facets()
    logged = [r.getMessage() for r in caplog.records if "event=setting_ignored" in r.getMessage()]
    assert len(logged) == (0 if "sparkProperties" in str(conf_flag) else 1)   # once
    # An exact false, or a YAML boolean, turns it back on.
    assert "spark_properties" not in SparkSettings.read(
        {"spark.openlineage.facets.spark_properties.disabled": "false"}).disabled_facets()
    _yaml(monkeypatch, clean_env, "facets:\n  disabled: [spark_properties]\n  spark_properties: {disabled: False}\n")
    assert "spark_properties" not in SparkSettings.read({}).disabled_facets()
