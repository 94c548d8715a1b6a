"""OpenLineageClient configured only by openlineage.yml delivers through our producer."""

from __future__ import annotations

import pytest
from openlineage.client import OpenLineageClient, event_v2
from openlineage.client.facet_v2 import parent_run
from openlineage.client.uuid import generate_new_uuid

from producer import events
from producer.errors import ConfigError
from producer.openlineage_transport import TRANSPORT_TYPE, LineageRelayTransport
from tests.producer.support import decode
from tests.support.kafka import read_topic
from tests.support.spec import validator

pytestmark = pytest.mark.kafka


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("OPENLINEAGE_CONFIG", "OPENLINEAGE_URL", "OPENLINEAGE_DISABLED"):
        monkeypatch.delenv(var, raising=False)


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
