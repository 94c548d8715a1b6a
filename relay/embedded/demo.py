"""``lineage-relay demo``: the whole path on one machine, no setup by hand.

Starts an embedded Kafka-protocol broker (Tansu), a local collector that records what it
receives, and the relay between them; then a sample PySpark pipeline (or, with
``--no-spark``, a synthetic Spark-like stream with duplicates and out-of-order events)
emits lineage through the producer. Prints what the collector received, per run, and
writes every received event to ``demo-output/received.jsonl``, the lineage they describe to
``demo-output/lineage.sqlite`` (fresh each run) and its picture to ``demo-output/lineage.html``.

Then it checks what the collector received against what was sent (see
:mod:`relay.embedded.delivery_check`): every run's START first and exactly one terminal
event, every distinct event there or counted as dropped or dead-lettered, the broker still
up and no delivery aborted. Anything else is printed, and the demo returns 1. One demo
at a time per directory (:mod:`relay.embedded.output_lock`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES, BrokerUnavailable, EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.delivery_check import DeliveryReport, check_delivery
from relay.embedded.event_rows import qualified_name
from relay.embedded.graph import example_query, render_graph_html
from relay.embedded.output_lock import hold_output_dir
from relay.embedded.runner import RelayThread
from relay.embedded.store import LineageStore
from relay.kafka_log import with_log
from relay.logs import TextFormatter

TOPIC = "openlineage"
DLQ = "openlineage.dlq"
OUT = Path("demo-output")
#: What one demo rewrites: removed first, so that a demo that fails leaves none of an earlier one's.
OUTPUTS = ("lineage.sqlite", "lineage.html", "received.jsonl")
#: After the relay has settled, how long the collector may still take to have everything
#: (the relay settles on what it consumed: a record read twice counts twice).
SETTLED_GRACE_S = 15.0


def _wait(condition, timeout_s: float, what: str | None) -> None:
    """Until ``condition()``; after ``timeout_s``, TimeoutError naming ``what`` (or, with
    ``what`` None, return)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            if what is None:
                return
            raise TimeoutError(f"demo: timed out waiting for {what}")
        time.sleep(0.05)


class DemoLog(logging.Handler):
    """The relay's log lines on stderr, readable (warnings and worse: the demo's own output
    is on stdout); remembers which events were logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(TextFormatter())
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.add(record.getMessage())
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - as logging.Handler does: a log line never breaks the demo
            self.handleError(record)

    def __enter__(self) -> DemoLog:
        root = logging.getLogger()
        self._before = root.handlers[:], root.level
        root.handlers[:] = [self]
        root.setLevel(logging.WARNING)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.handlers[:], level = self._before
        root.setLevel(level)


def _synthetic(bootstrap: str, runs: int, sent: list[dict[str, Any]]) -> int:
    from confluent_kafka import Producer

    from relay.embedded.sample import sample_stream

    stream = sample_stream(runs, seed=42, duplicate_ratio=0.15, out_of_order_ratio=0.2)
    producer = Producer(with_log({"bootstrap.servers": bootstrap, "enable.idempotence": True}))
    for key, value in stream:
        sent.append(orjson.loads(value))
        producer.produce(TOPIC, key=key, value=value)
    producer.flush(30)
    print(f"sent {len(stream)} Spark-like events for {runs} runs (15% duplicates, 20% of runs COMPLETE-before-START)")
    return len(stream)


def _spark(bootstrap: str, workdir: Path, sent: list[dict[str, Any]]) -> int:
    from producer.spark.demo import run_demo_pipeline

    return run_demo_pipeline(bootstrap_servers=bootstrap, topic=TOPIC, workdir=workdir, sent=sent)


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
    """0 when the collector received what was sent (see the module docstring), else 1 with
    what is missing on stderr. Raises :class:`BrokerUnavailable` naming the missing part
    (the broker's wheel, PySpark) before anything starts, :class:`DemoBusy` when another
    demo uses ``demo-output/``, TimeoutError when the relay never settles."""
    if spark:
        try:
            import pyspark  # noqa: F401
        except ImportError as err:
            raise BrokerUnavailable("the PySpark demo needs PySpark (and Java 17): pip install "
                                    "'lineage-relay[spark]', or run `lineage-relay demo --no-spark`") from err
    OUT.mkdir(exist_ok=True)
    with hold_output_dir(OUT), DemoLog() as log:
        for name in OUTPUTS:  # the picture shows this run only
            (OUT / name).unlink(missing_ok=True)
        return _run(runs, spark, log)


def _run(runs: int, spark: bool, log: DemoLog) -> int:
    store = LineageStore(OUT / "lineage.sqlite")
    sent: list[dict[str, Any]] = []
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
            count = _spark(broker.bootstrap_servers, OUT / "spark", sent) if spark else _synthetic(
                broker.bootstrap_servers, runs, sent)

            def not_forwarded() -> int:
                return _dropped(relay.metrics.registry) + _dead_lettered(relay.metrics.registry)

            def broken() -> bool:
                return not broker.running or any(event.endswith("_deliveries_aborted") for event in log.seen)

            _wait(lambda: broken() or (relay.metrics.consumed._value.get() >= count and relay.tracker.outstanding() == 0
                                       and all(lane.pending == 0 and lane.held == 0 for lane in relay.lanes)), 120,
                  "the relay to settle every event")
            _wait(lambda: broken() or check_delivery(sent, collector.events(), not_forwarded=not_forwarded()).ok,
                  SETTLED_GRACE_S, None)
            broker_stopped = not broker.running
        finally:
            runner.stop()
        events = collector.events()
        m = relay.metrics.registry
        dedup = m.get_sample_value("lineage_relay_events_deduplicated_total", {"collector": "local"}) or 0
        dropped, dead = _dropped(m), _dead_lettered(m)
    report = check_delivery(sent, events, not_forwarded=dropped + dead)
    with open(OUT / "received.jsonl", "wb") as f:
        for e in events:
            f.write(orjson.dumps(e) + b"\n")
    print()
    print(f"the collector received {len(events)} events (consumed {count}; {int(dedup)} duplicates not forwarded, "
          f"{int(dropped)} after-terminal events dropped, {int(dead)} dead-lettered):")
    print("\n".join(summarize(events)))
    for note in report.notes():
        print(note)
    print(f"\nevery received event: {OUT / 'received.jsonl'}")
    (OUT / "lineage.html").write_text(render_graph_html(store, title="lineage-relay demo"), encoding="utf-8")
    query = example_query(store)
    store.close()
    print(f"lineage graph: {OUT / 'lineage.html'} (open it in a browser; its data: {OUT / 'lineage.sqlite'})")
    if query:
        print(f"ask from a shell: lineage-relay graph --upstream {query}")
    problems = _problems(report, broker_stopped, sorted(e for e in log.seen if e.endswith("_deliveries_aborted")))
    if problems:
        print("\nlineage-relay demo: FAILED: the collector did not get what was sent:", file=sys.stderr)
        for line in problems:
            print(f"  - {line}", file=sys.stderr)
        print(f"  (the relay's warnings are above; the broker's log: {OUT / 'broker.log'})", file=sys.stderr)
        return 1
    print(f"\ncheck: {report.verdict()}")
    return 0


def _problems(report: DeliveryReport, broker_stopped: bool, aborted: list[str]) -> list[str]:
    lines = []
    if broker_stopped:
        lines.append("the embedded broker stopped during the demo")
    if aborted:
        lines.append(f"the relay aborted deliveries ({', '.join(aborted)})")
    return lines + report.problems()


def _dropped(registry: Any) -> int:
    return int(sum(s.value for metric in registry.collect() if metric.name == "lineage_relay_events_dropped"
                   for s in metric.samples if s.name.endswith("_total")))


def _dead_lettered(registry: Any) -> int:
    return int(sum(s.value for metric in registry.collect() if metric.name == "lineage_relay_events_dead_lettered"
                   for s in metric.samples if s.name.endswith("_total")))
