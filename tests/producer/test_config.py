"""Configuration: the ecosystem's sources, their precedence, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer import LineageProducer
from producer.config import KAFKA_DEFAULTS, ProducerConfig, default_journal_dir, load_config
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


def test_precedence_is_explicit_then_yaml_then_env_then_spark(tmp_path):
    yml = "transport:\n  type: kafka\n  topic: yml-topic\n  config:\n    linger.ms: 7\n"
    env = {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": "env-topic",
           "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "env-key",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__LINGER_MS": "3",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__BATCH_SIZE": "1000"}
    cfg = _load(tmp_path, environ=env, spark_conf=SPARK, yml=yml)
    assert cfg.topic == "yml-topic"          # yml over env and spark
    assert cfg.message_key == "env-key"      # env over spark
    assert cfg.properties == {"compression.type": "zstd", "linger.ms": "7", "batch.size": "1000"}
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
    ({"overrides": {"bootstrap_servers": "k:1", "parent_run_id": RUN_ID}}, "parent_job_namespace, parent_job_name missing"),
    ({"overrides": {}}, "bootstrap_servers: required"),
    ({"environ": {"OPENLINEAGE_PARENT_ID": "just-a-name"}}, "OPENLINEAGE_PARENT_ID"),
])
def test_mistakes_name_the_key_and_the_fix(tmp_path, source, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _load(tmp_path, source.get("overrides"), environ=source.get("environ"),
              spark_conf=source.get("spark_conf"), yml=source.get("yml"))


def test_unknown_librdkafka_property_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="properties: librdkafka rejected.*no.such.property"):
        LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path,
                        properties={"no.such.property": "1"})


def test_secrets_never_print():
    cfg = ProducerConfig(bootstrap_servers="k:1", properties={"sasl.password": "hunter2",
                                                             "ssl.key.password": "pw", "linger.ms": 5})
    assert "hunter2" not in repr(cfg) and "pw'" not in repr(cfg) and "'5'" in repr(cfg)
    assert cfg.kafka_properties()["sasl.password"] == "hunter2"


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
