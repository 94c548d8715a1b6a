"""OpenLineageClient configured only by openlineage.yml delivers through our producer."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import attr
import pytest
from openlineage.client import OpenLineageClient, event_v2
from openlineage.client.facet_v2 import RunFacet, parent_run
from openlineage.client.uuid import generate_new_uuid

from producer import LineageProducer, events, readers
from producer.errors import ConfigError
from producer.openlineage_transport import TRANSPORT_TYPE, LineageRelayConfig, LineageRelayTransport
from tests.producer.support import ROOT, decode, open_paths_under
from tests.support.kafka import read_topic
from tests.support.spec import validator

pytestmark = pytest.mark.kafka


@pytest.fixture
def clean_env(monkeypatch):
    """No OpenLineage variable but the test's own; afterwards, none of those OpenLineageClient
    writes into os.environ itself (it aliases OPENLINEAGE_URL as OPENLINEAGE__TRANSPORT__*)."""
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(var)
    yield
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE__TRANSPORT__TRANSPORTS__")]:
        os.environ.pop(var)   # not monkeypatch.delenv: its undo would put them back


def _emit_start_complete(client: OpenLineageClient, name: str) -> None:
    run_id = str(generate_new_uuid())
    for state in (event_v2.RunState.START, event_v2.RunState.COMPLETE):
        client.emit(event_v2.RunEvent(
            eventType=state, eventTime=events.utc_now_iso(), producer=events.PRODUCER_URI,
            run=event_v2.Run(runId=run_id), job=event_v2.Job(namespace="python", name=name)))


def test_client_configured_by_openlineage_yml_emits_to_kafka(kafka, tmp_cwd, clean_env):
    topic = kafka.new_topic("ol-client")
    (tmp_cwd / "openlineage.yml").write_text(
        f"transport:\n"
        f"  type: {TRANSPORT_TYPE}\n"
        f"  topicName: {topic}\n"
        f"  journalDir: {tmp_cwd / 'journal'}\n"
        f"  properties:\n"
        f"    bootstrap.servers: {kafka.bootstrap_servers}\n"
    )
    client = OpenLineageClient()
    assert isinstance(client.transport, LineageRelayTransport)
    run_id, parent_id = str(generate_new_uuid()), str(generate_new_uuid())
    parent = parent_run.ParentRunFacet(run=parent_run.Run(runId=parent_id),
                                       job=parent_run.Job(namespace="airflow", name="dag.task"))
    for state in (event_v2.RunState.START, event_v2.RunState.COMPLETE):
        client.emit(event_v2.RunEvent(
            eventType=state, eventTime=events.utc_now_iso(), producer=events.PRODUCER_URI,
            run=event_v2.Run(runId=run_id, facets={"parent": parent}),
            job=event_v2.Job(namespace="python", name="client.job"),
            inputs=[event_v2.InputDataset(namespace="s3://b", name="in")]))
    assert client.close(10)
    records = read_topic(kafka.bootstrap_servers, topic, expected=2)
    assert [decode(r.value)["eventType"] for r in records] == ["START", "COMPLETE"]
    assert {r.key for r in records} == {b"run:airflow/dag.task"}   # the official key rule
    for rec in records:
        validator().validate(decode(rec.value))


def test_a_typo_in_the_transport_section_fails_when_the_client_is_built(tmp_cwd, clean_env):
    (tmp_cwd / "openlineage.yml").write_text(
        f"transport:\n  type: {TRANSPORT_TYPE}\n  topc: x\n  properties:\n    bootstrap.servers: k:1\n")
    with pytest.raises(ConfigError, match="transport.topc: unknown transport key"):
        OpenLineageClient()


def test_openlineage_url_in_the_environment_does_not_stop_the_plugin(kafka, tmp_cwd, clean_env, monkeypatch, caplog):
    """Airflow deployments set OPENLINEAGE_URL; OpenLineageClient then merges
    OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__* into our section. The official Kafka
    transport drops keys it does not know, and so do we (with one log line)."""
    topic = kafka.new_topic("ol-url")
    (tmp_cwd / "openlineage.yml").write_text(
        f"transport:\n  type: {TRANSPORT_TYPE}\n  topicName: {topic}\n  journalDir: {tmp_cwd / 'journal'}\n"
        f"  properties:\n    bootstrap.servers: {kafka.bootstrap_servers}\n")
    monkeypatch.setenv("OPENLINEAGE_URL", "http://marquez:5000")
    monkeypatch.setenv("OPENLINEAGE_API_KEY", "s3cret")
    monkeypatch.setattr(readers, "_logged", set())   # logged once per process: as in a fresh one
    caplog.set_level(logging.INFO, "producer.config")
    client = OpenLineageClient()
    assert isinstance(client.transport, LineageRelayTransport)
    _emit_start_complete(client, "url.job")
    assert client.close(10)
    records = read_topic(kafka.bootstrap_servers, topic, expected=2)
    assert [decode(r.value)["eventType"] for r in records] == ["START", "COMPLETE"]
    assert "key=transport.transports" in caplog.text and "s3cret" not in caplog.text


def test_client_configured_by_environment_variables_alone(kafka, tmp_cwd, clean_env, monkeypatch):
    """The client hands over OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS as
    ``properties: {bootstrap_servers: ...}``: read as bootstrap.servers."""
    topic = kafka.new_topic("ol-env")
    for key, value in {"TYPE": TRANSPORT_TYPE, "TOPIC": topic, "JOURNAL_DIR": str(tmp_cwd / "journal"),
                       "PROPERTIES__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                       "PROPERTIES__LINGER_MS": "5"}.items():
        monkeypatch.setenv(f"OPENLINEAGE__TRANSPORT__{key}", value)
    client = OpenLineageClient()
    assert client.transport.producer.config.properties == {"linger.ms": "5"}
    _emit_start_complete(client, "env.job")
    assert client.close(10)
    records = read_topic(kafka.bootstrap_servers, topic, expected=2)
    assert [decode(r.value)["job"]["name"] for r in records] == ["env.job", "env.job"]


@pytest.mark.parametrize("blank", [
    {"OPENLINEAGE__TRANSPORT__PROPERTIES__SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": ""},
    {"OPENLINEAGE__TRANSPORT__CONFIG__SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": " "},
    # The client lets this JSON replace the single PROPERTIES__* variables.
    {"OPENLINEAGE__TRANSPORT__PROPERTIES": json.dumps({
        "bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""})},
])
def test_a_blank_env_property_is_not_set_through_the_client(tmp_cwd, clean_env, monkeypatch, caplog, blank):
    """A template that rendered nothing turned TLS hostname verification off through the client
    (it hands the blank over as ""), although load_config reads the same variables as not set."""
    monkeypatch.setattr(readers, "_logged", set())
    caplog.set_level(logging.INFO, "producer.config")
    env = {"OPENLINEAGE__TRANSPORT__TYPE": TRANSPORT_TYPE, "OPENLINEAGE__TRANSPORT__JOURNAL_DIR": str(tmp_cwd / "j"),
           "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": "127.0.0.1:9",
           "OPENLINEAGE__TRANSPORT__PROPERTIES__SECURITY_PROTOCOL": "SSL", **blank}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    transport = OpenLineageClient().transport
    try:
        assert "ssl.endpoint.identification.algorithm" not in transport.producer.config.properties
        assert transport.producer.config.properties == {"security.protocol": "SSL"}
    finally:
        transport.close(0)
    assert "event=transport_setting_ignored key=OPENLINEAGE__TRANSPORT__" in caplog.text
    assert "tls_hostname_verification_off" not in caplog.text


def test_numbers_in_openlineage_yml_are_read_as_written_through_the_client(tmp_cwd, clean_env):
    """The client reads openlineage.yml with yaml.safe_load (YAML 1.1): 012345 was sent as 5349."""
    (tmp_cwd / "openlineage.yml").write_text(
        f"transport:\n  type: {TRANSPORT_TYPE}\n  topicName: 0123\n  journalDir: {tmp_cwd / 'j'}\n"
        f"  queueMaxEvents: 1_000\n  properties:\n    bootstrap.servers: 127.0.0.1:9\n"
        f"    sasl.username: 12:30\n    sasl.password: 012345\n    client.id: 1.10\n    linger.ms: 5\n")
    transport = OpenLineageClient().transport
    try:
        config = transport.producer.config
        assert (config.topic, config.queue_max_events) == ("0123", 1000)
        assert config.properties == {"sasl.username": "12:30", "sasl.password": "012345", "client.id": "1.10",
                                     "linger.ms": "5"}
    finally:
        transport.close(0)


def test_a_null_env_property_is_refused_through_the_client(tmp_cwd, clean_env, monkeypatch):
    """The client parses OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_PASSWORD=null as JSON null: the
    password was the text "None"."""
    for key, value in {"TYPE": TRANSPORT_TYPE, "PROPERTIES__BOOTSTRAP_SERVERS": "127.0.0.1:9",
                       "PROPERTIES__SASL_PASSWORD": "null"}.items():
        monkeypatch.setenv(f"OPENLINEAGE__TRANSPORT__{key}", value)
    with pytest.raises(ConfigError, match=r"transport\.properties\.sasl_password: no value \(null\)"):
        OpenLineageClient()


# What Airflow's OpenLineage listener does: fork, build the client in the child, emit there,
# and end the child with os._exit(0), which runs no exit handler (no producer close).
_AIRFLOW_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE")]:
        del os.environ[var]
    from openlineage.client import OpenLineageClient, event_v2
    from producer import events
    pid = os.fork()
    if pid == 0:
        client = OpenLineageClient(config={{"transport": {transport!r}}})
        client.emit(event_v2.RunEvent(eventType=event_v2.RunState.COMPLETE, eventTime=events.utc_now_iso(),
                                      producer=events.PRODUCER_URI, run=event_v2.Run(runId={run_id!r}),
                                      job=event_v2.Job(namespace="airflow", name="dag.task")))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit status", status, flush=True)
    os._exit(0)
""")


def _airflow_task(transport: dict, run_id: str) -> None:
    code = _AIRFLOW_CHILD.format(root=str(ROOT), transport=transport, run_id=run_id)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "child exit status 0" in done.stdout, done.stderr[-3000:]


def test_an_event_emitted_in_a_forked_child_that_ends_with_os_exit_is_delivered(kafka, tmp_path):
    """flush (default true, as the official Kafka transport's): emit returns once Kafka has
    the event, so Airflow's task COMPLETE/FAIL, emitted in a child ended by os._exit(0), is sent."""
    topic = kafka.new_topic("ol-fork")
    run_id = str(generate_new_uuid())
    _airflow_task({"type": TRANSPORT_TYPE, "topic": topic, "journalDir": str(tmp_path / "journal"),
                   "config": {"bootstrap.servers": kafka.bootstrap_servers}}, run_id)
    records = read_topic(kafka.bootstrap_servers, topic, expected=1, timeout_s=15)
    doc = decode(records[0].value)
    assert (doc["eventType"], doc["run"]["runId"]) == ("COMPLETE", run_id)
    validator().validate(doc)


def test_with_kafka_down_a_forked_childs_event_is_journaled_before_emit_returns(broker, tmp_path):
    """What Kafka has not acknowledged when the flush's bound (closeTimeoutS) passes is in the
    journal when emit returns: the next producer on the journal directory sends it."""
    topic, journal = "ol-fork-down", tmp_path / "journal"
    run_id = str(generate_new_uuid())
    _airflow_task({"type": TRANSPORT_TYPE, "topic": topic, "journalDir": str(journal), "closeTimeoutS": 2,
                   "config": {"bootstrap.servers": broker.bootstrap_servers}}, run_id)
    broker.start()
    broker.create_topic(topic, 1)
    with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=journal) as p:
        assert p.flush(30) == 0
        assert p.stats.replayed == 1
    records = read_topic(broker.bootstrap_servers, topic, expected=1, timeout_s=15)
    doc = decode(records[0].value)
    assert (doc["eventType"], doc["run"]["runId"]) == ("COMPLETE", run_id)
    validator().validate(doc)


def test_flush_false_leaves_delivery_to_the_producer(kafka, tmp_cwd, clean_env):
    topic = kafka.new_topic("ol-noflush")
    client = OpenLineageClient(config={"transport": {
        "type": TRANSPORT_TYPE, "topic": topic, "journalDir": str(tmp_cwd / "journal"), "flush": "false",
        "config": {"bootstrap.servers": kafka.bootstrap_servers}}})
    assert client.transport.flush is False
    _emit_start_complete(client, "noflush.job")
    assert client.close(10)
    assert len(read_topic(kafka.bootstrap_servers, topic, expected=2)) == 2
    with pytest.raises(ConfigError, match="transport.flush: must be true or false"):
        LineageRelayConfig.from_dict({"topic": "t", "flush": "sometimes", "config": {"bootstrap.servers": "k:1"}})


def test_local_server_id_in_the_plugins_section_is_the_message_key(kafka, tmp_cwd, clean_env, caplog, monkeypatch):
    """The deprecated ``localServerId`` is read as ``messageKey`` (with a warning) by the
    plugin as by every other source, not refused as an unknown ProducerConfig field."""
    monkeypatch.setattr(readers, "_logged", set())   # logged once per process: as in a fresh one
    caplog.set_level(logging.WARNING, "producer.config")
    topic = kafka.new_topic("ol-lsid")
    client = OpenLineageClient(config={"transport": {
        "type": TRANSPORT_TYPE, "topic": topic, "journalDir": str(tmp_cwd / "journal"), "localServerId": "k1",
        "config": {"bootstrap.servers": kafka.bootstrap_servers}}})
    assert client.transport.producer.config.message_key == "k1"
    assert "event=deprecated_setting key=transport.localServerId" in caplog.text
    _emit_start_complete(client, "lsid.job")
    assert client.close(10)
    assert {r.key for r in read_topic(kafka.bootstrap_servers, topic, expected=2)} == {b"k1"}
    config = LineageRelayConfig.from_dict({"topic": "t", "localServerId": "old", "messageKey": "new",
                                           "config": {"bootstrap.servers": "k:1"}})
    assert config.producer_config.message_key == "new"


def test_events_the_official_client_can_send_are_not_dropped(kafka, tmp_cwd, clean_env):
    """Integers beyond 64 bits and dict keys that are not strings: Serde.to_json (json.dumps)
    writes them, so must we (orjson alone refused them: ``unencodable``)."""
    @attr.define
    class StatsFacet(RunFacet):
        total: int = 0
        histogram: dict = attr.field(factory=dict)

    topic = kafka.new_topic("ol-bigint")
    client = OpenLineageClient(config={"transport": {
        "type": TRANSPORT_TYPE, "topic": topic, "journalDir": str(tmp_cwd / "journal"),
        "config": {"bootstrap.servers": kafka.bootstrap_servers}}})
    for facet in (StatsFacet(total=2**64 + 1), StatsFacet(histogram={1: 3, 2.5: 4})):
        client.emit(event_v2.RunEvent(
            eventType=event_v2.RunState.COMPLETE, eventTime=events.utc_now_iso(), producer=events.PRODUCER_URI,
            run=event_v2.Run(runId=str(generate_new_uuid()), facets={"stats": facet}),
            job=event_v2.Job(namespace="python", name="stats.job")))
    assert client.transport.producer.stats.dropped == {}
    assert client.close(10)
    records = read_topic(kafka.bootstrap_servers, topic, expected=2)
    big, keys = (json.loads(r.value) for r in records)   # json: the exact integer
    assert big["run"]["facets"]["stats"]["total"] == 2**64 + 1
    assert keys["run"]["facets"]["stats"]["histogram"] == {"1": 3, "2.5": 4}
    for doc in (big, keys):
        validator().validate(doc)


def _padded(i: int, pad: int = 3000) -> dict:
    return {"eventType": "START", "eventTime": events.utc_now_iso(), "producer": events.PRODUCER_URI,
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": "01890000-0000-7000-8000-%012d" % i}, "job": {"namespace": "ns", "name": f"job{i}"},
            "pad": "x" * pad}


def _journal_bytes(root) -> int:
    return sum(f.stat().st_size for d in root.iterdir() for f in d.glob("*.seg"))


def test_flushing_emits_during_an_outage_keep_one_journal_within_journal_max_bytes(broker, tmp_path):
    """Each flushing emit journals what Kafka has not acknowledged without closing the
    producer: one producer, one journal, capped by journalMaxBytes (not one journal, each with
    the whole cap, and one more LOCK descriptor, per emit); what does not fit is counted."""
    topic, journal = "ol-outage", tmp_path / "journal"
    transport = LineageRelayTransport(LineageRelayConfig.from_dict({
        "topic": topic, "journalDir": str(journal), "closeTimeoutS": 2, "journalMaxBytes": 65536,
        "config": {"bootstrap.servers": broker.bootstrap_servers}}))
    for i in range(40):
        transport.emit(_padded(i))
    assert len(list(journal.iterdir())) == 1
    assert _journal_bytes(journal) <= 65536
    assert len(open_paths_under([journal])) <= 3      # its LOCK, its segment (not a LOCK per emit)
    producer = transport.producer
    assert producer.settle(0) == 0 and not producer._closed
    s = producer.stats
    assert s.emitted == 40 and s.mode == "journal"
    assert s.journaled + s.dropped.get("journal_full", 0) == 40 and s.dropped.get("journal_full", 0) > 0
    broker.start()
    broker.create_topic(topic, 1)
    assert producer.flush(30) == 0
    assert producer.stats.replayed == s.journaled
    assert transport.close(5)


def test_flushing_emits_keep_every_drop_in_the_producers_stats(broker, tmp_path):
    """The drops counted before a flushing emit journaled (Kafka down) stay in stats."""
    transport = LineageRelayTransport(LineageRelayConfig.from_dict({
        "topic": "ol-stats", "journalDir": str(tmp_path / "journal"), "closeTimeoutS": 2,
        "config": {"bootstrap.servers": broker.bootstrap_servers, "message.max.bytes": "10000"}}))
    transport.emit(_padded(0, pad=20000))      # too_large: dropped, counted
    transport.emit(_padded(1))                 # Kafka down: journaled
    transport.emit(_padded(2))
    s = transport.producer.stats
    assert (s.emitted, s.journaled, s.dropped) == (3, 2, {"too_large": 1})
    transport.close(1)
