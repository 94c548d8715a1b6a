"""Adaptive concurrency against collectors with a fixed capacity, from one run.

Two loopback collectors that serve ``WORKERS`` requests at once, ``SERVICE_S`` each (at
most WORKERS / SERVICE_S events/s, whatever is sent): one queues what it cannot serve yet,
the other answers it 429 at once. The relay's HttpCollector delivers ``--events`` events to
each with its default 32 requests at once (``concurrency: 32``), first with that fixed
ceiling, then with ``adaptive_concurrency: {}``, alternating (fixed, adaptive, fixed, ...;
``--rounds`` each). Printed per case, medians of the rounds: events/s, the requests the
collector held when each one arrived (in the second half of a run, once the limit has
settled) and, for the one that sheds, the requests it refused. The baseline is the fixed
ceiling in the same run. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.config import CollectorConfig  # noqa: E402
from relay.metrics import RelayMetrics  # noqa: E402
from relay.sinks.http import HttpCollector  # noqa: E402
from tests.support.busy_collector import BusyCollector  # noqa: E402

WORKERS = 4
SERVICE_S = 0.010
CONCURRENCY = 32
BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'


async def deliver(url: str, events: int, adaptive: bool) -> tuple[float, float | None]:
    """Events/s delivering ``events`` events with CONCURRENCY tasks, and the learnt limit."""
    cfg = CollectorConfig(name="bench", url=url, concurrency=CONCURRENCY, timeout_s=30,
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05},
                          adaptive_concurrency={} if adaptive else None)
    http = HttpCollector(cfg, RelayMetrics().for_collector("bench"))
    await http.start()
    todo = iter(range(events))

    async def worker() -> None:
        for _ in todo:
            if await http.deliver(BODY) is not None:
                raise RuntimeError("a delivery failed")

    try:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), 600)
        elapsed = time.perf_counter() - start
    finally:
        await http.close()
    return events / elapsed, (http.gate.limit if http.gate is not None else None)


def run_case(shed: bool, events: int, rounds: int) -> dict[str, dict[str, float]]:
    series: dict[str, dict[str, list[float]]] = {"fixed": {}, "adaptive": {}}
    for _ in range(rounds):
        for mode in ("fixed", "adaptive"):
            with BusyCollector(workers=WORKERS, service_s=SERVICE_S, shed=shed) as server:
                eps, limit = asyncio.run(deliver(server.url, events, mode == "adaptive"))
            if server.ok != events:
                raise RuntimeError(f"the collector accepted {server.ok} of {events}")
            figures = series[mode]
            figures.setdefault("eps", []).append(eps)
            figures.setdefault("in_hand", []).append(statistics.median(server.seen_in_hand[len(server.seen_in_hand) // 2:]))
            figures.setdefault("refused", []).append(server.shed_count)
            if limit is not None:
                figures.setdefault("limit", []).append(limit)
    return {mode: {k: statistics.median(v) for k, v in figures.items()} for mode, figures in series.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # a retry log line per 429 would swamp the output
    print(f"collector capacity: {WORKERS} requests at once, {SERVICE_S * 1000:.0f} ms each "
          f"(at most {WORKERS / SERVICE_S:,.0f} events/s); {args.events} events per run, "
          f"{CONCURRENCY} tasks, {args.rounds} rounds")
    out: dict[str, float] = {}
    for case, shed in (("queue", False), ("shed", True)):
        result = run_case(shed, args.events, args.rounds)
        fixed, adaptive = result["fixed"], result["adaptive"]
        print(f"{case}: fixed {fixed['eps']:,.0f} events/s, {fixed['in_hand']:.1f} requests in the collector's "
              f"hands, {fixed['refused']:.0f} refused; adaptive {adaptive['eps']:,.0f} events/s, "
              f"{adaptive['in_hand']:.1f} in its hands, {adaptive['refused']:.0f} refused, limit "
              f"{adaptive['limit']:.1f}; events/s adaptive / fixed {adaptive['eps'] / fixed['eps']:.3f}")
        out |= {f"{case}_fixed_eps": round(fixed["eps"], 1), f"{case}_adaptive_eps": round(adaptive["eps"], 1),
                f"{case}_ratio_adaptive_vs_fixed": round(adaptive["eps"] / fixed["eps"], 3),
                f"{case}_fixed_in_hand": fixed["in_hand"], f"{case}_adaptive_in_hand": adaptive["in_hand"],
                f"{case}_adaptive_limit": round(adaptive["limit"], 1)}
        if shed:
            out |= {"shed_fixed_refused": fixed["refused"], "shed_adaptive_refused": adaptive["refused"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
