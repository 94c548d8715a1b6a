"""``lineage-relay demo``: the whole path on one machine, no setup by hand.

Starts an embedded Kafka-protocol broker (Tansu), a local collector that records what it
receives, and the relay between them; then a sample PySpark pipeline (or, with
``--no-spark``, a synthetic Spark-like stream with duplicates and out-of-order events)
emits lineage through the producer. Prints what the collector received, per run, and
writes every received event to ``demo-output/received.jsonl``, the lineage they describe to
``demo-output/lineage.sqlite`` (fresh each run) and its picture to ``demo-output/lineage.html``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES, BrokerUnavailable, EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.event_rows import qualified_name
from relay.embedded.graph import example_query, render_graph_html
from relay.embedded.runner import RelayThread
from relay.embedded.store import LineageStore
from relay.kafka_log import with_log

TOPIC = "openlineage"
DLQ = "openlineage.dlq"
OUT = Path("demo-output")


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: timed out waiting for {what}")
        time.sleep(0.05)


def _synthetic(bootstrap: str, runs: int) -> int:
    from confluent_kafka import Producer

    from relay.embedded.sample import sample_stream

    stream = sample_stream(runs, seed=42, duplicate_ratio=0.15, out_of_order_ratio=0.2)
    producer = Producer(with_log({"bootstrap.servers": bootstrap, "enable.idempotence": True}))
    for key, value in stream:
        producer.produce(TOPIC, key=key, value=value)
    producer.flush(30)
    print(f"sent {len(stream)} Spark-like events for {runs} runs (15% duplicates, 20% of runs COMPLETE-before-START)")
    return len(stream)


def _spark(bootstrap: str, workdir: Path) -> int:
    from producer.spark.demo import run_demo_pipeline

    return run_demo_pipeline(bootstrap_servers=bootstrap, topic=TOPIC, workdir=workdir)


def summarize(events: list[dict[str, Any]]) -> list[str]:
    runs: dict[str, dict[str, Any]] = defaultdict(lambda: {"types": [], "inputs": set(), "outputs": set()})
    for e in events:
        if "run" not in e:
            continue
        r = runs[e["run"]["runId"]]
        r["job"] = f'{e["job"]["namespace"]}/{e["job"]["name"]}'
        r["types"].append(e.get("eventType", "-"))
        r["inputs"].update(qualified_name(d["namespace"], d["name"]) for d in e.get("inputs", []))
        r["outputs"].update(qualified_name(d["namespace"], d["name"]) for d in e.get("outputs", []))
    lines = []
    for run_id, r in runs.items():
        # UUIDv7 ids share their leading (time) digits: the tail tells runs apart.
        lines.append(f'  {r["job"]}  run …{run_id[-8:]}  {" -> ".join(r["types"])}')
        for name in sorted(r["inputs"]):
            lines.append(f"      in : {name}")
        for name in sorted(r["outputs"]):
            lines.append(f"      out: {name}")
    return lines


def run_demo(*, runs: int = 12, spark: bool = True) -> int:
    """Raises :class:`BrokerUnavailable` naming the missing part (the broker's wheel,
    PySpark) before anything starts."""
    if spark:
        try:
            import pyspark  # noqa: F401
        except ImportError as err:
            raise BrokerUnavailable("the PySpark demo needs PySpark (and Java 17): pip install "
                                    "'lineage-relay[spark]', or run `lineage-relay demo --no-spark`") from err
    OUT.mkdir(exist_ok=True)
    (OUT / "lineage.sqlite").unlink(missing_ok=True)  # the picture shows this run only
    store = LineageStore(OUT / "lineage.sqlite")
    with EmbeddedBroker(log_path=OUT / "broker.log") as broker, RecordingCollector(store=store) as collector:
        broker.create_topic(TOPIC, partitions=3)
        print(f"broker    : Tansu on {broker.bootstrap_servers}")
        print(f"collector : {collector.url}/api/v1/lineage (records what it receives)")
        config = build_config({
            "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topics": [TOPIC], "dlq_topic": DLQ,
                      "group_id": "lineage-relay-demo", "consumer_properties": dict(FAST_GROUP_PROPERTIES)},
            "collectors": [{"name": "local", "url": collector.url}],
            "pipeline": {"ordering": {"hold_timeout_s": 10, "terminal_grace_s": 1}},
            "http": {"port": None},
        })
        runner = RelayThread(config).start()
        try:
            relay = runner.relay
            print("relay     : consuming", TOPIC, "->", "local")
            sent = _spark(broker.bootstrap_servers, OUT / "spark") if spark else _synthetic(
                broker.bootstrap_servers, runs)
            _wait(lambda: relay.metrics.consumed._value.get() >= sent and relay.tracker.outstanding() == 0
                  and all(lane.pending == 0 and lane.held == 0 for lane in relay.lanes), 120,
                  "the relay to settle every event")
        finally:
            runner.stop()
        events = collector.events()
        m = relay.metrics.registry
        dedup = m.get_sample_value("lineage_relay_events_deduplicated_total", {"collector": "local"}) or 0
        dropped = sum(s.value for metric in m.collect() if metric.name == "lineage_relay_events_dropped"
                      for s in metric.samples if s.name.endswith("_total"))
        dead = sum(s.value for metric in m.collect() if metric.name == "lineage_relay_events_dead_lettered"
                   for s in metric.samples if s.name.endswith("_total"))
    with open(OUT / "received.jsonl", "wb") as f:
        for e in events:
            f.write(orjson.dumps(e) + b"\n")
    print()
    print(f"the collector received {len(events)} events (consumed {sent}; {int(dedup)} duplicates not forwarded, "
          f"{int(dropped)} after-terminal events dropped, {int(dead)} dead-lettered):")
    print("\n".join(summarize(events)))
    print(f"\nevery received event: {OUT / 'received.jsonl'}")
    (OUT / "lineage.html").write_text(render_graph_html(store, title="lineage-relay demo"), encoding="utf-8")
    query = example_query(store)
    store.close()
    print(f"lineage graph: {OUT / 'lineage.html'} (open it in a browser; its data: {OUT / 'lineage.sqlite'})")
    if query:
        print(f"ask from a shell: lineage-relay graph --upstream {query}")
    return 0
