"""Helpers shared by the producer's Kafka tests."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from producer import events
from producer.codec import avro
from tests.support.kafka import ReadRecord

import orjson

#: Fast reconnects so a broker that comes back is noticed within ~200 ms.
FAST_RECONNECT = {"reconnect.backoff.ms": "20", "reconnect.backoff.max.ms": "200"}
JOBS = ("extract", "transform", "load")


def seq_event(i: int, run_id: str | None = None) -> dict:
    """Event number ``i``; three jobs, so three message keys, interleaved."""
    return events.run_event(
        "RUNNING", run_id=run_id or events.new_run_id(), job_namespace="tests",
        job_name=JOBS[i % len(JOBS)],
        run_facets={"seq": events.custom_facet({"i": i}, schema_url="https://example.com/seq.json")},
    )


def decode(value: bytes) -> dict:
    return avro.decode(value) if avro.is_single_object(value) else orjson.loads(value)


def seqs_by_key(records: Iterable[ReadRecord]) -> dict[bytes | None, list[int]]:
    out: dict[bytes | None, list[int]] = defaultdict(list)
    for rec in records:
        out[rec.key].append(decode(rec.value)["run"]["facets"]["seq"]["i"])
    return dict(out)


def assert_all_arrived_in_order(records: Iterable[ReadRecord], expected: Iterable[int]) -> None:
    """Every expected event arrived; per key, first arrivals are in emit order (a replay
    may repeat events: at-least-once)."""
    by_key = seqs_by_key(records)
    seen = [i for seqs in by_key.values() for i in seqs]
    assert set(seen) == set(expected), f"missing {sorted(set(expected) - set(seen))[:20]}"
    for key, seqs in by_key.items():
        first = list(dict.fromkeys(seqs))
        assert first == sorted(first), f"key {key!r} out of order: {first[:50]}"


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)  # ok: the poll interval of a wait with a deadline
