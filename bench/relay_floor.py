"""What relaying to a batch collector costs at the least, per event, on this machine.

``bench/relay_throughput.py`` compares the relay with a bare client POSTing pre-built
batches. On a small machine the relay shares the cores with the collector and the broker,
so its ratio to that ceiling is bounded by what the work it cannot skip costs. This bench
measures that work, each part alone, on the same events:

1. consume: a bare confluent-kafka consumer reading the topic from the embedded broker
   (the consumer's process and the broker's CPU per event);
2. decode: :func:`relay.stages.decode.decode_fields` (parse, validate, canonical digest),
   and the JSON parse alone within it;
3. collector: the batch ceiling (``BATCH_EVENTS`` events per POST, ``BATCH_REQUESTS`` in
   flight) with the collector's and the client's CPU per event.

From these it prints the events/s the cores would allow a relay that did nothing else
(all cores busy, nothing lost to waits): consume + broker + decode + collector per event,
and that as a ratio to the batch ceiling. A relay at that bound spends no CPU on
dedupe, ordering, batching, HTTP or hand-over between processes; the gap between it and
the relay's measured ratio is the relay's own work. Medians of ``--rounds`` runs. Last
line: one JSON object.

``--event-loop auto|uvloop|asyncio`` (default auto, as relay_throughput.py's) is the loop
of the batch ceiling's client, so the ceiling here is the one relay_throughput.py measures
with the same flag; the loop used is printed and is the JSON's ``event_loop``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from relay_throughput import (  # noqa: E402
    BATCH_EVENTS,
    BATCH_PATH,
    BATCH_REQUESTS,
    CollectorProcess,
    batch_ceiling,
    bench_stream,
    cpu_seconds,
    load_topic,
    measured,
)

from relay import event_loop  # noqa: E402
from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker  # noqa: E402
from relay.source.consumer_config import _DEFAULTS as CONSUMER_DEFAULTS  # noqa: E402
from relay.stages.decode import decode_fields  # noqa: E402

#: As the relay polls (relay.intake._POLL_BATCH).
POLL_BATCH = 8000


def consume_cost(bootstrap: str, topic: str, n: int, broker_pid: int) -> tuple[float, float]:
    """CPU µs per event of a bare consumer (the relay's consumer defaults) and of the broker,
    from the first record to the last."""
    consumer = Consumer({**CONSUMER_DEFAULTS, **FAST_GROUP_PROPERTIES, "bootstrap.servers": bootstrap,
                         "group.id": f"floor-{time.time_ns()}", "enable.auto.commit": "false"})
    consumer.subscribe([topic])
    got, start, deadline = 0, None, time.monotonic() + 120
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {n} records")
            messages = consumer.consume(POLL_BATCH, 0.1)
            if messages and start is None:
                start = time.process_time(), cpu_seconds(broker_pid)
            values = [m.value() for m in messages]  # as the relay hands them to its decoder
            got += len(values)
        end = time.process_time(), cpu_seconds(broker_pid)
    finally:
        consumer.close()
    assert start is not None
    return (end[0] - start[0]) / n * 1e6, (end[1] - start[1]) / n * 1e6


def per_event_us(work, values: list[bytes]) -> float:  # noqa: ANN001
    """CPU µs per value of ``work(value)``, its results dropped as it goes (as the decode
    worker does), with the garbage collector as the relay tunes it (off for this)."""
    gc.disable()
    try:
        start = time.process_time()
        for value in values:
            work(value)
        return (time.process_time() - start) / len(values) * 1e6
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--event-loop", choices=event_loop.EVENT_LOOPS, default="auto",
                        help="event loop of the batch ceiling's client (default auto: uvloop when installed, "
                             "else asyncio)")
    args = parser.parse_args()
    loop = event_loop.resolve(args.event_loop)  # uvloop asked for and missing: ImportError here, at once

    stream, bodies = bench_stream(args.events)
    n = len(stream)
    print(f"events: {n}, average size {sum(map(len, bodies)) / n:.0f} bytes, cpus {os.cpu_count()}, "
          f"event loop {loop} (--event-loop {args.event_loop})")
    figures: dict[str, list[float]] = {}
    with EmbeddedBroker() as broker:
        topic = "floor-openlineage"
        load_topic(broker, topic, stream)
        collector = CollectorProcess()
        try:
            for r in range(args.rounds):
                client, broker_us = consume_cost(broker.bootstrap_servers, topic, n, broker.pid)
                decode = per_event_us(lambda v: decode_fields(v, max_bytes=1 << 25), bodies)
                parse = per_event_us(orjson.loads, bodies)
                cpu: dict[str, list[float]] = {}
                eps = measured(lambda: batch_ceiling(collector.url + BATCH_PATH, bodies), collector, n, cpu,
                               loop)
                row = {"consume_us": client, "broker_us": broker_us, "decode_us": decode, "parse_us": parse,
                       "collector_us": cpu["ceiling_collector"][0], "ceiling_client_us": cpu["ceiling_client"][0],
                       "batch_ceiling_eps": eps}
                print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
                for key, value in row.items():
                    figures.setdefault(key, []).append(value)
        finally:
            collector.stop()
    us = {key: round(statistics.median(values), 1) for key, values in figures.items()}
    floor = us["consume_us"] + us["broker_us"] + us["decode_us"] + us["collector_us"]
    bound = (os.cpu_count() or 1) * 1e6 / floor
    ratio = bound / us["batch_ceiling_eps"]
    print(f"least CPU per event a relay needs here: consume {us['consume_us']} + broker {us['broker_us']} + "
          f"decode {us['decode_us']} (parse alone {us['parse_us']}) + collector {us['collector_us']} = "
          f"{floor:.1f} µs")
    print(f"what {os.cpu_count()} cores allow such a relay: {bound:,.0f} events/s, {ratio:.3f} x the batch "
          f"ceiling of {us['batch_ceiling_eps']:,.0f} events/s ({BATCH_EVENTS} events per POST, "
          f"{BATCH_REQUESTS} in flight)")
    print(json.dumps({**us, "floor_us_per_event": round(floor, 1), "bound_eps": round(bound, 1),
                      "bound_ratio_vs_batch_ceiling": round(ratio, 3), "event_loop": loop}))


if __name__ == "__main__":
    main()
