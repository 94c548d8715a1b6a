"""The run search's filter: which records are worth decoding (a START or a terminal)."""

from __future__ import annotations

import json

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
