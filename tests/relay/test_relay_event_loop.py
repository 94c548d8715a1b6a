"""``lineage-relay run`` on each event loop (``--event-loop uvloop``, ``asyncio``): it
delivers end to end, serves /metrics, names its loop in the start-up line, drains on SIGTERM
and exits 0; with ``workers`` the supervisor and every worker run on the loop set."""

from __future__ import annotations

import orjson
import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.relay.test_event_loop import needs_uvloop
from tests.relay.test_workers import canonical, close_group, log_lines
from tests.support.kafka import committed_offsets, produce, read_to_end
from tests.support.relay import RelayProcess, eventually

pytestmark = pytest.mark.kafka


def relay_args(kafka, topic, dlq, group, collector, loop, *extra):
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic, "--group-id", group,
            "--dlq-topic", dlq, "--collector", f"a={collector.url}", "--event-loop", loop, *extra]
    for k, v in kafka.consumer_properties().items():
        args += ["--consumer-property", f"{k}={v}"]
    return args


@pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_the_relay_delivers_serves_metrics_and_drains_on_the_loop_set(kafka, tmp_path, loop):
    topic, dlq, group = kafka.new_topic(f"loop-{loop}", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(200, seed=31)
    produce(kafka.bootstrap_servers, topic, stream)
    position = {canonical(orjson.loads(r.value)): (r.partition, r.offset)
                for r in read_to_end(kafka.bootstrap_servers, topic)}
    log_path = tmp_path / "relay.log"
    # 0.5 s an answer, 32 requests at once (a collector's default concurrency): the stream
    # takes ~3 s to deliver, so the SIGTERM after the first answers finds most in flight.
    with RecordingCollector(latency_s=0.5) as collector:
        proc = RelayProcess(relay_args(kafka, topic, dlq, group, collector, loop), log_path=log_path).start()
        try:
            assert collector.wait_for(lambda c: c.count >= 1, 60)
            forwarded = 'lineage_relay_events_forwarded_total{collector="a"}'
            assert eventually(lambda: forwarded in proc.metrics_text(), 10), proc.metrics_text()[-2000:]
            # Stopped with deliveries in flight: it drains, commits and exits 0.
            assert proc.terminate(30) == 0
        finally:
            proc.close()
        delivered = {canonical(e) for e in collector.events()}
    committed = committed_offsets(kafka.bootstrap_servers, topic, group, 2)
    assert sum(max(0, o) for o in committed.values()) > 0, committed
    # Every event below a committed offset reached the collector.
    assert {e for e, (p, o) in position.items() if o < committed[p]} <= delivered
    events = [e["event"] for e in log_lines(log_path)]
    assert "relay_stopped" in events and "relay_failed" not in events, events
    [draining] = [e for e in log_lines(log_path) if e["event"] == "relay_draining"]
    assert draining["pending"] > 0, draining
    [started] = [e for e in log_lines(log_path) if e["event"] == "relay_started"]
    assert started["event_loop"] == loop


@pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_the_supervisor_and_its_workers_run_on_the_loop_set(kafka, tmp_path, loop):
    topic, dlq, group = kafka.new_topic(f"loop-workers-{loop}", partitions=2), kafka.new_topic("dlq"), \
        kafka.new_group()
    stream = sample_stream(40, seed=32)
    unique = {canonical(orjson.loads(v)) for _, v in stream}
    produce(kafka.bootstrap_servers, topic, stream)
    log_path = tmp_path / "relay.log"
    with RecordingCollector() as collector:
        proc = RelayProcess(relay_args(kafka, topic, dlq, group, collector, loop, "--workers", "2"),
                            log_path=log_path, own_group=True).start()
        try:
            assert collector.wait_for(lambda c: {canonical(e) for e in c.events()} >= unique, 60)
            assert eventually(lambda: sum('"relay_started"' in line
                                          for line in log_path.read_text().splitlines()) == 2, 30)
            assert proc.terminate(40) == 0
        finally:
            close_group(proc)
    events = log_lines(log_path)
    [supervisor] = [e for e in events if e["event"] == "workers_started"]
    assert supervisor["event_loop"] == loop
    started = [e for e in events if e["event"] == "relay_started"]
    assert sorted(e["worker"] for e in started) == [0, 1]
    assert {e["event_loop"] for e in started} == {loop}
