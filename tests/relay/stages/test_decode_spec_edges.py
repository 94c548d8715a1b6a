"""decode_record on the edges of the spec: which kind an event is, leap seconds, and JSON
that RFC 8259's grammar allows but the relay cannot carry.

The OpenLineage JSON Schema (``tests/support/spec.py``) is the judge of the first two: the
relay accepts an event the schema accepts, as the kind the schema's ``oneOf`` matches."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from relay.events import LineageEvent, Rejection
from relay.stages.decode import decode_fields, decode_record, event_time_from_text
from tests.support.spec import validator

RUN_ID = "0190b9a5-6c1e-7f3a-8b2c-1d2e3f4a5b6c"
BASE = {"eventTime": "2024-05-01T10:15:30Z", "producer": "https://example.com/p",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent"}
DATASET = {"namespace": "postgres://db:5432", "name": "public.orders"}
JOB = {"namespace": "airflow", "name": "dag.task"}


def decode(value: bytes | dict) -> LineageEvent | Rejection:
    return decode_record(value if isinstance(value, bytes) else orjson.dumps(value), max_bytes=1 << 20)


# --- the kind of an event with `dataset` and `job` and no `run` ------------------------------------

# (id, event, the kind the spec's oneOf matches, or None when it matches none or both)
KINDS = [
    ("dataset-and-a-job-that-is-no-job", {**BASE, "dataset": DATASET, "job": "x"}, "dataset"),
    ("dataset-and-a-job-without-name", {**BASE, "dataset": DATASET, "job": {"namespace": "airflow"}}, "dataset"),
    ("job-and-a-dataset-that-is-no-dataset", {**BASE, "job": JOB, "dataset": "x"}, "job"),
    ("job-and-a-dataset-without-name", {**BASE, "job": JOB, "dataset": {"namespace": "n"}}, "job"),
    ("both-but-inputs-no-array", {**BASE, "dataset": DATASET, "job": JOB, "inputs": "x"}, "dataset"),
    ("both-valid", {**BASE, "dataset": DATASET, "job": JOB}, None),
    # Empty names are names (the spec has no minLength): a job of empty names is still a job.
    ("both-valid-job-of-empty-names", {**BASE, "dataset": DATASET, "job": {"namespace": "", "name": ""}}, None),
    ("both-valid-dataset-of-empty-names", {**BASE, "dataset": {"namespace": "", "name": ""}, "job": JOB}, None),
    ("neither-valid", {**BASE, "dataset": "x", "job": "y"}, None),
    ("both-but-no-eventTime", {k: v for k, v in {**BASE, "dataset": DATASET, "job": JOB}.items()
                               if k != "eventTime"}, None),
]


@pytest.mark.parametrize("doc, kind", [c[1:] for c in KINDS], ids=[c[0] for c in KINDS])
def test_an_event_with_dataset_and_job_is_the_kind_the_spec_matches(doc, kind):
    assert (validator().errors(doc) == []) == (kind is not None)
    got = decode(doc)
    if kind is None:
        assert type(got) is Rejection, got
    else:
        assert type(got) is LineageEvent, got
        assert got.kind == kind
        assert (got.job_name is None) == (kind == "dataset")


# --- empty namespaces and names ----------------------------------------------------------------------

# The spec's Job and Dataset require `namespace` and `name` as strings, with no minLength.
EMPTY_NAMES = [
    ("run-empty-job-name", {**BASE, "eventType": "START", "run": {"runId": RUN_ID},
                            "job": {"namespace": "airflow", "name": ""}}, "run"),
    ("run-empty-job-namespace", {**BASE, "eventType": "START", "run": {"runId": RUN_ID},
                                 "job": {"namespace": "", "name": "t"}}, "run"),
    ("job-event-empty-namespace", {**BASE, "job": {"namespace": "", "name": "t"}}, "job"),
    ("job-event-empty-both", {**BASE, "job": {"namespace": "", "name": ""}}, "job"),
    ("dataset-event-empty-name", {**BASE, "dataset": {"namespace": "s3://b", "name": ""}}, "dataset"),
    ("dataset-event-empty-both", {**BASE, "dataset": {"namespace": "", "name": ""}}, "dataset"),
]


@pytest.mark.parametrize("doc, kind", [c[1:] for c in EMPTY_NAMES], ids=[c[0] for c in EMPTY_NAMES])
def test_empty_namespaces_and_names_are_accepted_as_the_spec_accepts_them(doc, kind):
    assert validator().errors(doc) == []
    got = decode(doc)
    assert type(got) is LineageEvent, got
    assert got.kind == kind
    if kind != "dataset":
        assert (got.job_namespace, got.job_name) == (doc["job"]["namespace"], doc["job"]["name"])


def test_a_job_or_dataset_name_that_is_no_string_is_still_refused():
    for doc, words in (({**BASE, "job": {"namespace": "", "name": None}}, "`job.name` must be a string, got null"),
                       ({**BASE, "dataset": {"namespace": 1, "name": ""}}, "`dataset.namespace` must be a string")):
        got = decode(doc)
        assert type(got) is Rejection and got.reason == "wrong_type", got
        assert words in got.detail


def test_an_event_that_is_neither_says_why_as_both():
    got = decode({**BASE, "dataset": {"namespace": "n"}, "job": {"name": "j"}})
    assert got.reason == "missing_field"
    assert "neither a DatasetEvent (`dataset.name` is missing) nor a JobEvent (`job.namespace` is missing)" \
        in got.detail
    both = decode({**BASE, "dataset": DATASET, "job": JOB})
    assert both.reason == "invalid_value" and "exactly one" in both.detail
    no_time = decode(KINDS[-1][1])
    assert no_time.reason == "missing_field" and no_time.detail == "`eventTime` is missing"


# --- leap seconds ---------------------------------------------------------------------------------

def run_event(event_time: str) -> dict:
    return {**BASE, "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "eventType": "COMPLETE", "eventTime": event_time, "run": {"runId": RUN_ID}, "job": JOB}


@pytest.mark.parametrize("text, utc", [
    ("2016-12-31T23:59:60Z", datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("2016-12-31t23:59:60.5z", datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("2016-12-31T15:59:60.123456789-08:00", datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("2017-01-01T05:29:60+05:30", datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
])
def test_a_leap_second_is_the_last_microsecond_of_its_second_59(text, utc):
    doc = run_event(text)
    validator().validate(doc)
    got = decode(doc)
    assert type(got) is LineageEvent, got
    assert got.event_time == utc
    assert decode(run_event("2016-12-31T23:59:59.999Z")).event_time < got.event_time < \
        decode(run_event("2017-01-01T00:00:00Z")).event_time
    # What the decode worker sends across its pipe reads back as the same time.
    found = decode_fields(orjson.dumps(doc), max_bytes=1 << 20)
    assert event_time_from_text(found[5]) == found[4] and found[4].utcoffset() == got.event_time.utcoffset()


@pytest.mark.parametrize("text", ["2016-12-31T23:59:61Z", "2016-12-31T23:58:60Z", "2016-12-31T22:59:60Z",
                                  "2016-12-31T23:59:60+01:00", "2016-12-32T23:59:60Z"])
def test_a_second_60_other_than_a_leap_second_is_refused(text):
    got = decode(run_event(text))
    assert type(got) is Rejection and got.reason == "invalid_value" and text in got.detail


def test_a_naive_leap_second_is_refused_for_its_missing_offset():
    got = decode(run_event("2016-12-31T23:59:60"))
    assert got.reason == "invalid_value" and "timezone offset" in got.detail


# --- JSON the relay cannot carry ------------------------------------------------------------------

_EVENT = orjson.dumps(run_event("2024-05-01T10:15:30Z")).replace(b'"run":{', b'"run":{"x":@,', 1)


@pytest.mark.parametrize("literal, words", [
    (rb'"\ud800"', "lone UTF-16 surrogate"),
    (rb'"a\udc00b"', "lone UTF-16 surrogate"),
    (rb'"\ud800\u0041"', "lone UTF-16 surrogate"),
    (b"1e400", "64-bit float"),
    (b"-1e400", "64-bit float"),
    (b"1" * 400, "64-bit float"),
], ids=["high", "low", "high-then-no-low", "1e400", "-1e400", "400-digits"])
def test_json_with_a_lone_surrogate_or_a_number_beyond_a_double_is_unsupported_json(literal, words):
    got = decode(_EVENT.replace(b"@", literal))
    assert type(got) is Rejection and got.reason == "unsupported_json", got
    assert words in got.detail and "I-JSON" in got.detail


@pytest.mark.parametrize("literal", [rb'"\ud800",', rb'"\ud800" "x"', b"1e400,", b"NaN", b"Infinity", b"1e400]"])
def test_broken_json_that_also_holds_such_a_value_is_invalid_json(literal):
    got = decode(_EVENT.replace(b"@", literal))
    assert type(got) is Rejection and got.reason == "invalid_json", got


def test_a_surrogate_pair_and_a_tiny_number_are_plain_json():
    for literal in (rb'"\ud83d\ude00"', b"1e-400", b"1" * 300):
        assert type(decode(_EVENT.replace(b"@", literal))) is LineageEvent, literal
