"""OpenLineageClient configured only by openlineage.yml delivers through our producer."""

from __future__ import annotations

import logging
import os

import pytest
from openlineage.client import OpenLineageClient, event_v2
from openlineage.client.facet_v2 import parent_run
from openlineage.client.uuid import generate_new_uuid

from producer import events, readers
from producer.errors import ConfigError
from producer.openlineage_transport import TRANSPORT_TYPE, LineageRelayTransport
from tests.producer.support import decode
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
