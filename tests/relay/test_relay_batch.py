"""Batch delivery through the relay, against a real broker and a loopback collector that
follows the spec's ``POST /lineage/batch`` contract and answers partial success."""

from __future__ import annotations

from collections import Counter, defaultdict

import orjson
import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, produce, read_topic
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def test_partial_success_retries_only_the_failed_retriable_events_and_keeps_run_order(kafka):
    topic, dlq, group = kafka.new_topic("batch", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(40, seed=21, running_per_run=(1, 3))
    docs = [orjson.loads(v) for _, v in stream]
    by_run: dict[str, list[bytes]] = defaultdict(list)
    for doc in docs:
        by_run[doc["run"]["runId"]].append(canonical(doc))
    runs = sorted(by_run)
    # Retriable twice, then taken: the START of 5 runs and the first RUNNING of 5 others.
    flaky = {by_run[r][0] for r in runs[:5]} | {by_run[r][1] for r in runs[5:10]}
    # Never taken: one run's terminal event.
    doomed = by_run[runs[10]][-1]
    tries: Counter[bytes] = Counter()

    def collector_says(doc: dict) -> int | None:
        key = canonical(doc)
        tries[key] += 1
        if key in flaky and tries[key] <= 2:
            return 503
        if key == doomed:
            return 422
        return None

    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector(batch_path="/api/v1/lineage/batch") as collector:
        collector.reject_when(collector_says)
        config = relay_config(kafka.bootstrap_servers, topic, {"batch": collector.url}, group=group, dlq=dlq,
                              collector={"batch": {"max_events": 25, "linger_ms": 20}})
        with RelayThread(config) as relay:
            assert collector.wait_for(lambda c: c.count == len(stream) - 1, 60), collector.count
            dead = read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=20)
            assert eventually(lambda: sum(o for o in committed_offsets(
                kafka.bootstrap_servers, topic, group, 2).values() if o > 0) == len(stream), 30)
            partial = relay.metric("lineage_relay_batch_requests_total", collector="batch", result="partial")
            retried = relay.metric("lineage_relay_delivery_retries_total", collector="batch")

    # Only the failed retriable events were sent again; every other event exactly once.
    assert {key: n for key, n in tries.items() if n > 1} == {key: 3 for key in flaky}
    assert retried == 2 * len(flaky) and partial >= 2
    received = [canonical(e) for e in collector.events()]
    assert Counter(received) == Counter(k for k in (canonical(d) for d in docs) if k != doomed)
    assert collector.batches < len(stream) / 5, "events were not batched"
    # Per run, the collector got the events in the run's own order, the retried ones included.
    got: dict[str, list[bytes]] = defaultdict(list)
    for event in collector.events():
        got[event["run"]["runId"]].append(canonical(event))
    for run_id, expected in by_run.items():
        assert got[run_id] == [k for k in expected if k != doomed], run_id
    # The permanently failed one went to the dead-letter topic with the collector's reason.
    assert len(dead) == 1
    record = dead[0]
    assert canonical(orjson.loads(record.value)) == doomed
    assert record.headers["reason"] == b"collector_rejected" and record.headers["collector"] == b"batch"
    assert b"rejected by script with 422" in record.headers["detail"]
