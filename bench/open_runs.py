"""Memory and speed of a consolidated collector holding many open runs.

100,000 Spark runs (by default) each send START and a RUNNING and never finish, so every
run stays open. Each event carries realistic facets: two datasets with a 20-column
``schema`` facet, ``dataSource``, ``processing_engine``, ``spark_properties``, ``jobType``.
The runs belong to ``--jobs`` jobs (default 200), each with its own tables and schemas, so
runs of one job repeat facet values as real runs do; ``--jobs`` = ``--runs`` makes every
run's facets different (the worst case for memory).
The records go through a real :class:`~relay.lane.CollectorLane` in ``consolidated`` mode
in this process: decode and validate, dedupe, the consolidator, the run-state table
(every changelog record is encoded; the broker's acknowledgement is simulated at once),
the ordered dispatcher, and a collector that acknowledges at once (STARTs are sent).

Baseline, same run, same records: the same lane in ``passthrough`` mode (nothing held).
Figures: events/s through the lane (the record bytes are made outside the timed part),
process RSS (psutil) once every run is open, and the consolidated/passthrough speed ratio.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.config import CollectorConfig, PipelineConfig  # noqa: E402
from relay.embedded.sample import spark_run  # noqa: E402
from relay.events import SourceRef  # noqa: E402
from relay.lane import CollectorLane  # noqa: E402
from relay.metrics import RelayMetrics  # noqa: E402
from relay.process import tune_process  # noqa: E402
from relay.source.offsets import OffsetTracker  # noqa: E402
from relay.stages.decode import decode_record  # noqa: E402

COLUMNS = 20
EPOCH = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
TEMPLATES = 200  # distinct jobs by default; every run gets its own run id
BATCH = 1000  # records handled between two state flushes, like one poll batch
COMMIT_EVERY = 10  # batches between two commits (the relay commits every second)


class InstantCollector:
    name = "bench"

    def __init__(self) -> None:
        self.count = 0

    async def start(self) -> None:
        pass

    async def deliver(self, body: bytes):
        self.count += 1
        return None

    async def close(self) -> None:
        pass


def job_events(n: int) -> list[bytes]:
    """START and RUNNING of job ``n`` (its own tables and schemas), with a placeholder run id."""
    docs = spark_run("spark-prod", f"etl_{n}.insert.table_{n}_daily", run_id="RUN-ID-PLACEHOLDER",
                     start=EPOCH, rng=random.Random(n), columns=COLUMNS, with_running=1)[:2]
    for doc in docs:  # two inputs, as a join reads
        first = doc["inputs"][0]
        schema = first["facets"]["schema"]
        doc["inputs"] = [
            dict(first, name=f"{first['name']}_{n}_{i}", facets=dict(first["facets"], schema=dict(
                schema, fields=[dict(f, name=f"{f['name']}_{n}_{i}") for f in schema["fields"]])))
            for i in range(2)]
    return [orjson.dumps(doc) for doc in docs]


def records(n_runs: int, chunk: int, jobs: int = TEMPLATES):
    """Chunks of record values: START of ``chunk`` runs, then their RUNNINGs. Jobs are made
    as needed when there are many, so that the bench does not hold them all."""
    made = [job_events(n) for n in range(jobs)] if jobs <= 1000 else None
    for first in range(0, n_runs, chunk):
        starts, runnings = [], []
        for run in range(first, min(n_runs, first + chunk)):
            start, running = made[run % jobs] if made is not None else job_events(run % jobs)
            run_id = f"0190a5c4-{run >> 16 & 0xffff:04x}-7{run & 0xfff:03x}-8000-{run:012x}".encode()
            starts.append(start.replace(b"RUN-ID-PLACEHOLDER", run_id))
            runnings.append(running.replace(b"RUN-ID-PLACEHOLDER", run_id))
        yield starts + runnings


async def run_lane(mode: str, n_runs: int, jobs: int) -> tuple[float, int, CollectorLane]:
    collector = InstantCollector()
    extra = {"mode": mode, "consolidation": {"max_open_runs": n_runs * 2}} if mode != "passthrough" else {}
    config = CollectorConfig(name="bench", url="http://127.0.0.1:1", concurrency=32, max_pending=10 ** 9, **extra)
    lane = CollectorLane(collector, config, pipeline=PipelineConfig(), metrics=RelayMetrics().for_collector("bench"),
                         dead_letters=None)
    await lane.start()
    tracker = OffsetTracker()
    offset = 0
    busy = 0.0
    events = 0
    for batch, chunk in enumerate(records(n_runs, BATCH // 2, jobs), 1):
        began = time.perf_counter()
        now = time.monotonic()
        for value in chunk:
            partition = offset % 8
            ticket = tracker.track(("openlineage", partition), offset)
            event = decode_record(value, max_bytes=1 << 24, source=SourceRef("openlineage", partition, offset))
            event.ticket, event.consumed_at = ticket, now
            lane.offer(event, now)
            event.doc = None  # as the relay does once every lane has it
            ticket.release()
            offset += 1
        lane.expire(now)
        if lane.table is not None:  # the relay's state flush, acknowledged at once
            for write in lane.table.take_writes(include_deliveries=batch % COMMIT_EVERY == 0):
                lane.table.written(write, ok=True)
        await asyncio.sleep(0)  # let the dispatcher deliver
        busy += time.perf_counter() - began
        events += len(chunk)
    began = time.perf_counter()
    await lane.drain(60)
    if lane.table is not None:
        for write in lane.table.take_writes(include_deliveries=True):
            lane.table.written(write, ok=True)
    busy += time.perf_counter() - began
    return events / busy, collector.count, lane


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2 ** 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=TEMPLATES,
                        help="distinct jobs (own tables and schemas); runs of one job share facet values")
    args = parser.parse_args()
    tune_process()  # as `lineage-relay run` does
    sample = next(records(1, 1))
    print(f"runs: {args.runs} of {min(args.jobs, args.runs)} jobs, events: {2 * args.runs}, START {len(sample[0])} "
          f"bytes, RUNNING {len(sample[1])} bytes, {COLUMNS}-column schema facets")
    before = rss_mb()
    eps, sent, lane = asyncio.run(run_lane("consolidated", args.runs, args.jobs))
    gc.collect()
    rss = rss_mb()
    open_runs = lane.open_runs
    assert open_runs == args.runs and sent == args.runs, (open_runs, sent)
    print(f"consolidated: {eps:,.0f} events/s, {open_runs:,} open runs, RSS {rss:,.0f} MB "
          f"(started at {before:,.0f} MB: {(rss - before) * 2 ** 20 / open_runs:,.0f} bytes per open run)")
    del lane
    gc.collect()
    base_eps, base_sent, _ = asyncio.run(run_lane("passthrough", args.runs, args.jobs))
    assert base_sent == 2 * args.runs
    print(f"passthrough:  {base_eps:,.0f} events/s (baseline: nothing held)")
    print(json.dumps({"open_runs": open_runs, "rss_mb": round(rss, 1), "events_per_s": round(eps, 1), "jobs": args.jobs,
                      "bytes_per_open_run": round((rss - before) * 2 ** 20 / open_runs),
                      "passthrough_events_per_s": round(base_eps, 1),
                      "ratio_vs_passthrough": round(eps / base_eps, 3)}))


if __name__ == "__main__":
    main()
