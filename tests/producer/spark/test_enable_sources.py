"""``enable_lineage(spark)`` finds the transport wherever the OpenLineage conventions allow
it: Spark conf, ``OPENLINEAGE__TRANSPORT__*`` env vars, or openlineage.yml (the same
sources ``load_config`` merges). No JVM: the session is test_enable's small fake."""

from __future__ import annotations

import logging

import pytest

from producer.errors import ConfigError
from producer.spark import disable_lineage, enable_lineage
from tests.producer.spark.support import application_start
from tests.producer.spark.test_enable import FakeSession


@pytest.fixture
def no_ambient_config(monkeypatch, tmp_path):
    """No openlineage.yml or OPENLINEAGE__ env var but the test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED", "OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID"):
        monkeypatch.delenv(var, raising=False)
    import os
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE__")]:
        monkeypatch.delenv(var)
    return tmp_path


def _enabled(spark):
    lineage = enable_lineage(spark)
    try:
        return lineage
    finally:
        if lineage is not None:
            disable_lineage(spark)
            lineage.sender.close(0)


def test_a_transport_in_openlineage_env_vars_alone_enables_capture(no_ambient_config, monkeypatch):
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TOPIC_NAME", "openlineage")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__JOURNAL_DIR", str(no_ambient_config / "journal"))
    spark = FakeSession({})
    lineage = _enabled(spark)
    assert lineage is not None and lineage.sender.config.bootstrap_servers == "127.0.0.1:9"
    assert spark.registered() == 0, "and disabled again"


def test_a_transport_in_openlineage_yml_alone_enables_capture(no_ambient_config):
    (no_ambient_config / "openlineage.yml").write_text(
        "transport:\n  type: kafka\n  topicName: openlineage\n"
        f"  journalDir: {no_ambient_config / 'journal'}\n"
        "  properties:\n    bootstrap.servers: 127.0.0.1:9\n")
    lineage = _enabled(FakeSession({}))
    assert lineage is not None and lineage.sender.config.topic == "openlineage"


def test_no_transport_anywhere_or_another_tools_is_still_no_capture(no_ambient_config, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "producer.spark")
    assert _enabled(FakeSession({})) is None
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "http")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__URL", "http://marquez:5000")
    assert _enabled(FakeSession({})) is None
    assert "no transport configured" in caplog.text


SPARK_KAFKA = {"spark.openlineage.transport.type": "kafka",
               "spark.openlineage.transport.properties.bootstrap.servers": "127.0.0.1:9"}


@pytest.fixture
def fresh_logs(monkeypatch):
    from producer import parents, readers

    monkeypatch.setattr(readers, "_logged", set())
    monkeypatch.setattr(parents, "_warned", set())


def test_another_transports_variables_do_not_stop_spark_conf_kafka(no_ambient_config, monkeypatch):
    """HTTP auth variables without OPENLINEAGE__TRANSPORT__TYPE: merged, not ours, skipped."""
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__AUTH__TYPE", "api_key")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__AUTH__API_KEY", "s3cret")
    lineage = _enabled(FakeSession({**SPARK_KAFKA, "spark.openlineage.transport.journalDir":
                                    str(no_ambient_config / "journal")}))
    assert lineage is not None and lineage.sender.config.bootstrap_servers == "127.0.0.1:9"


def test_a_malformed_openlineage_yml_does_not_stop_spark_conf_kafka(no_ambient_config, fresh_logs, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    (no_ambient_config / "openlineage.yml").write_text("transport:\n  type: http\n  url: http://x\n   endpoint: e\n")
    lineage = _enabled(FakeSession({**SPARK_KAFKA, "spark.openlineage.transport.journalDir":
                                    str(no_ambient_config / "journal")}))
    assert lineage is not None
    assert f"event=openlineage_yml_ignored path={no_ambient_config / 'openlineage.yml'}" in caplog.text


def test_openlineage_yml_of_another_type_wins_over_env_kafka(no_ambient_config, monkeypatch, caplog):
    """openlineage.yml (http) over OPENLINEAGE__ variables (kafka): an HTTP setup, not ours."""
    (no_ambient_config / "openlineage.yml").write_text("transport:\n  type: http\n  url: http://marquez:5000\n")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    caplog.set_level(logging.INFO, "producer.spark")
    assert _enabled(FakeSession({})) is None
    assert "the configured transport (" in caplog.text and "transport.type=http) is not ours" in caplog.text


def test_spark_conf_wins_for_namespace_parent_and_root(no_ambient_config, monkeypatch):
    run_id, root_id = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a", "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6b"
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "env-ns")
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", "outer/outer.task/0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6c")
    lineage = _enabled(FakeSession({
        **SPARK_KAFKA, "spark.openlineage.transport.journalDir": str(no_ambient_config / "journal"),
        "spark.openlineage.namespace": "spark-ns",
        "spark.openlineage.parentJobNamespace": "airflow", "spark.openlineage.parentJobName": "dag.task",
        "spark.openlineage.parentRunId": run_id, "spark.openlineage.rootParentJobNamespace": "airflow",
        "spark.openlineage.rootParentJobName": "dag", "spark.openlineage.rootParentRunId": root_id}))
    assert lineage.settings.namespace == lineage.sender.config.namespace == "spark-ns"
    assert lineage.parent == ("airflow", "dag.task", run_id) and lineage.root == ("airflow", "dag", root_id)


def test_a_value_yaml_cannot_build_does_not_stop_spark_conf_kafka(no_ambient_config, fresh_logs, caplog):
    """``since: 2024-02-30`` (no such date) in another tool's part of openlineage.yml: PyYAML
    raises ValueError, which must neither escape enable_lineage nor cost the capture."""
    caplog.set_level(logging.WARNING, "producer")
    (no_ambient_config / "openlineage.yml").write_text(
        "transport:\n  type: http\n  url: http://m\nsomething_else:\n  since: 2024-02-30\n")
    lineage = _enabled(FakeSession({**SPARK_KAFKA, "spark.openlineage.transport.journalDir":
                                    str(no_ambient_config / "journal")}))
    assert lineage is not None and lineage.sender.config.bootstrap_servers == "127.0.0.1:9"
    assert _enabled(FakeSession({})) is None
    assert "no transport configured" in caplog.text and "line 5, column 10" in caplog.text


def test_a_typo_in_openlineage_yml_without_a_type_fails_at_start(no_ambient_config):
    """No type anywhere is our transport: ``topc`` must not send everything to the default topic."""
    (no_ambient_config / "openlineage.yml").write_text(
        "transport:\n  topc: lineage-prod\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n")
    with pytest.raises(ConfigError, match="transport.topc: unknown transport key"):
        enable_lineage(FakeSession({}))


def test_spark_conf_parent_wins_over_the_env_parent_a_given_producer_took(no_ambient_config, monkeypatch):
    """A producer built by LineageProducer(...) took OPENLINEAGE_PARENT_ID from the environment;
    the session's Spark conf parent still wins (Spark conf > env); an explicit one does not yield."""
    from producer.config import load_config
    from tests.producer.spark.support import Recorder

    run_id = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
    spark_parent = {"spark.openlineage.parentJobNamespace": "airflow", "spark.openlineage.parentJobName": "dag.task",
                    "spark.openlineage.parentRunId": run_id}
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", "outer/outer.task/0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6c")
    for config, parent in [
        (load_config({"bootstrap_servers": "127.0.0.1:9"}), ("airflow", "dag.task", run_id)),
        (load_config({"bootstrap_servers": "127.0.0.1:9", "parent_job_namespace": "mine", "parent_job_name": "job",
                      "parent_run_id": run_id}), ("mine", "job", run_id)),
    ]:
        sender = Recorder()
        sender.config = config
        spark = FakeSession(spark_parent)
        lineage = enable_lineage(spark, producer=sender)
        try:
            assert lineage.parent == parent
            [start] = sender.events
            assert start["run"]["facets"]["parent"]["job"]["namespace"] == parent[0]
        finally:
            disable_lineage(spark)


def test_every_transport_key_counts_as_a_transport_configured_elsewhere():
    """A transport section holding any of our keys is ours (journalAdoptIntervalS included)."""
    from producer.sources import _TRANSPORT_KEYS
    from producer.spark import _TRANSPORT_FIELDS

    assert {field for field in _TRANSPORT_KEYS.values() if field} <= _TRANSPORT_FIELDS


# --- namespace, parent and facets in openlineage.yml and OPENLINEAGE__* (as ArgumentParser) --

RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
OTHER_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6c"


def test_namespace_parent_and_facets_in_openlineage_yml(no_ambient_config):
    (no_ambient_config / "openlineage.yml").write_text(
        f"namespace: team-a\nparentJobNamespace: airflow\nparentJobName: dag.task\nparentRunId: {RUN_ID}\n"
        "facets:\n  disabled: [processing_engine]\n  spark_properties:\n    disabled: true\n")
    lineage, start = application_start(FakeSession({"spark.app.name": "app"}))
    assert start["job"]["namespace"] == lineage.settings.namespace == "team-a"
    assert start["run"]["facets"]["parent"]["job"] == {"namespace": "airflow", "name": "dag.task"}
    assert lineage.parent == ("airflow", "dag.task", RUN_ID)
    # Left out of what is sent, not only configured.
    assert not {"processing_engine", "spark_properties"} & set(start["run"]["facets"])


def test_namespace_parent_and_facets_in_openlineage_env_vars(no_ambient_config, monkeypatch):
    # The Java env parser's names: PARENT_JOB_NAME is parentJobName, FACETS__X__DISABLED is facets.x.disabled.
    for var, value in {"OPENLINEAGE__NAMESPACE": "team-a", "OPENLINEAGE__PARENT_JOB_NAMESPACE": "airflow",
                       "OPENLINEAGE__PARENT_JOB_NAME": "dag.task", "OPENLINEAGE__PARENT_RUN_ID": RUN_ID,
                       "OPENLINEAGE__FACETS__SPARK_PROPERTIES__DISABLED": "true",
                       "OPENLINEAGE__FACETS__DISABLED": "[processing_engine]"}.items():
        monkeypatch.setenv(var, value)
    lineage, start = application_start(FakeSession({"spark.app.name": "app"}))
    assert start["job"]["namespace"] == "team-a"
    assert lineage.parent == ("airflow", "dag.task", RUN_ID)
    assert not {"processing_engine", "spark_properties"} & set(start["run"]["facets"])


def test_spark_conf_over_openlineage_yml_over_env_vars(no_ambient_config, monkeypatch):
    monkeypatch.setenv("OPENLINEAGE__NAMESPACE", "env-ns")
    monkeypatch.setenv("OPENLINEAGE__PARENT_JOB_NAMESPACE", "env")
    monkeypatch.setenv("OPENLINEAGE__PARENT_JOB_NAME", "env.task")
    monkeypatch.setenv("OPENLINEAGE__PARENT_RUN_ID", OTHER_ID)
    monkeypatch.setenv("OPENLINEAGE__FACETS__DISABLED", "[spark_properties]")
    monkeypatch.setenv("OPENLINEAGE__FACETS__PROCESSING_ENGINE__DISABLED", "true")
    (no_ambient_config / "openlineage.yml").write_text(
        f"namespace: yml-ns\nparentJobNamespace: airflow\nparentJobName: dag.task\nparentRunId: {RUN_ID}\n"
        "facets:\n  spark_properties:\n    disabled: false\n")
    lineage, start = application_start(FakeSession({"spark.app.name": "app"}))
    assert (lineage.settings.namespace, lineage.parent) == ("yml-ns", ("airflow", "dag.task", RUN_ID))
    # A higher source's explicit false turns a facet back on; its list never does.
    assert "spark_properties" in start["run"]["facets"] and "processing_engine" not in start["run"]["facets"]
    lineage, start = application_start(FakeSession({
        "spark.app.name": "app", "spark.openlineage.namespace": "spark-ns", "spark.openlineage.facets.disabled": "[x]",
        "spark.openlineage.parentJobNamespace": "spark", "spark.openlineage.parentJobName": "spark.task",
        "spark.openlineage.parentRunId": OTHER_ID}))
    assert (lineage.settings.namespace, lineage.parent) == ("spark-ns", ("spark", "spark.task", OTHER_ID))
    assert "processing_engine" not in start["run"]["facets"]


def test_the_built_producer_takes_namespace_and_parent_from_openlineage_yml(no_ambient_config):
    (no_ambient_config / "openlineage.yml").write_text(
        f"namespace: team-a\nparentJobNamespace: airflow\nparentJobName: dag.task\nparentRunId: {RUN_ID}\n"
        f"transport:\n  type: kafka\n  journalDir: {no_ambient_config / 'journal'}\n"
        "  properties:\n    bootstrap.servers: 127.0.0.1:9\n")
    lineage = _enabled(FakeSession({}))
    config = lineage.sender.config
    assert (lineage.settings.namespace, config.namespace) == ("team-a", "team-a")
    assert lineage.parent == config.parent == ("airflow", "dag.task", RUN_ID)
    assert config.parent_source == "file"   # so this session's Spark conf parent still wins over it


def test_a_blank_spark_conf_value_is_not_set(no_ambient_config):
    """As ArgumentParser (StringUtils.isNotBlank): the topic comes from openlineage.yml."""
    (no_ambient_config / "openlineage.yml").write_text("namespace: yml-ns\ntransport:\n  topicName: from-yaml\n")
    lineage = _enabled(FakeSession({**SPARK_KAFKA, "spark.openlineage.transport.journalDir":
                                    str(no_ambient_config / "journal"),
                                    "spark.openlineage.transport.topicName": " ", "spark.openlineage.namespace": ""}))
    assert lineage.sender.config.topic == "from-yaml"
    assert lineage.settings.namespace == "yml-ns"


@pytest.mark.parametrize("props", [
    {"max.request.size": "10485760"},
    {"ssl.enabled.protocols": "TLSv1.2", "ssl.protocol": "TLSv1.2"},
    {"send.buffer.bytes": "131072", "receive.buffer.bytes": "-1"},
    {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": "{ca}"},
])
def test_java_kafka_properties_do_not_fail_the_job(no_ambient_config, props):
    from tests.producer.support import write_ca_pem

    if props.get("ssl.truststore.location") == "{ca}":
        props = {**props, "ssl.truststore.location": str(write_ca_pem(no_ambient_config / "ca.pem"))}
    lineage = _enabled(FakeSession({
        **SPARK_KAFKA, "spark.openlineage.transport.journalDir": str(no_ambient_config / "journal"),
        **{f"spark.openlineage.transport.properties.{key}": value for key, value in props.items()}}))
    assert lineage is not None


@pytest.mark.parametrize("props, named", [
    ({"security.protocol": "SSL", "ssl.truststore.location": "/etc/kafka/truststore.jks",
      "ssl.truststore.password": "changeit"}, "ssl.truststore.location"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "AWS_MSK_IAM",
      "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;"}, "AWS MSK IAM"),
])
def test_java_kafka_properties_librdkafka_cannot_honour_fail_with_the_fix(no_ambient_config, props, named):
    """A JKS truststore or MSK IAM login: dropping it would connect without the CA or the
    login; the error names the key and what to set instead, before the job's work starts."""
    with pytest.raises(ConfigError) as info:
        enable_lineage(FakeSession({
            **SPARK_KAFKA, "spark.openlineage.transport.journalDir": str(no_ambient_config / "journal"),
            **{f"spark.openlineage.transport.properties.{key}": value for key, value in props.items()}}))
    assert named in str(info.value) and ("ssl.ca.location" in str(info.value) or "SCRAM" in str(info.value))
    assert "changeit" not in str(info.value)


@pytest.mark.parametrize("where", ["yml", "env"])
def test_a_given_producers_namespace_from_the_lowest_source_does_not_beat_the_others(
        no_ambient_config, monkeypatch, where):
    """LineageProducer() reads OPENLINEAGE_NAMESPACE (the lowest source): openlineage.yml's and
    OPENLINEAGE__NAMESPACE still win, as without producer=; an explicit namespace still wins over them."""
    from producer.config import load_config
    from tests.producer.spark.support import Recorder

    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "env-ns")
    if where == "yml":
        (no_ambient_config / "openlineage.yml").write_text("namespace: team-a\n")
    else:
        monkeypatch.setenv("OPENLINEAGE__NAMESPACE", "team-a")
    for config, namespace in [(load_config({"bootstrap_servers": "127.0.0.1:9"}), "team-a"),
                              (load_config({"bootstrap_servers": "127.0.0.1:9", "namespace": "mine"}), "mine")]:
        assert config.namespace_source == ("env" if namespace == "team-a" else "explicit")
        sender = Recorder()
        sender.config = config
        spark = FakeSession({})
        lineage = enable_lineage(spark, producer=sender)
        try:
            assert lineage.settings.namespace == namespace
        finally:
            disable_lineage(spark)


def test_parent_fields_from_env_and_spark_conf_make_one_parent(no_ambient_config, monkeypatch):
    run_id = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
    monkeypatch.setenv("OPENLINEAGE__PARENT_JOB_NAMESPACE", "airflow")
    lineage = _enabled(FakeSession({
        **SPARK_KAFKA, "spark.openlineage.transport.journalDir": str(no_ambient_config / "journal"),
        "spark.openlineage.parentJobName": "dag.task", "spark.openlineage.parentRunId": run_id}))
    assert lineage.parent == ("airflow", "dag.task", run_id)
