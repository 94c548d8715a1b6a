"""Benchmark: emit() latency and throughput, ours vs openlineage-python's KafkaTransport.

Starts its own embedded broker (Tansu), sends the same realistic RunEvent through:

* ours: ``LineageProducer.emit(dict)`` (JSON encoding, defaults; Avro is printed too,
  for information);
* the official ``KafkaTransport`` with its default ``flush=True`` (waits for the broker
  on every event), and with ``flush=False``.

Latency is measured around each emit call (perf_counter_ns). Throughput (events/s) is
end to end: the emit loop plus the final flush, so every counted event is acknowledged
by the broker. Usage: ``python bench/producer_emit.py [--events N]``. The last line is
JSON: ours_p50_us, ours_p99_us, ours_eps, official_flush_eps, official_noflush_eps.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from producer import LineageProducer, events  # noqa: E402
from relay.embedded.broker import EmbeddedBroker  # noqa: E402


def _event_dict(run_id: str) -> dict:
    schema = events.facet("SchemaDatasetFacet", {"fields": [
        {"name": "order_id", "type": "bigint"}, {"name": "customer_id", "type": "bigint"},
        {"name": "amount", "type": "decimal(10,2)"}, {"name": "created_at", "type": "timestamp"}]})
    return events.run_event(
        "RUNNING", run_id=run_id, job_namespace="spark://cluster", job_name="etl.orders_daily",
        inputs=[events.dataset("s3://raw-bucket", "orders/2026-11-22", {"schema": schema})],
        outputs=[events.dataset("postgres://db:5432", "public.orders", {"schema": schema})],
        run_facets={"parent": events.parent_facet("airflow", "orders_dag.load", events.new_run_id(),
                                                  root=("airflow", "orders_dag", events.new_run_id()))},
        job_facets={"jobType": events.facet("JobTypeJobFacet", {
            "processingType": "BATCH", "integration": "SPARK", "jobType": "JOB"})},
    )


def _official_event(doc: dict):
    from openlineage.client import event_v2
    from openlineage.client.facet_v2 import job_type_job, parent_run, schema_dataset

    def schema(facet: dict):
        return schema_dataset.SchemaDatasetFacet(fields=[
            schema_dataset.SchemaDatasetFacetFields(name=f["name"], type=f["type"]) for f in facet["fields"]])

    parent = doc["run"]["facets"]["parent"]
    return event_v2.RunEvent(
        eventType=event_v2.RunState.RUNNING, eventTime=doc["eventTime"], producer=doc["producer"],
        run=event_v2.Run(runId=doc["run"]["runId"], facets={"parent": parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent["run"]["runId"]),
            job=parent_run.Job(namespace=parent["job"]["namespace"], name=parent["job"]["name"]),
            root=parent_run.Root(run=parent_run.RootRun(runId=parent["root"]["run"]["runId"]),
                                 job=parent_run.RootJob(namespace="airflow", name="orders_dag")))}),
        job=event_v2.Job(namespace=doc["job"]["namespace"], name=doc["job"]["name"], facets={
            "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration="SPARK", jobType="JOB")}),
        inputs=[event_v2.InputDataset(namespace=d["namespace"], name=d["name"],
                                      facets={"schema": schema(d["facets"]["schema"])}) for d in doc["inputs"]],
        outputs=[event_v2.OutputDataset(namespace=d["namespace"], name=d["name"],
                                        facets={"schema": schema(d["facets"]["schema"])}) for d in doc["outputs"]],
    )


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000.0


def _timed(emit, payloads, flush) -> tuple[list[int], float]:
    lat = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for payload in payloads:
        t0 = clock()
        emit(payload)
        lat.append(clock() - t0)
    flush()
    return sorted(lat), time.perf_counter() - start


def bench_ours(bootstrap: str, topic: str, n: int, encoding: str = "json") -> dict:
    docs = [_event_dict(events.new_run_id()) for _ in range(n)]
    with tempfile.TemporaryDirectory() as journal, \
            LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal,
                            encoding=encoding) as p:
        for doc in docs[:1000]:
            p.emit(doc)
        p.flush(30)
        lat, elapsed = _timed(p.emit, docs, lambda: p.flush(60))
        stats = p.stats
    assert stats.errors == 0 and stats.pending == 0, stats
    return {"p50_us": _percentile(lat, 0.50), "p99_us": _percentile(lat, 0.99),
            "p999_us": _percentile(lat, 0.999), "eps": n / elapsed,
            "emit_only_eps": n / (sum(lat) / 1e9), "journaled": stats.journaled}


def bench_official(bootstrap: str, topic: str, n: int, flush: bool) -> dict:
    from openlineage.client.transport.kafka import KafkaConfig, KafkaTransport

    transport = KafkaTransport(KafkaConfig.from_dict({
        "config": {"bootstrap.servers": bootstrap}, "topic": topic, "flush": flush}))
    objs = [_official_event(_event_dict(events.new_run_id())) for _ in range(n)]
    for obj in objs[:100]:
        transport.emit(obj)
    transport.wait_for_completion(30)
    lat, elapsed = _timed(transport.emit, objs, lambda: transport.wait_for_completion(60))
    transport.close(10)
    return {"p50_us": _percentile(lat, 0.50), "p99_us": _percentile(lat, 0.99), "eps": n / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events for ours")
    parser.add_argument("--flush-events", type=int, default=2_000, help="events for official flush=True")
    parser.add_argument("--noflush-events", type=int, default=20_000, help="events for official flush=False")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("openlineage").setLevel(logging.CRITICAL)
    with EmbeddedBroker() as broker:
        for topic in ("bench-ours", "bench-ours-avro", "bench-official-flush", "bench-official-noflush"):
            broker.create_topic(topic, 3)
        ours = bench_ours(broker.bootstrap_servers, "bench-ours", args.events)
        print(f"ours: {json.dumps({k: round(v, 2) for k, v in ours.items()})}", flush=True)
        avro = bench_ours(broker.bootstrap_servers, "bench-ours-avro", args.noflush_events, "avro")
        print(f"ours, encoding=avro: {json.dumps({k: round(v, 2) for k, v in avro.items()})}", flush=True)
        flushed = bench_official(broker.bootstrap_servers, "bench-official-flush", args.flush_events, True)
        print(f"official flush=True: {json.dumps({k: round(v, 2) for k, v in flushed.items()})}", flush=True)
        unflushed = bench_official(broker.bootstrap_servers, "bench-official-noflush",
                                   args.noflush_events, False)
        print(f"official flush=False: {json.dumps({k: round(v, 2) for k, v in unflushed.items()})}", flush=True)
    print(f"p99 target (<100 us): {'met' if ours['p99_us'] < 100 else 'MISSED'}; "
          f"throughput vs official default: {ours['eps'] / flushed['eps']:.1f}x (target 10x)")
    print(json.dumps({
        "ours_p50_us": round(ours["p50_us"], 2), "ours_p99_us": round(ours["p99_us"], 2),
        "ours_eps": round(ours["eps"]), "official_flush_eps": round(flushed["eps"]),
        "official_noflush_eps": round(unflushed["eps"]),
    }))


if __name__ == "__main__":
    main()
