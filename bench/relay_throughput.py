"""Relay throughput against a local collector, with two baselines from the same run.

1. post ceiling: aiohttp POSTing the same pre-serialised events to the same collector,
   with the relay's concurrency, and nothing else to do (the best any relay could do);
2. relay: `Relay` consuming the events from a real Kafka-protocol broker (embedded Tansu)
   and delivering them (decode, validate, dedupe, ordering, commit included);
3. naive: the hand-rolled loop people write: consume one record, `requests` POST it.

The collector runs in its own process. Figures are events/s from the first delivery to
the last, so consumer-group join time is not counted. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import requests
from confluent_kafka import Consumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.app import Relay, tune_gc  # noqa: E402
from relay.config import build_config  # noqa: E402
from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker, free_port  # noqa: E402
from relay.embedded.sample import sample_stream  # noqa: E402
from tests.support.kafka import produce  # noqa: E402

CONCURRENCY = 32


class CollectorProcess:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "relay.embedded.collector", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.count()
                return
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError("collector did not start")

    def count(self) -> int:
        return requests.get(self.url + "/stats", timeout=2).json()["count"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def post_ceiling(url: str, bodies: list[bytes]) -> float:
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as session:
        it = iter(bodies)

        async def worker() -> None:
            for body in it:
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    assert resp.status == 201, resp.status

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return len(bodies) / (time.perf_counter() - start)


def relay_eps(bootstrap: str, topic: str, collector: CollectorProcess, n: int) -> float:
    base = collector.count()
    config = build_config({
        "kafka": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": f"bench-relay-{time.time_ns()}",
                  "dlq_topic": topic + ".dlq", "consumer_properties": dict(FAST_GROUP_PROPERTIES)},
        "collectors": [{"name": "local", "url": collector.url, "concurrency": CONCURRENCY}],
        "http": {"port": None},
    })

    tune_gc()  # as `lineage-relay run` does

    async def main() -> tuple[float, float]:
        relay = Relay(config)
        task = asyncio.create_task(relay.run())
        forwarded = relay.metrics.forwarded.labels(collector="local")
        first = None
        deadline = time.monotonic() + 300
        # The relay's own acknowledged-delivery counter: no extra HTTP traffic during the run.
        while forwarded._value.get() < n:
            if time.monotonic() > deadline or task.done():
                raise RuntimeError(f"relay delivered {forwarded._value.get()} of {n}")
            if first is None and forwarded._value.get() > 0:
                first = time.monotonic()
            await asyncio.sleep(0.005)
        last = time.monotonic()
        relay.request_stop()
        await task
        return first, last

    first, last = asyncio.run(main())
    delivered = collector.count() - base
    if delivered < n:
        raise RuntimeError(f"collector received {delivered} of {n}")
    return (n - 1) / (last - first)


def naive_eps(bootstrap: str, topic: str, url: str, n: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"naive-{time.time_ns()}",
                         "auto.offset.reset": "earliest", **FAST_GROUP_PROPERTIES})
    consumer.subscribe([topic])
    session = requests.Session()
    done = 0
    start = None
    try:
        while done < n:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            session.post(url, data=msg.value(), headers={"Content-Type": "application/json"}).raise_for_status()
            done += 1
    finally:
        consumer.close()
    return (n - 1) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--naive-events", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3, help="ceiling/relay pairs, alternated; medians reported")
    args = parser.parse_args()

    runs = max(1, args.events // 4)
    stream = sample_stream(runs, seed=1, running_per_run=(1, 3))[: args.events]
    n = len(stream)
    avg = sum(len(v) for _, v in stream) / n
    print(f"events: {n}, average size {avg:.0f} bytes, concurrency {CONCURRENCY}, cpus {os.cpu_count()}")
    with EmbeddedBroker() as broker:
        topic = "bench-openlineage"
        broker.create_topic(topic, partitions=4)
        produce(broker.bootstrap_servers, topic, stream)
        collector = CollectorProcess()
        try:
            target = collector.url + "/api/v1/lineage"
            # This machine's speed drifts; alternating the two and taking medians keeps
            # the ratio honest.
            ceilings, relays = [], []
            for r in range(args.rounds):
                ceilings.append(asyncio.run(post_ceiling(target, [v for _, v in stream])))
                relays.append(relay_eps(broker.bootstrap_servers, topic, collector, n))
                print(f"round {r + 1}: post ceiling {ceilings[-1]:,.0f} events/s, relay {relays[-1]:,.0f} events/s")
            ceiling, relay = statistics.median(ceilings), statistics.median(relays)
            print(f"post ceiling: {ceiling:,.0f} events/s (median)")
            print(f"relay:        {relay:,.0f} events/s (median)")
            naive = naive_eps(broker.bootstrap_servers, topic, target, min(n, args.naive_events))
            print(f"naive loop:   {naive:,.0f} events/s")
        finally:
            collector.stop()
    figures = {"relay_eps": round(relay, 1), "post_ceiling_eps": round(ceiling, 1), "naive_eps": round(naive, 1),
               "ratio_vs_ceiling": round(relay / ceiling, 3), "ratio_vs_naive": round(relay / naive, 2)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
