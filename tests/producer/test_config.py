"""Configuration: the ecosystem's sources, their precedence, and clear errors."""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import Path

import pytest

from producer import LineageProducer
from producer.config import KAFKA_DEFAULTS, ProducerConfig, build_config, default_journal_dir, load_config
from producer.errors import ConfigError

RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
ROOT_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6b"
SPARK = {
    "spark.openlineage.transport.type": "kafka",
    "spark.openlineage.transport.topicName": "spark-topic",
    "spark.openlineage.transport.messageKey": "spark-key",
    "spark.openlineage.transport.properties.bootstrap.servers": "spark:9092",
    "spark.openlineage.transport.properties.compression.type": "zstd",
    "spark.openlineage.namespace": "spark-ns",
    "spark.openlineage.parentJobNamespace": "airflow",
    "spark.openlineage.parentJobName": "dag.task",
    "spark.openlineage.parentRunId": RUN_ID,
    "spark.openlineage.rootParentJobNamespace": "airflow",
    "spark.openlineage.rootParentJobName": "dag",
    "spark.openlineage.rootParentRunId": ROOT_ID,
    "spark.openlineage.columnLineage.datasetLineageEnabled": "true",  # not ours: ignored
}


def _load(tmp_path, overrides=None, *, environ=None, spark_conf=None, yml=None):
    if yml is not None:
        (tmp_path / "openlineage.yml").write_text(yml)
    return load_config(overrides, environ=environ or {}, spark_conf=spark_conf, cwd=tmp_path,
                       home=tmp_path / "home")


def test_spark_conf_alone_configures_everything(tmp_path):
    cfg = _load(tmp_path, spark_conf=SPARK)
    assert (cfg.bootstrap_servers, cfg.topic, cfg.message_key, cfg.namespace) == \
        ("spark:9092", "spark-topic", "spark-key", "spark-ns")
    assert cfg.properties == {"compression.type": "zstd"}
    assert cfg.parent == ("airflow", "dag.task", RUN_ID)
    assert cfg.root_parent == ("airflow", "dag", ROOT_ID)


def test_precedence_is_explicit_then_spark_then_yaml_then_env(tmp_path):
    """As the official Spark integration merges them (openlineage.yml, then Spark conf over it)
    and openlineage-python does (openlineage.yml over OPENLINEAGE__ variables)."""
    yml = "transport:\n  type: kafka\n  topic: yml-topic\n  config:\n    linger.ms: 7\n"
    env = {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": "env-topic",
           "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "env-key",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__LINGER_MS": "3",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__BATCH_SIZE": "1000",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "env:9092",
           "OPENLINEAGE_NAMESPACE": "env-ns"}
    cfg = _load(tmp_path, environ=env, spark_conf=SPARK, yml=yml)
    assert (cfg.topic, cfg.message_key, cfg.bootstrap_servers) == ("spark-topic", "spark-key", "spark:9092")
    assert cfg.namespace == "spark-ns"
    assert cfg.properties == {"compression.type": "zstd", "linger.ms": "7", "batch.size": "1000"}
    cfg = _load(tmp_path, environ=env, yml=yml)
    assert (cfg.topic, cfg.message_key, cfg.bootstrap_servers) == ("yml-topic", "env-key", "env:9092")
    assert cfg.namespace == "env-ns"
    cfg = _load(tmp_path, {"topic": "explicit", "bootstrap_servers": "x:1"}, environ=env,
                spark_conf=SPARK, yml=yml)
    assert (cfg.topic, cfg.bootstrap_servers) == ("explicit", "x:1")


def test_yaml_location_follows_the_openlineage_clients(tmp_path):
    (tmp_path / "home" / ".openlineage").mkdir(parents=True)
    (tmp_path / "home" / ".openlineage" / "openlineage.yml").write_text(
        "transport:\n  type: kafka\n  topic: home\n  properties: {bootstrap.servers: 'h:1'}\n")
    assert _load(tmp_path).topic == "home"
    (tmp_path / "openlineage.yml").write_text(
        "transport:\n  type: kafka\n  topic: cwd\n  properties: {bootstrap.servers: 'c:1'}\n")
    assert _load(tmp_path).topic == "cwd"
    explicit = tmp_path / "elsewhere.yml"
    explicit.write_text("transport:\n  type: kafka\n  topic: env-path\n  config: {bootstrap.servers: 'e:1'}\n")
    assert _load(tmp_path, environ={"OPENLINEAGE_CONFIG": str(explicit)}).topic == "env-path"


def test_transports_of_another_type_are_ignored(tmp_path):
    yml = "transport:\n  type: http\n  url: http://marquez:5000\n"
    cfg = _load(tmp_path, {"bootstrap_servers": "k:9092"}, yml=yml)
    assert cfg.topic == "openlineage"


def test_env_parent_ids_as_airflow_sets_them(tmp_path):
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ={
        "OPENLINEAGE_PARENT_ID": f"airflow/dag.task/{RUN_ID}",
        "OPENLINEAGE_ROOT_PARENT_ID": f"airflow/dag/{ROOT_ID}",
        "OPENLINEAGE_NAMESPACE": "team"})
    assert cfg.parent == ("airflow", "dag.task", RUN_ID)
    assert cfg.root_parent == ("airflow", "dag", ROOT_ID)
    assert cfg.namespace == "team"


@pytest.mark.parametrize("source, message", [
    ({"spark_conf": {**SPARK, "spark.openlineage.transport.topicNmae": "x"}},
     "spark.openlineage.transport.topicNmae: unknown transport key"),
    ({"yml": "transport:\n  type: kafka\n  topic: t\n  retries: 3\n"}, "transport.retries: unknown transport key"),
    ({"spark_conf": {**SPARK, "spark.openlineage.transport.queueMaxEvents": "many"}},
     "spark.openlineage.transport.queueMaxEvents: Input should be a valid integer"),
    ({"overrides": {"bootstrap_servers": "k:1", "encoding": "xml"}}, "encoding: Input should be 'json' or 'avro'"),
    ({"overrides": {"bootstrap_servers": "k:1", "topic": "no spaces"}}, "topic: a Kafka topic name"),
    ({"overrides": {"bootstrap_servers": "k:1", "bogus": 1}}, "bogus: unknown key"),
    ({"overrides": {"bootstrap_servers": "k:1", "properties": {"acks": "1"}}}, "acks='1' is not supported"),
    ({"overrides": {"bootstrap_servers": "k:1", "properties": {"enable.idempotence": False}}},
     "enable.idempotence='false' is not supported"),
    ({"overrides": {"bootstrap_servers": "k:1", "parent_run_id": RUN_ID}},
     "parent_job_namespace, parent_job_name missing"),
    ({"overrides": {}}, "bootstrap_servers: required"),
    ({"environ": {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPC": "t"}},
     "OPENLINEAGE__TRANSPORT__TOPC: unknown transport key"),
    ({"yml": "transport:\n  type: kafka\n  properties:\n    bootstrap.servers: k:1\n    message.max.bytes: 10MB\n"},
     "transport.properties: message.max.bytes must be a whole number of bytes, without a unit"),
    ({"environ": {"OPENLINEAGE__TRANSPORT__TYPE": "kafka",
                  "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "k:1",
                  "OPENLINEAGE__TRANSPORT__PROPERTIES__MESSAGE_MAX_BYTES": "abc"}},
     "OPENLINEAGE__TRANSPORT__PROPERTIES__.*: message.max.bytes must be a whole number of bytes"),
    ({"overrides": {"bootstrap_servers": "k:1", "properties": {"batch.size": "1MB"}}},
     "batch.size must be a whole number of bytes"),
])
def test_mistakes_name_the_key_and_the_fix(tmp_path, source, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _load(tmp_path, source.get("overrides"), environ=source.get("environ"),
              spark_conf=source.get("spark_conf"), yml=source.get("yml"))


def test_a_bad_byte_size_fails_at_construction_with_a_config_error(tmp_path):
    """librdkafka reads "10MB" as 10 (and "1000abc" as 1000); the producer reads these
    sizes itself. Either way the user gets a ConfigError naming the property."""
    for value in ("10MB", "abc", "1000abc", "1.5e6"):
        with pytest.raises(ConfigError, match="message.max.bytes must be a whole number of bytes"):
            LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path,
                            properties={"message.max.bytes": value})
    with LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path,
                         properties={"message.max.bytes": 2_000_000, "batch.size": "500000"}) as p:
        assert p.config.properties["message.max.bytes"] == "2000000"


def test_unknown_librdkafka_property_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="properties: librdkafka rejected.*no.such.property"):
        LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path,
                        properties={"no.such.property": "1"})


def test_a_value_librdkafka_rejects_is_not_quoted(tmp_path):
    """librdkafka's message quotes the rejected value (a secret put in the wrong property):
    the error names the property only, and does not chain librdkafka's exception."""
    with pytest.raises(ConfigError, match='Invalid value for configuration property "security.protocol"') as raised:
        LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path,
                        properties={"security.protocol": "hunter2-secret"})
    assert "hunter2" not in "".join(traceback.format_exception(raised.value))


def test_overrides_keep_where_the_parent_came_from(tmp_path):
    cfg = _load(tmp_path, {"bootstrap_servers": "127.0.0.1:1"},
                environ={"OPENLINEAGE_PARENT_ID": f"airflow/dag.task/{RUN_ID}"})
    with LineageProducer(cfg, journal_dir=tmp_path, topic="other") as producer:
        assert producer.config.parent == cfg.parent and producer.config.parent_source == "env"
        assert producer.config.topic == "other"
    assert cfg == ProducerConfig(**cfg.model_dump())   # equal settings are equal configs


def test_secrets_never_print():
    cfg = ProducerConfig(bootstrap_servers="k:1", properties={"sasl.password": "hunter2",
                                                             "ssl.key.password": "pw", "linger.ms": 5})
    assert "hunter2" not in repr(cfg) and "pw'" not in repr(cfg) and "'5'" in repr(cfg)
    assert cfg.kafka_properties()["sasl.password"] == "hunter2"


@pytest.mark.parametrize("props, message", [
    ({"sasl.password": None}, r"properties(: |\.)sasl\.password: no value \(null\) fix: give a value, or remove it"),
    ({"sasl": {"username": "svc", "password": "hunter2"}},
     r"properties(: |\.)sasl: a nested mapping, not a librdkafka property value fix: use dotted keys"),
    ({"sasl.password": ["hunter2"]}, r"properties(: |\.)sasl\.password: a list"),
    ({"bootstrap.servers": {"k": "hunter2"}}, r"(config: |properties\.)bootstrap\.servers: a nested mapping"),
])
def test_a_property_that_is_no_value_is_refused_never_printed(props, message):
    """None was sent as the text "None"; a nested mapping as the text of a dict, which repr() printed
    with the password in it."""
    for build in (lambda: build_config({"bootstrap_servers": "k:1", "properties": props}),
                  lambda: load_config({"bootstrap_servers": "k:1", "properties": props}, environ={})):
        with pytest.raises(ConfigError) as err:
            build()
        assert re.search(message, str(err.value)), str(err.value)
        assert "hunter2" not in "".join(traceback.format_exception(err.value))


def test_kafka_defaults_keep_order_and_allow_tuning():
    props = ProducerConfig(bootstrap_servers="k:1", queue_max_events=7,
                           properties={"compression.type": "zstd"}).kafka_properties()
    assert props["enable.idempotence"] == "true" and props["acks"] == "all"
    assert props["compression.type"] == "zstd" and props["queue.buffering.max.messages"] == "7"
    assert set(KAFKA_DEFAULTS) <= set(props)


def test_journal_dir_default(monkeypatch, tmp_path):
    monkeypatch.setenv("LINEAGE_RELAY_JOURNAL_DIR", str(tmp_path))
    assert default_journal_dir("t") == tmp_path / "t"
    monkeypatch.delenv("LINEAGE_RELAY_JOURNAL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert ProducerConfig(bootstrap_servers="k:1", topic="t").journal_path == \
        tmp_path / "cache" / "lineage-relay" / "journal" / "t"


def test_from_spark_conf_returns_none_unless_kafka(monkeypatch):
    monkeypatch.delenv("OPENLINEAGE_DISABLED", raising=False)
    assert LineageProducer.from_spark_conf({"spark.openlineage.transport.type": "http"}) is None
    assert LineageProducer.from_spark_conf({}) is None
    assert LineageProducer.from_spark_conf({**SPARK, "spark.openlineage.disabled": "true"}) is None
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert LineageProducer.from_spark_conf(SPARK) is None


def test_an_unusable_journal_dir_fails_at_construction(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="journal_dir: cannot create .*a-file/journal"):
        LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=blocker / "journal")


def test_building_events_does_not_load_kafka_or_pydantic():
    import subprocess
    import sys

    code = ("import sys, producer.events, producer.keys; "
            "print(sorted(m for m in ('confluent_kafka', 'pydantic', 'fastavro') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


# --- the official Java (Spark) Kafka transport's settings carry over ---------------------

OFFICIAL_SPARK_KAFKA = {   # as the OpenLineage Spark docs show the Kafka transport
    "spark.openlineage.transport.type": "kafka",
    "spark.openlineage.transport.topicName": "openlineage.events",
    "spark.openlineage.transport.localServerId": "some-value",
    "spark.openlineage.transport.properties.bootstrap.servers": "127.0.0.1:1",
    "spark.openlineage.transport.properties.acks": "all",
    "spark.openlineage.transport.properties.retries": "3",
    "spark.openlineage.transport.properties.key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
    "spark.openlineage.transport.properties.value.serializer":
        "org.apache.kafka.common.serialization.StringSerializer",
    "spark.openlineage.transport.properties.interceptor.classes": "com.example.Interceptor",
    "spark.openlineage.transport.properties.partitioner.class": "com.example.Partitioner",
}


def test_the_official_spark_kafka_config_starts_a_producer(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    cfg = _load(tmp_path, {"journal_dir": tmp_path / "j"}, spark_conf=OFFICIAL_SPARK_KAFKA)
    assert cfg.topic == "openlineage.events"
    assert cfg.properties == {"acks": "all", "retries": "3"}
    # One warning names every dropped key.
    warnings = [r.getMessage() for r in caplog.records if "java_properties_ignored" in r.getMessage()]
    assert len(warnings) == 1
    assert "interceptor.classes,key.serializer,partitioner.class,value.serializer" in warnings[0]
    LineageProducer(cfg).close(0)   # librdkafka takes what is left


def test_java_only_properties_are_all_unknown_to_librdkafka():
    """The list is justified by librdkafka itself: it refuses every one of them."""
    from confluent_kafka import KafkaException, Producer

    from producer.config import JAVA_ONLY_PROPERTIES

    for key in sorted(JAVA_ONLY_PROPERTIES):
        with pytest.raises(KafkaException, match="No such configuration property"):
            Producer({"bootstrap.servers": "127.0.0.1:1", key: "1"})


PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.mark.parametrize("jaas", [   # all valid for Kafka's JaasConfig (java.io.StreamTokenizer)
    f"{PLAIN} required username='svc' password='s3cr3t';",
    f'{PLAIN} REQUIRED username="svc" password="s3cr3t";',
    f"{PLAIN} required username=svc password=s3cr3t;",
    f'{PLAIN} Required /* a comment */ username="svc"\n  password="s3cr3t"; // trailing comment',
    f"{PLAIN} optional username='sv\\143' password='s3cr3t';",   # an octal escape
])
def test_sasl_jaas_config_is_read_with_kafkas_grammar(jaas):
    cfg = ProducerConfig(bootstrap_servers="k:9092", properties={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas})
    assert (cfg.properties["sasl.username"], cfg.properties["sasl.password"]) == ("svc", "s3cr3t")


@pytest.mark.parametrize("jaas, problem", [
    (f'{PLAIN} required username="u" password=123;', "no value for option password"),   # a number: no value
    (f'{PLAIN} mandatory username="u" password="s3cr3t";', "no control flag"),
    (f'{PLAIN} required username="u" password="s3cr3t"; {PLAIN} required;', "2 login modules"),
    (f'{PLAIN} required username="u" password="s3cr3t"', "does not end with ';'"),
])
def test_sasl_jaas_config_kafka_would_refuse_is_refused(jaas, problem):
    with pytest.raises(ConfigError) as info:
        build_config({"bootstrap_servers": "k:1", "properties": {"sasl.jaas.config": jaas}})
    assert problem in str(info.value) and "s3cr3t" not in str(info.value)


@pytest.mark.parametrize("module", ["org.apache.kafka.common.security.plain.PlainLoginModule",
                                    "org.apache.kafka.common.security.scram.ScramLoginModule"])
def test_sasl_jaas_config_of_plain_or_scram_becomes_librdkafka_properties(module):
    jaas = f'{module} required username="alice" password="p4ss \\"quoted\\"";'
    cfg = ProducerConfig(bootstrap_servers="k:1", properties={"sasl.jaas.config": jaas,
                                                             "sasl.mechanism": "SCRAM-SHA-512"})
    assert cfg.properties == {"sasl.username": "alice", "sasl.password": 'p4ss "quoted"',
                              "sasl.mechanism": "SCRAM-SHA-512"}
    assert "p4ss" not in repr(cfg)


@pytest.mark.parametrize("jaas", [
    'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientSecret="s3cr3t";',
    'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab="/k" principal="s3cr3t";',
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cr3t" x="y";',
])
def test_other_sasl_jaas_configs_fail_with_the_librdkafka_equivalents(jaas):
    with pytest.raises(ConfigError) as info:
        build_config({"bootstrap_servers": "k:1", "properties": {"sasl.jaas.config": jaas}},
                     {"properties": "spark.openlineage.transport.properties.*"})
    text = str(info.value)
    assert "spark.openlineage.transport.properties.*: sasl.jaas.config" in text
    assert "sasl.username" in text and "sasl.password" in text and "sasl.mechanism" in text
    assert "s3cr3t" not in "".join(traceback.format_exception(info.value))


def test_config_errors_and_their_tracebacks_carry_no_secret(tmp_path):
    spark = {**SPARK, "spark.openlineage.transport.properties.sasl.password": "hunter2",
             "spark.openlineage.transport.properties.acks": "1",        # invalid: the error
             "spark.openlineage.transport.queueMaxEvents": "many"}      # invalid too
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, spark_conf=spark)
    assert "acks" in str(info.value) and "queueMaxEvents" in str(info.value)
    shown = "".join(traceback.format_exception(info.value))
    assert "hunter2" not in shown and "hunter2" not in str(info.value)


@pytest.mark.parametrize("prop", [
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem", "ssl_key",
    "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.jaas.config",
])
def test_repr_masks_every_secret_bearing_librdkafka_property(prop):
    from producer.config import is_secret

    cfg = ProducerConfig.model_construct(bootstrap_servers="k:1", properties={prop: "s3cr3t", "linger.ms": "5"})
    assert is_secret(prop)
    assert "s3cr3t" not in repr(cfg) and "'5'" in repr(cfg)


def test_repr_leaves_ordinary_properties_readable():
    from producer.config import is_secret

    assert not any(is_secret(p) for p in ("linger.ms", "bootstrap.servers", "security.protocol",
                                          "sasl.mechanism", "sasl.username", "ssl.ca.location",
                                          "compression.type", "batch.size"))


# --- other tools' OpenLineage env config ---------------------------------------------------

@pytest.mark.parametrize("env", [
    {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "http://marquez:5000",
     "OPENLINEAGE__TRANSPORT__AUTH__TYPE": "api_key", "OPENLINEAGE__TRANSPORT__AUTH__APIKEY": "k",
     "OPENLINEAGE__TRANSPORT__HEADERS__X_TEAM": "data"},
    {"OPENLINEAGE__TRANSPORT__TYPE": "composite",
     "OPENLINEAGE__TRANSPORT__TRANSPORTS__FIRST__TYPE": "http",
     "OPENLINEAGE__TRANSPORT__TRANSPORTS__FIRST__URL": "http://marquez:5000"},
])
def test_env_transports_of_another_type_are_ignored(tmp_path, env):
    cfg = _load(tmp_path, {"bootstrap_servers": "k:9092"}, environ=env)
    assert (cfg.topic, cfg.properties) == ("openlineage", {})


def test_numeric_env_values_are_text_for_text_fields(tmp_path):
    cfg = _load(tmp_path, environ={"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": "123",
                                   "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "42",
                                   "OPENLINEAGE__TRANSPORT__QUEUE_MAX_EVENTS": "500",
                                   "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "k:9092"})
    assert (cfg.topic, cfg.message_key, cfg.queue_max_events) == ("123", "42", 500)
    assert _load(tmp_path, yml="transport:\n  type: kafka\n  topic: 7\n  config: {bootstrap.servers: 'k:1'}\n"
                 ).topic == "7"


def test_a_malformed_env_parent_id_is_logged_and_ignored(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.config")
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ={
        "OPENLINEAGE_PARENT_ID": "just-a-name", "OPENLINEAGE_ROOT_PARENT_ID": f"airflow/dag/{ROOT_ID}"})
    assert cfg.parent is None and cfg.root_parent is None
    assert "OPENLINEAGE_PARENT_ID" in caplog.text and "<namespace>/<job name>/<run id>" in caplog.text


@pytest.mark.parametrize("written", [RUN_ID.replace("-", ""), "{" + RUN_ID.upper() + "}", f"urn:uuid:{RUN_ID}"])
def test_parent_run_ids_are_canonical(tmp_path, written):
    cfg = _load(tmp_path, {"bootstrap_servers": "k:1", "parent_job_namespace": "a", "parent_job_name": "b",
                           "parent_run_id": written})
    assert cfg.parent_run_id == RUN_ID
    env = _load(tmp_path, {"bootstrap_servers": "k:1"}, environ={"OPENLINEAGE_PARENT_ID": f"airflow/t/{written}"})
    assert env.parent_run_id == RUN_ID


@pytest.mark.parametrize("servers", ["http://kafka:9092", "k:1,https://kafka:9092"])
def test_a_url_as_bootstrap_servers_fails_at_construction_naming_the_key(tmp_path, servers):
    # librdkafka would log a parse error and run with no broker: every event journaled, none sent.
    conf = {**SPARK, "spark.openlineage.transport.properties.bootstrap.servers": servers}
    with pytest.raises(ConfigError, match=r"spark.openlineage.transport.properties.*bootstrap.servers: must be "
                                          r"host:port\[,host:port...\] without a URL scheme"):
        _load(tmp_path, spark_conf=conf)


def test_a_librdkafka_security_protocol_prefix_is_a_valid_bootstrap_server(tmp_path):
    conf = {**SPARK, "spark.openlineage.transport.properties.bootstrap.servers": "k:1,SASL_SSL://kafka:9093"}
    assert _load(tmp_path, spark_conf=conf).bootstrap_servers == "k:1,SASL_SSL://kafka:9093"


@pytest.mark.parametrize("servers", ["kafka:9092/openlineage", "k:1,PLAINTEXT://kafka:9092/x"])
def test_a_path_after_the_port_is_accepted_as_librdkafka_accepts_it(tmp_path, servers):
    # librdkafka ignores what follows the port: it connects to kafka:9092 and delivers.
    conf = {**SPARK, "spark.openlineage.transport.properties.bootstrap.servers": servers}
    assert _load(tmp_path, spark_conf=conf).bootstrap_servers == servers


# --- other Kafka Java client properties: translated, dropped or refused --------------------

@pytest.mark.parametrize("java, librdkafka", [
    ({"max.request.size": "10485760"}, {"message.max.bytes": "10485760"}),
    ({"send.buffer.bytes": "131072", "receive.buffer.bytes": "-1"},   # -1: the OS default, librdkafka's 0
     {"socket.send.buffer.bytes": "131072", "socket.receive.buffer.bytes": "0"}),
    ({"max.request.size": "2000000", "message.max.bytes": "3000000"}, {"message.max.bytes": "3000000"}),
    ({"ssl.endpoint.identification.algorithm": ""}, {"ssl.endpoint.identification.algorithm": "none"}),
    ({"compression.lz4.level": "3", "compression.gzip.level": "5"}, {"compression.level": "3"}),   # lz4 in use
    ({"compression.type": "gzip", "compression.gzip.level": "5"}, {"compression.type": "gzip",
                                                                   "compression.level": "5"}),
    ({"ssl.enabled.protocols": "TLSv1.2,TLSv1.3", "ssl.protocol": "TLSv1.3"}, {}),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "{ca}"}, {"ssl.ca.location": "{ca}"}),
    ({"ssl.truststore.location": "/etc/kafka/truststore.jks", "ssl.truststore.password": "changeit",
      "ssl.ca.location": "{ca}"}, {"ssl.ca.location": "{ca}"}),   # the librdkafka CA given as well wins
])
def test_java_properties_librdkafka_has_are_translated(tmp_path, java, librdkafka):
    from tests.producer.support import write_ca_pem

    ca = str(write_ca_pem(tmp_path / "ca.pem"))
    java = {k: v.replace("{ca}", ca) for k, v in java.items()}
    librdkafka = {k: v.replace("{ca}", ca) for k, v in librdkafka.items()}
    cfg = ProducerConfig(bootstrap_servers="127.0.0.1:1", properties=java)
    assert cfg.properties == librdkafka
    LineageProducer(cfg.model_copy(update={"journal_dir": tmp_path / "j"})).close(0)   # librdkafka takes it


def test_common_java_producer_properties_start_a_producer(tmp_path, caplog):
    """What a Java producer config usually holds: librdkafka has the same names, or they are dropped."""
    caplog.set_level(logging.WARNING, "producer.config")
    java = {"acks": "all", "retries": "2147483647", "linger.ms": "5", "batch.size": "16384",
            "compression.type": "snappy", "client.id": "spark-lineage", "delivery.timeout.ms": "120000",
            "request.timeout.ms": "30000", "max.in.flight.requests.per.connection": "5", "enable.idempotence": "true",
            "retry.backoff.ms": "100", "reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "1000",
            "metadata.max.age.ms": "300000", "connections.max.idle.ms": "540000", "client.dns.lookup":
            "use_all_dns_ips", "buffer.memory": "33554432", "max.block.ms": "60000", "max.request.size": "1048576",
            "send.buffer.bytes": "131072", "receive.buffer.bytes": "32768", "metadata.max.idle.ms": "300000",
            "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
            "value.serializer": "org.apache.kafka.common.serialization.StringSerializer"}
    cfg = ProducerConfig(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path / "j", properties=java)
    LineageProducer(cfg).close(0)
    [warning] = [r.getMessage() for r in caplog.records if "java_properties_ignored" in r.getMessage()]
    assert "buffer.memory,key.serializer,max.block.ms,metadata.max.idle.ms,value.serializer" in warning


def test_translated_java_properties_are_unknown_to_librdkafka_under_their_java_names():
    from confluent_kafka import KafkaException, Producer

    from producer.java_properties import RENAMED

    for java, (name, low, _high) in RENAMED.items():
        with pytest.raises(KafkaException, match="No such configuration property"):
            Producer({"bootstrap.servers": "127.0.0.1:1", java: str(low)})
        Producer({"bootstrap.servers": "127.0.0.1:1", name: str(low)}).flush(0)


@pytest.mark.parametrize("props, named, fix", [
    ({"ssl.truststore.location": "/etc/kafka/truststore.jks", "ssl.truststore.password": "changeit"},
     "ssl.truststore.location", "ssl.ca.location"),
    ({"ssl.truststore.type": "PKCS12", "ssl.truststore.location": "/etc/kafka/truststore.p12"},
     "ssl.truststore.location", "ssl.ca.location"),
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/etc/kafka/keystore.jks",
      "ssl.keystore.password": "changeit"}, "ssl.keystore.location", "ssl.certificate.location"),
    ({"max.request.size": "10MB"}, "max.request.size", "whole number"),
    ({"sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;"}, "AWS MSK IAM", "SCRAM"),
])
def test_java_properties_librdkafka_cannot_honour_fail_with_the_fix(props, named, fix):
    with pytest.raises(ConfigError) as info:
        build_config({"bootstrap_servers": "k:1", "properties": props},
                     {"properties": "spark.openlineage.transport.properties.*"})
    assert named in str(info.value) and fix in str(info.value) and "changeit" not in str(info.value)


def test_local_server_id_is_the_message_key_unless_message_key_is_set(tmp_path, caplog, monkeypatch):
    """openlineage-java's KafkaConfig: the record key before 1.13, setLocalServerId() sets
    messageKey in 1.13-1.15."""
    from producer import readers

    monkeypatch.setattr(readers, "_logged", set())   # logged once per process
    caplog.set_level(logging.WARNING, "producer.config")
    conf = {"spark.openlineage.transport.type": "kafka", "spark.openlineage.transport.localServerId": "cluster-a",
            "spark.openlineage.transport.properties.bootstrap.servers": "k:9092"}
    assert _load(tmp_path, spark_conf=conf).message_key == "cluster-a"
    assert "event=deprecated_setting key=spark.openlineage.transport.localServerId" in caplog.text
    conf["spark.openlineage.transport.messageKey"] = "fixed"
    assert _load(tmp_path, spark_conf=conf).message_key == "fixed"


def test_a_quoted_control_flag_is_read_as_kafka_reads_it():
    """JaasConfig takes the flag token's string value: a quoted ``"required"`` is accepted by Kafka."""
    cfg = ProducerConfig(bootstrap_servers="k:9092", properties={
        "sasl.jaas.config": f'{PLAIN} "required" username="alice" password="s3cr3t";'})
    assert (cfg.properties["sasl.username"], cfg.properties["sasl.password"]) == ("alice", "s3cr3t")


@pytest.mark.parametrize("name, head", [
    ("keystore.jks", b"\xfe\xed\xfe\xed\x00\x00\x00\x02"),    # JKS magic
    ("keystore.bin", b"\xce\xce\xce\xce\x00\x00\x00\x02"),    # JCEKS magic
    ("keystore.jks", b"\xa7\xdbE\x04z59KU$"),                 # not PKCS#12 DER, named as JKS
    ("keystore.key", b"-----BEGIN PRIVATE KEY-----\n"),      # PEM
    ("missing.jks", None),                                   # not readable here: the name tells
])
def test_a_keystore_without_a_type_is_read_as_java_reads_it(tmp_path, name, head):
    """Java's default keystore type is JKS (which also reads PKCS#12 files): a JKS or PEM file
    with no ssl.keystore.type is refused with the fix, not failed inside librdkafka."""
    path = tmp_path / name
    if head is not None:
        path.write_bytes(head + b"\x00" * 32)
    with pytest.raises(ConfigError) as info:
        build_config({"bootstrap_servers": "k:1", "properties": {
            "ssl.keystore.location": str(path), "ssl.keystore.password": "changeit"}})
    assert "ssl.keystore.location" in str(info.value) and "ssl.certificate.location" in str(info.value)
    assert "changeit" not in str(info.value)


def test_a_pkcs12_keystore_without_a_type_is_librdkafkas_own_setting(tmp_path):
    path = tmp_path / "client.jks"   # a PKCS#12 file whatever its name (DER starts with a SEQUENCE)
    path.write_bytes(b"\x30\x82\x0a\x00" + b"\x00" * 32)
    for location in (str(path), str(tmp_path / "client.p12")):
        cfg = build_config({"bootstrap_servers": "k:1", "properties": {"ssl.keystore.location": location}})
        assert cfg.properties == {"ssl.keystore.location": location}
