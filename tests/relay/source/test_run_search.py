"""The run search's filter: which records are worth decoding (a START or a terminal)."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from relay.embedded.sample import sample_stream
from relay.source.run_search import _may_start_or_end

WANTED = {"START", "COMPLETE", "FAIL", "ABORT"}


def test_the_filter_agrees_with_the_event_type_on_a_spark_like_stream():
    values = [v for _, v in sample_stream(60, seed=3, running_per_run=(1, 3))]
    types = [orjson.loads(v).get("eventType") for v in values]
    assert {"START", "RUNNING", "COMPLETE"} <= set(types)
    assert [_may_start_or_end(v) for v in values] == [t in WANTED for t in types]


@pytest.mark.parametrize("event_type", ["START", "RUNNING", "COMPLETE", "FAIL", "ABORT", "OTHER"])
@pytest.mark.parametrize("dump", [orjson.dumps, json.dumps, lambda d: json.dumps(d, indent=2)],
                         ids=["compact", "spaced", "indented"])
def test_the_filter_reads_the_event_type_however_the_json_is_spaced(event_type, dump):
    doc = {"job": {"facets": {"x": {"note": "START FAIL"}}}, "eventType": event_type}
    raw = dump(doc)
    assert _may_start_or_end(raw if isinstance(raw, bytes) else raw.encode()) is (event_type in WANTED)


def test_a_nested_event_type_key_does_not_hide_the_event_s_own():
    assert _may_start_or_end(b'{"run": {"facets": {"f": {"eventType": "x"}}}, "eventType": "START"}')
    assert not _may_start_or_end(b'{"eventType": null, "note": "START"}')
    assert not _may_start_or_end(b'{"note": "COMPLETE"}')
    assert not _may_start_or_end(b'{"eventType"')


@pytest.mark.kafka
def test_a_search_finds_which_runs_began_and_ended_and_stops_once_its_partitions_are_revoked(kafka):
    from relay.config import KafkaConfig
    from relay.source.run_search import _Reader
    from tests.support.kafka import produce

    topic = kafka.new_topic("ol")
    stream = sample_stream(40, seed=4, running_per_run=(1, 2))
    docs = [orjson.loads(v) for _, v in stream]
    produce(kafka.bootstrap_servers, topic, stream)
    config = KafkaConfig(bootstrap_servers=kafka.bootstrap_servers, topics=[topic], group_id=kafka.new_group())
    floor = (0, len(stream))  # the look-back began at the end: search everything below it

    def search(records: int, live) -> _Reader:  # noqa: ANN001
        reader = _Reader(config, {(topic, 0): floor}, records, 1 << 25, deadline=time.monotonic() + 60, live=live)
        reader.run()
        return reader

    reader = search(len(stream), lambda part, f: f is floor)
    runs = reader.found[(topic, 0)]
    ended = {d["run"]["runId"] for d in docs if d.get("eventType") in {"COMPLETE", "FAIL", "ABORT"}}
    assert reader.records == len(stream) and not reader.unfinished
    assert set(runs) == {d["run"]["runId"] for d in docs if d.get("eventType") in WANTED}
    assert ended and {r for r, done in runs.items() if done} == ended
    # search_records bounds it: only the last 10 records below the floor.
    assert search(10, lambda part, f: True).records == 10
    # Revoked meanwhile (the floor is no longer this assignment's): it stops at once.
    revoked = search(len(stream), lambda part, f: False)
    assert revoked.records == 1 and revoked.found == {}
