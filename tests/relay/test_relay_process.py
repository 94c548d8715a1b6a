"""The relay as a real process: crash (kill -9) and graceful stop (SIGTERM, Ctrl-C)."""

from __future__ import annotations

import json
from collections import Counter

import confluent_kafka
import orjson
import pytest
import requests

from relay import __version__
from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, produce, read_to_end
from tests.support.relay import RelayProcess, eventually

pytestmark = pytest.mark.kafka


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def relay_args(kafka, topic, dlq, group, collector, drain_s=10):
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic, "--group-id", group,
            "--dlq-topic", dlq, "--collector", f"a={collector.url}"]
    for k, v in kafka.consumer_properties().items():
        args += ["--consumer-property", f"{k}={v}"]
    return args


def test_kill_9_mid_stream_then_restart_delivers_everything(kafka, tmp_path):
    topic, dlq, group = kafka.new_topic("crash", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(300, seed=21)
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    assert len(unique) == len(stream)
    produce(kafka.bootstrap_servers, topic, stream)
    # Where each event is: (partition, offset).
    position = {canonical(orjson.loads(r.value)): (r.partition, r.offset)
                for r in read_to_end(kafka.bootstrap_servers, topic)}
    assert set(position) == unique
    # A collector with some latency so that deliveries are in flight when the relay dies.
    with RecordingCollector(latency_s=0.004) as collector:
        first = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r1.log").start()
        try:
            assert collector.wait_for(lambda c: c.count >= len(stream) // 3, 60)
            first.kill9()
        finally:
            first.close()
        # Requests the collector had already received when the relay died still complete.
        assert collector.wait_for(lambda c: c.in_flight == 0, 10)
        committed = committed_offsets(kafka.bootstrap_servers, topic, group, 2)
        assert collector.count < len(stream), "the relay finished before it was killed: no crash tested"
        second = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r2.log").start()
        try:
            assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= unique, 90)
        finally:
            assert second.terminate(30) == 0
    counts = Counter(canonical(e) for e in collector.events())
    # Only what was delivered but not yet committed at the crash may arrive twice (once
    # before it, once after): an event at or past its partition's committed offset. (Not a
    # count taken after the kill: requests still in the collector's socket buffer then are
    # handled later, and the events they carry may arrive again.)
    twice = {event: position[event] for event, n in counts.items() if n > 1}
    assert max(counts.values()) <= 2, counts.most_common(3)
    redelivered_committed = {event: (p, o) for event, (p, o) in twice.items() if o < max(0, committed[p])}
    assert not redelivered_committed, \
        (len(redelivered_committed), committed, sorted(redelivered_committed.values())[:5])


def test_sigterm_drains_commits_and_restart_redelivers_nothing(kafka, tmp_path):
    topic, dlq, group = kafka.new_topic("term", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(150, seed=22)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector(latency_s=0.002) as collector:
        first = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r1.log").start()
        try:
            assert collector.wait_for(lambda c: c.count >= len(stream) // 2, 60)
            # Stop while deliveries are still running: it must drain and exit 0 in time.
            assert first.terminate(timeout_s=15) == 0
        finally:
            first.close()
        delivered_first = collector.count
        log = (tmp_path / "r1.log").read_text()
        assert '"relay_stopped"' in log
        second_batch = sample_stream(20, seed=23)
        produce(kafka.bootstrap_servers, topic, second_batch)
        second = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "r2.log").start()
        try:
            expected = {canonical(orjson.loads(v)) for _, v in stream + second_batch}
            assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= expected, 60)
        finally:
            assert second.terminate(30) == 0
    counts = Counter(canonical(e) for e in collector.events())
    first_part = collector.events()[:delivered_first]
    redelivered = [e for e in first_part if counts[canonical(e)] > 1]
    assert redelivered == [], f"{len(redelivered)} acknowledged events were delivered again after restart"


def test_endpoints_metrics_and_logs_never_show_the_token(kafka, tmp_path, monkeypatch):
    topic, dlq, group = kafka.new_topic("ops"), kafka.new_topic("dlq"), kafka.new_group()
    token = "tok-9f8e7d6c5b4a"
    monkeypatch.setenv("COLLECTOR_TOKEN", token)
    stream = sample_stream(5, seed=3)
    produce(kafka.bootstrap_servers, topic, stream + [(b"bad", b"not json")])
    with RecordingCollector(token=token) as collector:
        config = tmp_path / "relay.yaml"
        config.write_text(
            "kafka:\n"
            f"  bootstrap_servers: {kafka.bootstrap_servers}\n  topics: [{topic}]\n  group_id: {group}\n"
            f"  dlq_topic: {dlq}\n  consumer_properties: {{session.timeout.ms: 6000, heartbeat.interval.ms: 500}}\n"
            "collectors:\n"
            f"  - name: marquez\n    url: {collector.url}\n    token: ${{COLLECTOR_TOKEN}}\n")
        proc = RelayProcess(["--config", str(config), "--log-level", "debug"], log_path=tmp_path / "relay.log")
        proc.start()
        try:
            assert collector.wait_for(lambda c: c.count == len(stream), 30)
            base = f"http://127.0.0.1:{proc.http_port}"
            assert requests.get(base + "/healthz", timeout=5).json() == {"status": "ok"}
            assert requests.get(base + "/readyz", timeout=5).status_code == 200
            # The collector keeps an event before it answers; the relay counts it once it read the answer.
            wanted = ['lineage_relay_events_dead_lettered_total{reason="invalid_json"} 1.0',
                      f'lineage_relay_events_forwarded_total{{collector="marquez"}} {float(len(stream))}']
            assert eventually(lambda: all(line in proc.metrics_text() for line in wanted), 20), proc.metrics_text()
            metrics = proc.metrics_text()
            assert "lineage_relay_delivery_latency_seconds_bucket" in metrics
        finally:
            assert proc.terminate(30) == 0
    log = (tmp_path / "relay.log").read_text()
    assert token not in metrics and token not in log
    lines = [json.loads(line) for line in log.splitlines()]  # every line is a JSON event
    assert lines and all({"ts", "level", "event"} <= set(line) for line in lines)
    assert any(line["event"] == "dead_lettered" and line["reason"] == "invalid_json" for line in lines)
    [started] = [line for line in lines if line["event"] == "relay_started"]
    assert started["version"] == __version__ and started["librdkafka"] == confluent_kafka.libversion()[0]


def test_librdkafka_lines_are_json_log_events_too(tmp_path):
    # librdkafka writes its own lines (here: the broker went away) to stderr unless given
    # a logger: they must come out as the relay's JSON events, not between them.
    broker = EmbeddedBroker().start()
    try:
        broker.create_topic("events", 1)
        with RecordingCollector() as collector:
            args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", "events", "--group-id", "g",
                    "--dlq-topic", "dlq", "--collector", f"a={collector.url}"]
            for k, v in FAST_GROUP_PROPERTIES.items():
                args += ["--consumer-property", f"{k}={v}"]
            proc = RelayProcess(args, log_path=tmp_path / "relay.log").start()
            try:
                assert eventually(lambda: '"partitions_assigned"' in (tmp_path / "relay.log").read_text(), 30)
                broker.stop()
                assert eventually(lambda: '"librdkafka"' in (tmp_path / "relay.log").read_text(), 30), \
                    (tmp_path / "relay.log").read_text()[-2000:]
                assert proc.terminate(60) == 0
            finally:
                proc.close()
    finally:
        broker.stop()
    text = (tmp_path / "relay.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line, or this raises
    kafka_lines = [line for line in lines if line["event"] == "librdkafka"]
    assert kafka_lines and all({"facility", "client", "message"} <= set(line) for line in kafka_lines)
    assert any("127.0.0.1" in line["message"] for line in kafka_lines)
    assert any(line["client"].startswith("lineage-relay#consumer") for line in kafka_lines)
    assert "|FAIL|" not in text  # librdkafka's own format


def test_ctrl_c_stops_cleanly_in_json_lines_without_a_decoder_failure(kafka, tmp_path):
    """Ctrl-C sends SIGINT to the whole process group, the decode processes included: one
    died with a plain-text KeyboardInterrupt traceback amid the JSON lines, and the relay,
    still draining, logged decode_worker_failed (exit_code -9) on a clean stop. The relay
    owns the stop: it exits 0, as on SIGTERM."""
    topic, dlq, group = kafka.new_topic("ctrl-c"), kafka.new_topic("dlq"), kafka.new_group()
    produce(kafka.bootstrap_servers, topic, sample_stream(20, seed=5))
    with RecordingCollector() as collector:
        proc = RelayProcess(relay_args(kafka, topic, dlq, group, collector), log_path=tmp_path / "relay.log",
                            own_group=True).start()
        try:
            assert collector.wait_for(lambda c: c.count >= 20, 30)  # the decode process has decoded them
            code = proc.interrupt(30)
        finally:
            proc.close()
    text = (tmp_path / "relay.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is JSON, or this raises
    events = [line["event"] for line in lines]
    assert code == 0, text[-2000:]
    assert "decode_worker_failed" not in events, text[-2000:]
    assert "relay_stopped" in events, events
