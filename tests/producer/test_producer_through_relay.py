"""The producer's output as the relay sees it: OpenLineageClient through our transport, and
Avro- and JSON-encoded events mixed on one topic, all forwarded to a collector."""

from __future__ import annotations

import orjson
import pytest
from openlineage.client import OpenLineageClient, event_v2

from producer import LineageProducer, events
from producer.openlineage_transport import TRANSPORT_TYPE
from relay.embedded.collector import RecordingCollector
from tests.support.relay import RelayThread, relay_config
from tests.support.spec import validator

pytestmark = pytest.mark.kafka


def test_openlineage_client_via_openlineage_yml_reaches_the_collector(kafka, tmp_cwd, monkeypatch):
    for var in ("OPENLINEAGE_URL", "OPENLINEAGE_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    topic, dlq = kafka.new_topic("olc"), kafka.new_topic("dlq")
    config_file = tmp_cwd / "conf" / "openlineage.yml"
    config_file.parent.mkdir()
    config_file.write_text(f"transport:\n  type: {TRANSPORT_TYPE}\n  topicName: {topic}\n"
                           f"  journalDir: {tmp_cwd / 'journal'}\n"
                           f"  properties:\n    bootstrap.servers: {kafka.bootstrap_servers}\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config_file))
    client = OpenLineageClient()
    run_id = events.new_run_id()
    for state in (event_v2.RunState.START, event_v2.RunState.RUNNING, event_v2.RunState.COMPLETE):
        client.emit(event_v2.RunEvent(
            eventType=state, eventTime=events.utc_now_iso(), producer=events.PRODUCER_URI,
            run=event_v2.Run(runId=run_id), job=event_v2.Job(namespace="airflow", name="dag.load_orders"),
            outputs=[event_v2.OutputDataset(namespace="postgres://db:5432", name="shop.public.orders")]))
    assert client.close(10)
    with RecordingCollector() as collector:
        cfg = relay_config(kafka.bootstrap_servers, topic, {"marquez": collector.url}, group=kafka.new_group(), dlq=dlq)
        with RelayThread(cfg):
            assert collector.wait_for(lambda c: c.count == 3, 30)
    got = collector.events()
    assert [e["eventType"] for e in got] == ["START", "RUNNING", "COMPLETE"]
    assert {e["run"]["runId"] for e in got} == {run_id}
    for e in got:
        validator().validate(e)


def test_avro_and_json_on_one_topic_are_both_forwarded(kafka, tmp_path):
    topic, dlq = kafka.new_topic("mixed", partitions=2), kafka.new_topic("dlq")
    sent: list[dict] = []
    for encoding in ("json", "avro", "json", "avro"):
        run_id = events.new_run_id()
        with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, encoding=encoding,
                             journal_dir=str(tmp_path / "journal")) as producer:
            for event_type in ("START", "COMPLETE"):
                event = events.run_event(
                    event_type, run_id=run_id, job_namespace="spark", job_name=f"job.{encoding}",
                    inputs=[events.dataset("s3://lake", "raw/orders", {"schema": events.facet(
                        "SchemaDatasetFacet", {"fields": [{"name": "id", "type": "long"}]})})],
                    run_facets={"processing_engine": events.facet(
                        "ProcessingEngineRunFacet", {"version": "4.3.0", "name": "spark"})})
                producer.emit(event)
                sent.append(event)
            assert producer.flush(20) == 0
    with RecordingCollector() as collector:
        cfg = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(), dlq=dlq)
        with RelayThread(cfg) as relay:
            assert collector.wait_for(lambda c: c.count == len(sent), 30)
            assert relay.metric("lineage_relay_events_dead_lettered_total", reason="undecodable") == 0
    canon = lambda d: orjson.dumps(d, option=orjson.OPT_SORT_KEYS)  # noqa: E731
    assert sorted(map(canon, collector.events())) == sorted(map(canon, sent))
    for e in collector.events():
        validator().validate(e)
        assert e["run"]["facets"]["processing_engine"]["version"] == "4.3.0"
