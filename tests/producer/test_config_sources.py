"""Which source owns the transport, and what happens to sources that are not needed: as the
official OpenLineage clients read them, with anything not ours logged once and skipped."""

from __future__ import annotations

import json
import logging
import os

import pytest

from producer.config import load_config
from producer.errors import ConfigError
from producer.sources import transport_layer

RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
ROOT_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6b"
OUTER_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6c"
SPARK_KAFKA = {"spark.openlineage.transport.type": "kafka",
               "spark.openlineage.transport.properties.bootstrap.servers": "spark:9092"}
SPARK_PARENT = {"spark.openlineage.parentJobNamespace": "airflow", "spark.openlineage.parentJobName": "dag.task",
                "spark.openlineage.parentRunId": RUN_ID}
SPARK_ROOT = {"spark.openlineage.rootParentJobNamespace": "airflow", "spark.openlineage.rootParentJobName": "dag",
              "spark.openlineage.rootParentRunId": ROOT_ID}
# What openlineage-python's OpenLineageClient writes into os.environ when OPENLINEAGE_URL is set.
URL_ALIASES = {"OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__TYPE": "http",
               "OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__URL": "http://marquez:5000"}


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    """Each test sees the log lines a fresh process would (they are logged once per process)."""
    from producer import parents, readers

    monkeypatch.setattr(readers, "_logged", set())
    monkeypatch.setattr(parents, "_warned", set())


def _load(tmp_path, overrides=None, *, environ=None, spark_conf=None, yml=None):
    if yml is not None:
        (tmp_path / "openlineage.yml").write_text(yml)
    return load_config(overrides, environ=environ or {}, spark_conf=spark_conf, cwd=tmp_path,
                       home=tmp_path / "home")


def _lines(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event}" in r.getMessage()]


# --- other transports' settings in the environment (findings 1, 2) -----------------------

@pytest.mark.parametrize("env", [
    {"OPENLINEAGE__TRANSPORT__AUTH__TYPE": "api_key", "OPENLINEAGE__TRANSPORT__AUTH__API_KEY": "s3cret"},
    URL_ALIASES,
    {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", **URL_ALIASES},
])
def test_other_transports_env_settings_do_not_stop_our_transport(tmp_path, caplog, env):
    caplog.set_level(logging.INFO, "producer.config")
    cfg = _load(tmp_path, environ=env, spark_conf=SPARK_KAFKA)
    assert cfg.bootstrap_servers == "spark:9092"
    [line] = _lines(caplog, "transport_setting_ignored")
    assert all(var in line for var in env if "__TRANSPORT__TYPE" not in var)
    assert "s3cret" not in caplog.text


def test_a_typo_in_a_section_of_ours_still_fails(tmp_path):
    with pytest.raises(ConfigError, match="spark.openlineage.transport.topicNmae: unknown transport key"):
        _load(tmp_path, spark_conf={**SPARK_KAFKA, "spark.openlineage.transport.topicNmae": "t"})


# --- whose transport it is: decided on the merged config (finding 8) ---------------------

def test_openlineage_yml_of_another_type_wins_over_env_kafka(tmp_path):
    """openlineage-python merges openlineage.yml over the environment: type http wins, and
    the setup is an HTTP one, so none of the kafka variables are read."""
    yml = "transport:\n  type: http\n  url: http://marquez:5000\n"
    env = {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": "t",
           "OPENLINEAGE__TRANSPORT__CONFIG": '{"bootstrap.servers": "env:9092"}'}
    with pytest.raises(ConfigError, match=r"bootstrap_servers: required.*transport\.type=http, is not a kafka"):
        _load(tmp_path, environ=env, yml=yml)
    # Spark conf wins over openlineage.yml: its kafka transport is ours, the http one is dropped whole.
    cfg = _load(tmp_path, environ=env, yml=yml, spark_conf=SPARK_KAFKA)
    assert (cfg.bootstrap_servers, cfg.topic) == ("spark:9092", "openlineage")


# --- OPENLINEAGE__TRANSPORT as one JSON object (finding 4) -------------------------------

def test_the_whole_transport_section_as_json(tmp_path):
    section = {"type": "kafka", "topic": "t1", "config": {"bootstrap.servers": "k:9092", "linger.ms": 3}}
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": json.dumps(section)})
    assert (cfg.topic, cfg.bootstrap_servers, cfg.properties) == ("t1", "k:9092", {"linger.ms": "3"})
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": json.dumps(section),
                                   "OPENLINEAGE__TRANSPORT__TOPIC": "nested",
                                   "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "k"})
    assert (cfg.topic, cfg.message_key) == ("t1", "k")   # the JSON section wins on conflicts


# --- parent and root from one source (findings 3, 7) -------------------------------------

def test_parent_and_root_come_from_one_source(tmp_path):
    inherited = {"OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"}
    cfg = _load(tmp_path, environ=inherited, spark_conf={**SPARK_KAFKA, **SPARK_PARENT, **SPARK_ROOT})
    assert cfg.parent == ("airflow", "dag.task", RUN_ID) and cfg.root_parent == ("airflow", "dag", ROOT_ID)
    # Spark's parent alone: no root borrowed from the environment.
    env = {**inherited, "OPENLINEAGE_ROOT_PARENT_ID": f"other/outer/{ROOT_ID}"}
    cfg = _load(tmp_path, environ=env, spark_conf={**SPARK_KAFKA, **SPARK_PARENT})
    assert cfg.parent == ("airflow", "dag.task", RUN_ID) and cfg.root_parent is None
    # A root without its parent is no parent at all.
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ={"OPENLINEAGE_ROOT_PARENT_ID": f"a/dag/{ROOT_ID}"})
    assert cfg.parent is None and cfg.root_parent is None


@pytest.mark.parametrize("spark_parent, logged", [
    ({"spark.openlineage.parentRunId": RUN_ID}, "parentJobNamespace,spark.openlineage.parentJobName missing"),
    ({**SPARK_PARENT, "spark.openlineage.parentRunId": "{{ run_id }}"},
     "spark.openlineage.parentRunId reason=not a UUID"),
])
def test_an_unusable_spark_parent_is_skipped_and_logged(tmp_path, caplog, spark_parent, logged):
    caplog.set_level(logging.WARNING, "producer.config")
    cfg = _load(tmp_path, spark_conf={**SPARK_KAFKA, **spark_parent, **SPARK_ROOT})
    assert cfg.parent is None and cfg.root_parent is None
    [line] = [line for line in _lines(caplog, "parent_ignored") if "rootParent" not in line]
    assert logged in line and "fix=" in line
    # The orchestrator's variable is the next source.
    cfg = _load(tmp_path, environ={"OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"},
                spark_conf={**SPARK_KAFKA, **spark_parent})
    assert cfg.parent == ("other", "outer.task", OUTER_ID)


# --- openlineage.yml that cannot be read (finding 6) -------------------------------------

def test_a_malformed_openlineage_yml_is_logged_and_read_as_empty(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    yml = "transport:\n  type: http\n  url: http://x\n   endpoint: api/v1/lineage\n"
    cfg = _load(tmp_path, spark_conf=SPARK_KAFKA, yml=yml)
    assert cfg.bootstrap_servers == "spark:9092"
    [line] = _lines(caplog, "openlineage_yml_ignored")
    assert str(tmp_path / "openlineage.yml") in line and "fix=" in line


def test_an_unreadable_openlineage_yml_gives_way_to_the_next(tmp_path, monkeypatch):
    (tmp_path / "home" / ".openlineage").mkdir(parents=True)
    (tmp_path / "home" / ".openlineage" / "openlineage.yml").write_text(
        "transport:\n  type: kafka\n  topic: home\n  config: {bootstrap.servers: 'h:1'}\n")
    unreadable = tmp_path / "openlineage.yml"
    unreadable.write_text("transport:\n  type: kafka\n  topic: cwd\n  config: {bootstrap.servers: 'c:1'}\n")
    unreadable.chmod(0)
    if os.geteuid() == 0:   # root reads any file: make os.access answer as for anyone else
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(unreadable)
                            else real(p, mode, **kw))
    try:
        assert _load(tmp_path).topic == "home"
    finally:
        unreadable.chmod(0o644)


# --- librdkafka names written with "_" (finding 9) ---------------------------------------

def test_property_names_may_be_written_with_underscores():
    layer = transport_layer({"type": "kafka", "properties": {
        "bootstrap_servers": "k:1", "linger_ms": 5, "linger.ms": 7, "error_cb": "x"}}, "transport")
    assert layer.values["bootstrap_servers"] == "k:1"
    assert layer.values["properties"] == {"linger.ms": 7, "error_cb": "x"}   # dotted wins; callbacks untouched


def test_our_type_spelled_two_ways_is_one_transport(tmp_path):
    yml = ("transport:\n  type: producer.openlineage_transport.LineageRelayTransport\n"
           "  properties: {bootstrap.servers: 'y:1'}\n")
    env = {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_USERNAME": "u",
           "OPENLINEAGE__TRANSPORT__TOPIC": "env-topic"}
    cfg = _load(tmp_path, environ=env, yml=yml)
    assert (cfg.bootstrap_servers, cfg.topic, cfg.properties) == ("y:1", "env-topic", {"sasl.username": "u"})
