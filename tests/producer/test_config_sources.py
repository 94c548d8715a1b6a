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


@pytest.mark.parametrize("source, key", [
    ({"yml": "transport:\n  topc: lineage-prod\n  properties: {bootstrap.servers: 'k:9092'}\n"}, "transport.topc"),
    ({"spark_conf": {"spark.openlineage.transport.topc": "lineage-prod",
                     "spark.openlineage.transport.properties.bootstrap.servers": "k:9092"}},
     "spark.openlineage.transport.topc"),
    # The type set by another source: openlineage.yml's own section is still ours.
    ({"yml": "transport:\n  topc: lineage-prod\n",
      "environ": {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__CONFIG__BOOTSTRAP_SERVERS": "k:1"}},
     "transport.topc"),
])
def test_a_typo_in_openlineage_yml_or_spark_conf_without_a_type_fails(tmp_path, source, key):
    """No type anywhere is our transport: a misspelt topic must not send to the default topic."""
    with pytest.raises(ConfigError, match=f"{key}: unknown transport key"):
        _load(tmp_path, environ=source.get("environ"), spark_conf=source.get("spark_conf"), yml=source.get("yml"))


def test_messages_name_the_transport_keys_as_documented_and_as_written(tmp_path, caplog):
    """The README and examples write topicName; an unknown key is named as the user wrote it,
    also inside the OPENLINEAGE__TRANSPORT JSON section (read ignoring case)."""
    section = {"type": "kafka", "topicNam": "t", "properties": {"bootstrap.servers": "k:9092"}}
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": json.dumps(section)})
    assert "OPENLINEAGE__TRANSPORT.topicNam: unknown transport key; known keys: topicName (or topic), " \
        "messageKey, properties (or config)" in str(info.value)
    caplog.set_level(logging.WARNING, "producer.config")
    _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": "[1]", "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
                             "OPENLINEAGE__TRANSPORT__TOPICNAME": "t",
                             "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "k:1"})
    [line] = _lines(caplog, "env_transport_ignored")
    assert '"topicName": "openlineage"' in line


def test_unknown_variables_without_our_type_are_still_skipped(tmp_path, caplog):
    """The OPENLINEAGE__TRANSPORT__* variables are shared with other tools: without a type of
    ours there, an unknown one is skipped, whatever the other sources say."""
    caplog.set_level(logging.INFO, "producer.config")
    yml = "transport:\n  type: kafka\n  properties: {bootstrap.servers: 'k:9092'}\n"
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT__URL": "http://marquez:5000"}, yml=yml)
    assert cfg.bootstrap_servers == "k:9092"
    [line] = _lines(caplog, "transport_setting_ignored")
    assert "OPENLINEAGE__TRANSPORT__URL" in line and "marquez" not in line


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

def test_the_whole_transport_section_as_json(tmp_path, caplog):
    section = {"type": "kafka", "topic": "t1", "config": {"bootstrap.servers": "k:9092", "linger.ms": 3}}
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": json.dumps(section)})
    assert (cfg.topic, cfg.bootstrap_servers, cfg.properties) == ("t1", "k:9092", {"linger.ms": "3"})
    # As in openlineage-python, the JSON section replaces the single variables: stale ones
    # (a key, a password, a typo) are not read, and are named in one line, without their values.
    caplog.set_level(logging.INFO, "producer.config")
    stale = {"OPENLINEAGE__TRANSPORT__TOPIC": "nested", "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "stale-key",
             "OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_PASSWORD": "hunter2-secret",
             "OPENLINEAGE__TRANSPORT__TOPC": "typo"}
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT": json.dumps(section), **stale})
    assert (cfg.topic, cfg.message_key, cfg.properties) == ("t1", None, {"linger.ms": "3"})
    [line] = _lines(caplog, "env_transport_ignored")
    assert all(var in line for var in stale) and "fix=" in line
    assert not any(value in caplog.text for value in stale.values())


# --- parent and root from one source (findings 3, 7) -------------------------------------

def test_a_config_knows_where_its_parent_came_from(tmp_path):
    env = {"OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"}
    assert _load(tmp_path, {"bootstrap_servers": "k:1"}, environ=env).parent_source == "env"
    assert _load(tmp_path, environ=env, spark_conf={**SPARK_KAFKA, **SPARK_PARENT}).parent_source == "spark"
    explicit = {"bootstrap_servers": "k:1", "parent_job_namespace": "a", "parent_job_name": "b",
                "parent_run_id": RUN_ID}
    assert _load(tmp_path, explicit, environ=env).parent_source == "explicit"


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


SECRET = "hunter2-secret"


@pytest.mark.parametrize("yml, where", [
    # An unclosed quote: PyYAML's message quotes the line it is on.
    ('transport:\n  type: kafka\n  properties:\n    bootstrap.servers: k:9092\n    sasl.password: "hunter2-secret\n',
     "line 6, column 1"),
    ("transport:\n  type: kafka\n  properties:\n    sasl.password: hunter2-secret: x\n", "line 4, column 34"),
    ("transport:\n  type: kafka\n  properties:\n\tsasl.password: hunter2-secret\n", "line 4, column 1"),
    # A value PyYAML cannot build (no such date): not even a YAMLError.
    ("transport:\n  type: kafka\n  properties:\n    sasl.password: hunter2-secret\n    since: 2024-02-30\n",
     "line 5, column 12"),
])
def test_a_malformed_openlineage_yml_never_logs_its_text(tmp_path, caplog, yml, where):
    caplog.set_level(logging.DEBUG)
    cfg = _load(tmp_path, spark_conf=SPARK_KAFKA, yml=yml)
    assert cfg.bootstrap_servers == "spark:9092" and "sasl.password" not in cfg.properties
    [line] = _lines(caplog, "openlineage_yml_ignored")
    assert where in line and "fix=" in line
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, yml=yml)
    assert "bootstrap_servers: required" in str(raised.value)
    assert SECRET not in caplog.text and SECRET not in str(raised.value)


def test_a_value_yaml_cannot_build_in_another_tools_section_skips_the_file(tmp_path, caplog):
    """``since: 2024-02-30`` makes PyYAML raise ValueError: the file is read as empty, and a
    missing setting is the ConfigError the caller expects, not a ValueError."""
    caplog.set_level(logging.WARNING, "producer.config")
    yml = "transport:\n  type: kafka\n  topic: t\nsomething_else:\n  since: 2024-02-30\n"
    cfg = _load(tmp_path, spark_conf=SPARK_KAFKA, yml=yml)
    assert (cfg.bootstrap_servers, cfg.topic) == ("spark:9092", "openlineage")
    [line] = _lines(caplog, "openlineage_yml_ignored")
    assert "line 5, column 10" in line and "it is read as empty" in line
    with pytest.raises(ConfigError, match="bootstrap_servers: required"):
        _load(tmp_path, yml=yml)


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


# --- the Spark integration's other sources (as the official ArgumentParser) ---------------

def test_with_spark_conf_namespace_and_parent_come_from_openlineage_yml_and_env(tmp_path):
    yml = f"namespace: yml-ns\nparentJobNamespace: airflow\nparentJobName: dag.task\nparentRunId: {RUN_ID}\n"
    env = {"OPENLINEAGE__NAMESPACE": "env-ns", "OPENLINEAGE__PARENT_JOB_NAMESPACE": "env",
           "OPENLINEAGE__PARENT_JOB_NAME": "env.task", "OPENLINEAGE__PARENT_RUN_ID": OUTER_ID,
           "OPENLINEAGE_PARENT_ID": f"other/outer.task/{ROOT_ID}"}
    cfg = _load(tmp_path, environ=env, spark_conf=SPARK_KAFKA)
    assert (cfg.namespace, cfg.parent, cfg.parent_source) == ("env-ns", ("env", "env.task", OUTER_ID), "env")
    cfg = _load(tmp_path, environ=env, spark_conf=SPARK_KAFKA, yml=yml)
    assert (cfg.namespace, cfg.parent, cfg.parent_source) == ("yml-ns", ("airflow", "dag.task", RUN_ID), "file")
    cfg = _load(tmp_path, environ=env, spark_conf={**SPARK_KAFKA, **SPARK_PARENT, "spark.openlineage.namespace": "s"})
    assert (cfg.namespace, cfg.parent, cfg.parent_source) == ("s", ("airflow", "dag.task", RUN_ID), "spark")
    # openlineage-python (no Spark conf) reads neither: only its own OPENLINEAGE_PARENT_ID.
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ=env)
    assert (cfg.namespace, cfg.parent) == (None, ("other", "outer.task", ROOT_ID))


def test_an_incomplete_parent_in_openlineage_yml_gives_way_to_the_next_source(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    cfg = _load(tmp_path, environ={"OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"}, spark_conf=SPARK_KAFKA,
                yml=f"parentRunId: {RUN_ID}\n")
    assert cfg.parent == ("other", "outer.task", OUTER_ID)
    [line] = _lines(caplog, "parent_ignored")
    assert "openlineage.yml: parentJobNamespace" in line and "fix=" in line


def test_with_spark_conf_the_transport_json_and_single_variables_merge_as_in_java(tmp_path, caplog):
    """The Java OpenLineageEnvParser merges OPENLINEAGE__TRANSPORT into the single variables,
    the JSON winning key by key (openlineage-python lets it replace them: see above)."""
    caplog.set_level(logging.INFO, "producer.config")
    section = {"type": "kafka", "topicName": "t1", "properties": {"linger.ms": 3}}
    env = {"OPENLINEAGE__TRANSPORT": json.dumps(section), "OPENLINEAGE__TRANSPORT__TOPIC_NAME": "nested",
           "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "k1",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "env:9092"}
    cfg = _load(tmp_path, environ=env, spark_conf={})
    assert (cfg.topic, cfg.message_key, cfg.bootstrap_servers, cfg.properties) == \
        ("t1", "k1", "env:9092", {"linger.ms": "3"})
    assert not _lines(caplog, "env_transport_ignored")


# --- Java properties against librdkafka ones across sources (settings review 1) ----------

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="job-user" password="new-secret";')
ENV_KAFKA = {"OPENLINEAGE__TRANSPORT__TYPE": "kafka",
             "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "127.0.0.1:9"}


@pytest.mark.parametrize("env_credentials", [
    {"OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_USERNAME": "shared-user",
     "OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_PASSWORD": "old-secret"},
    {"OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_PASSWORD": "old-secret"},
])
def test_a_higher_sources_jaas_config_wins_over_lower_librdkafka_credentials(tmp_path, env_credentials):
    spark = {"spark.openlineage.transport.type": "kafka",
             "spark.openlineage.transport.properties.sasl.jaas.config": JAAS}
    props = _load(tmp_path, environ={**ENV_KAFKA, **env_credentials}, spark_conf=spark).properties
    assert (props["sasl.username"], props["sasl.password"]) == ("job-user", "new-secret")


def test_a_higher_sources_librdkafka_credential_wins_over_a_lower_jaas_config(tmp_path):
    yml = ("transport:\n  type: kafka\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n"
           f"    sasl.jaas.config: '{JAAS}'\n")
    spark = {"spark.openlineage.transport.properties.sasl.password": "spark-secret"}
    props = _load(tmp_path, spark_conf=spark, yml=yml).properties
    assert (props["sasl.username"], props["sasl.password"]) == ("job-user", "spark-secret")
    # Within one source the librdkafka property still wins.
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1", "properties": {
        "sasl.jaas.config": JAAS, "sasl.password": "same-source"}})
    assert cfg.properties["sasl.password"] == "same-source"


@pytest.mark.parametrize("spark, yml_props, expected", [
    ({"max.request.size": "5242880"}, {"message.max.bytes": 1000000}, {"message.max.bytes": "5242880"}),
    ({"message.max.bytes": "2000000"}, {"max.request.size": 5242880}, {"message.max.bytes": "2000000"}),
    ({"compression.type": "zstd", "compression.zstd.level": "7"}, {"compression.level": 3},
     {"compression.type": "zstd", "compression.level": "7"}),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/spark/ca.pem"}, {"ssl.ca.location": "/yml/ca.pem"},
     {"ssl.ca.location": "/spark/ca.pem"}),
    ({"ssl.keystore.key": "spark-key"}, {"ssl.key.pem": "yml-key"}, {"ssl.key.pem": "spark-key"}),
])
def test_a_java_property_and_its_librdkafka_name_compete_by_source(tmp_path, spark, yml_props, expected):
    """Spark conf > openlineage.yml, whichever of the two names each writes."""
    yml = "transport:\n  type: kafka\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n" + "".join(
        f"    {key}: {value}\n" for key, value in yml_props.items())
    conf = {f"spark.openlineage.transport.properties.{key}": value for key, value in spark.items()}
    assert _load(tmp_path, spark_conf=conf, yml=yml).properties == expected


def test_a_java_truststore_over_a_lower_ca_is_refused(tmp_path):
    """Spark conf's JKS truststore is the one Java would use: not silently a lower source's CA."""
    conf = {"spark.openlineage.transport.properties.ssl.truststore.location": "/spark/truststore.jks"}
    with pytest.raises(ConfigError, match="ssl.truststore.location is a Java truststore"):
        _load(tmp_path, environ={**ENV_KAFKA, "OPENLINEAGE__TRANSPORT__PROPERTIES__SSL_CA_LOCATION": "/ca.pem"},
              spark_conf=conf)


# --- blank values in the environment (settings review 5) ----------------------------------

@pytest.mark.parametrize("spark", [None, SPARK_KAFKA])
def test_a_blank_env_property_is_not_set(tmp_path, caplog, spark):
    """A template rendering an unset value gives "": it must not turn TLS hostname verification off."""
    caplog.set_level(logging.INFO, "producer.config")
    blank = {"OPENLINEAGE__TRANSPORT__PROPERTIES__SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": " "}
    cfg = _load(tmp_path, environ={**ENV_KAFKA, **blank}, spark_conf=spark)
    assert "ssl.endpoint.identification.algorithm" not in cfg.properties
    assert "OPENLINEAGE__TRANSPORT__PROPERTIES__SSL_ENDPOINT_IDENTIFICATION_ALGORITHM" in caplog.text
    whole = {"OPENLINEAGE__TRANSPORT": json.dumps({"type": "kafka", "properties": {
        "bootstrap.servers": "127.0.0.1:9", "ssl.endpoint.identification.algorithm": ""}})}
    assert "ssl.endpoint.identification.algorithm" not in _load(tmp_path, environ=whole, spark_conf=spark).properties


def test_an_empty_endpoint_algorithm_in_openlineage_yml_is_honoured(tmp_path):
    yml = ("transport:\n  type: kafka\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n"
           "    ssl.endpoint.identification.algorithm: ''\n")
    assert _load(tmp_path, yml=yml).properties == {"ssl.endpoint.identification.algorithm": "none"}


# --- parent fields merged across sources (settings review 2) -------------------------------

@pytest.mark.parametrize("environ, yml, spark", [
    ({"OPENLINEAGE__PARENT_JOB_NAMESPACE": "airflow"}, None,
     {"spark.openlineage.parentJobName": "dag.task", "spark.openlineage.parentRunId": RUN_ID}),
    ({}, "parentJobNamespace: airflow\nparentJobName: dag.task\n", {"spark.openlineage.parentRunId": RUN_ID}),
    ({"OPENLINEAGE__PARENT_RUN_ID": RUN_ID, "OPENLINEAGE__PARENT_JOB_NAME": "env.task"},
     "parentJobName: dag.task\n", {"spark.openlineage.parentJobNamespace": "airflow"}),
])
def test_parent_fields_merge_across_sources(tmp_path, environ, yml, spark):
    """As SparkOpenLineageConfig.mergeWithNonNull: each field from the highest source that sets it."""
    environ = {**environ, "OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"}
    cfg = _load(tmp_path, environ=environ, spark_conf={**SPARK_KAFKA, **spark}, yml=yml)
    assert cfg.parent == ("airflow", "dag.task", RUN_ID) and cfg.root_parent is None
    assert cfg.parent_source in ("spark", "file", "env") and cfg.parent_source != "explicit"


def test_each_root_field_not_set_is_the_parents(tmp_path):
    """As the official buildApplicationParentFacet: a root field not set falls back to the parent's."""
    env = {"OPENLINEAGE__ROOT_PARENT_RUN_ID": ROOT_ID}
    cfg = _load(tmp_path, environ=env, spark_conf={**SPARK_KAFKA, **SPARK_PARENT,
                                                   "spark.openlineage.rootParentJobName": "dag"})
    assert cfg.root_parent == ("airflow", "dag", ROOT_ID)
    cfg = _load(tmp_path, spark_conf={**SPARK_KAFKA, **SPARK_PARENT, "spark.openlineage.rootParentJobName": "dag"})
    assert cfg.root_parent == ("airflow", "dag", RUN_ID)


def test_a_root_run_id_that_is_not_a_uuid_costs_the_root_only(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    cfg = _load(tmp_path, spark_conf={**SPARK_KAFKA, **SPARK_PARENT, **SPARK_ROOT,
                                      "spark.openlineage.rootParentRunId": "{{ root_run_id }}"})
    assert cfg.parent == ("airflow", "dag.task", RUN_ID) and cfg.root_parent is None
    [line] = _lines(caplog, "parent_ignored")
    assert "spark.openlineage.rootParentRunId reason=not a UUID" in line and "without a root" in line


def test_without_spark_conf_the_parent_fields_are_not_read(tmp_path):
    env = {"OPENLINEAGE__PARENT_JOB_NAMESPACE": "airflow", "OPENLINEAGE__PARENT_JOB_NAME": "dag.task",
           "OPENLINEAGE__PARENT_RUN_ID": RUN_ID, "OPENLINEAGE_PARENT_ID": f"other/outer.task/{OUTER_ID}"}
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ=env)
    assert cfg.parent == ("other", "outer.task", OUTER_ID) and cfg.parent_source == "env"


# --- property values that are no text, and numbers in openlineage.yml (settings review 6) ---

@pytest.mark.parametrize("yml_value, env_json", [("", None), ("~", None), (None, {"sasl.password": None})])
def test_a_null_property_is_refused_naming_it(tmp_path, yml_value, env_json):
    """``sasl.password:`` (a template that rendered nothing) was sent as the password "None"."""
    if env_json is None:
        yml = ("transport:\n  type: kafka\n  properties:\n    bootstrap.servers: k:9092\n"
               f"    sasl.username: svc\n    sasl.password: {yml_value}\n")
        environ, where = {}, "openlineage.yml: transport.properties.sasl.password"
    else:
        yml = None
        environ = {"OPENLINEAGE__TRANSPORT": json.dumps({"type": "kafka", "properties": {
            "bootstrap.servers": "k:9092", **env_json}})}
        where = "OPENLINEAGE__TRANSPORT.properties.sasl.password"
    with pytest.raises(ConfigError, match=f"{where}: no value \\(null\\) fix: give a value, or remove it"):
        _load(tmp_path, environ=environ, yml=yml)


@pytest.mark.parametrize("nested, where, fix", [
    ("    sasl:\n      mechanism: PLAIN\n      password: hunter2\n", "transport.properties.sasl: a nested mapping",
     "use dotted keys (sasl.<name>: <value>), e.g. sasl.password: ..."),
    ("    sasl.password: [hunter2]\n", "transport.properties.sasl.password: a list", "comma-separated"),
    ("    bootstrap.servers:\n      hunter2: 1\n", "transport.properties.bootstrap.servers: a nested mapping",
     "dotted keys"),
])
def test_a_nested_property_is_refused_naming_it_never_its_value(tmp_path, nested, where, fix):
    """A nested mapping's str() reached librdkafka, and repr() printed the password in it."""
    yml = "transport:\n  type: kafka\n  properties:\n    security.protocol: SASL_SSL\n" + nested
    if "bootstrap" not in nested:
        yml += "    bootstrap.servers: k:9092\n"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, yml=yml)
    assert where in str(err.value) and fix in str(err.value)
    assert "hunter2" not in str(err.value)


def test_yaml_numbers_are_read_as_written_where_text_is_expected(tmp_path):
    """PyYAML reads YAML 1.1: 012345 is octal 5349, 1_000 is 1000, 12:30 is 750, 1.10 is 1.1. The
    Java integration keeps the text; numbers where numbers are expected still work."""
    yml = ("transport:\n  type: kafka\n  topicName: 0123\n  messageKey: 1_000\n  journalMaxBytes: 0x100000\n"
           "  closeTimeoutS: 2.50\n  queueMaxEvents: 1_000\n"
           "  properties:\n    bootstrap.servers: k:9092\n    sasl.username: 12:30\n    sasl.password: 012345\n"
           "    client.id: 1.10\n    linger.ms: 5\n    enable.ssl.certificate.verification: true\n"
           "namespace: 0042\n")
    cfg = _load(tmp_path, yml=yml)
    assert (cfg.topic, cfg.message_key) == ("0123", "1_000")
    assert cfg.properties == {"sasl.username": "12:30", "sasl.password": "012345", "client.id": "1.10",
                              "linger.ms": "5", "enable.ssl.certificate.verification": "true"}
    assert (cfg.journal_max_bytes, cfg.close_timeout_s, cfg.queue_max_events) == (1048576, 2.5, 1000)
    assert type(cfg.journal_max_bytes) is int and type(cfg.close_timeout_s) is float
    assert _load(tmp_path, spark_conf={}, yml=yml).namespace == "0042"


def test_a_yaml_byte_size_with_underscores_is_refused_not_read_by_librdkafka_as_1(tmp_path):
    yml = "transport:\n  type: kafka\n  properties:\n    bootstrap.servers: k:9092\n    message.max.bytes: 1_000_000\n"
    with pytest.raises(ConfigError, match="message.max.bytes must be a whole number of bytes"):
        _load(tmp_path, yml=yml)


def test_journal_dir_expands_the_home_directory(tmp_path, monkeypatch):
    """``journalDir: ~/spool`` was a directory named "~" under the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    yml = "transport:\n  type: kafka\n  journalDir: ~/spool\n  properties:\n    bootstrap.servers: k:9092\n"
    assert _load(tmp_path, yml=yml).journal_path == tmp_path / "h" / "spool"
    explicit = _load(tmp_path, {"bootstrap_servers": "k:9092", "journal_dir": "~/other"})
    assert explicit.journal_path == tmp_path / "h" / "other"


def test_spark_conf_transport_config_means_properties(tmp_path):
    """``config`` and ``properties`` both mean librdkafka properties, in Spark conf too."""
    conf = {"spark.openlineage.transport.type": "kafka",
            "spark.openlineage.transport.config.bootstrap.servers": "spark:9092",
            "spark.openlineage.transport.config.linger.ms": "7",
            "spark.openlineage.transport.config.client.id": "lower",
            "spark.openlineage.transport.properties.client.id": "wins"}
    cfg = _load(tmp_path, spark_conf=conf)
    assert cfg.bootstrap_servers == "spark:9092"
    assert cfg.properties == {"linger.ms": "7", "client.id": "wins"}
    with pytest.raises(ConfigError, match=r"spark\.openlineage\.transport\.config\.bootstrap\.servers: must be"):
        _load(tmp_path, spark_conf={"spark.openlineage.transport.type": "kafka",
                                    "spark.openlineage.transport.config.bootstrap.servers": "nocolon"})


def test_an_empty_endpoint_algorithm_in_openlineage_yml_is_honoured_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    yml = ("transport:\n  type: kafka\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n"
           "    ssl.endpoint.identification.algorithm: ''\n")
    assert _load(tmp_path, yml=yml).properties == {"ssl.endpoint.identification.algorithm": "none"}
    assert _lines(caplog, "tls_hostname_verification_off")


# --- the Spark capture's namespace from openlineage.yml and OPENLINEAGE__* (no JVM) ---------

class _FakeConf:
    def __init__(self, conf):
        self._conf = conf

    def getAll(self):  # noqa: N802 - PySpark's name
        return list(self._conf.items())

    def get(self, key, default=None):
        return self._conf.get(key, default)


class _FakeSession:
    """Enough of a SparkSession for enable_lineage to read its settings (SparkLineage is faked)."""

    version = "3.5.0"

    def __init__(self, conf):
        self._jsparkSession = object()
        self.conf = _FakeConf(conf)
        self.sparkContext = type("SC", (), {"getConf": lambda _self: self.conf})()


class _Recorder:
    def emit(self, event):
        pass


def _capture_settings(monkeypatch, tmp_path, environ, yml=None):
    import producer.spark as spark_mod

    captured = {}

    class FakeLineage:
        def __init__(self, spark, sender, settings, **kw):
            captured["settings"] = settings
            self.ended, self.capturing, self.spark = False, True, spark

        def start(self):
            pass

    for var in [v for v in os.environ if v.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(var)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    if yml is not None:
        (tmp_path / "openlineage.yml").write_text(yml)
    monkeypatch.setattr(spark_mod, "SparkLineage", FakeLineage)
    monkeypatch.setattr(spark_mod, "_ACTIVE", {})
    spark_mod.enable_lineage(_FakeSession({"spark.app.name": "app"}), producer=_Recorder())
    return captured["settings"]


@pytest.mark.parametrize("yml, environ, expected", [
    ("namespace: 2024\n", {}, "2024"),
    ("namespace: 0042\n", {}, "0042"),   # as written (YAML 1.1 would read octal 34)
    (None, {"OPENLINEAGE__NAMESPACE": "2024"}, "2024"),
    ("namespace: true\n", {}, "true"),
])
def test_the_spark_capture_reads_the_namespace_as_text(monkeypatch, tmp_path, yml, environ, expected):
    """openlineage.yml's ``namespace: 2024`` reached the events as the number 2024."""
    settings = _capture_settings(monkeypatch, tmp_path, environ, yml)
    assert settings.namespace == expected and type(settings.namespace) is str


@pytest.mark.parametrize("yml, environ, where", [
    (None, {"OPENLINEAGE__NAMESPACE": '["a"]'}, "env OPENLINEAGE__NAMESPACE: expected text, got a list"),
    ("namespace:\n  a: b\n", {}, "openlineage.yml: namespace: expected text"),
])
def test_the_spark_capture_refuses_a_namespace_that_is_no_text(monkeypatch, tmp_path, yml, environ, where):
    with pytest.raises(ConfigError, match=where):
        _capture_settings(monkeypatch, tmp_path, environ, yml)
