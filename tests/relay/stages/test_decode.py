"""decode_record: what becomes a LineageEvent, and the exact reason for everything else."""

from __future__ import annotations

import copy
import sys
import types
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from relay.events import LineageEvent, Rejection, SourceRef
from relay.stages import decode
from relay.stages.decode import decode_record
from relay.stages.event_checks import INVALID_VALUE
from tests.support.spec import validator

RUN_ID = "f69a6e9b-9bac-3c9a-9cf6-eacb70ecc9a9"
PARENT_ID = "0176a8c2-fe01-7439-87e6-56a1a1b4029f"
MAX = 1 << 20


def run_doc(**top: object) -> dict:
    """A realistic RunEvent (shape of the OpenLineage Spark integration's output)."""
    doc = {
        "eventTime": "2024-05-01T10:15:30.123456789Z",
        "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.20.0/integration/spark",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "eventType": "START",
        "run": {
            "runId": RUN_ID,
            "facets": {
                "parent": {
                    "_producer": "https://github.com/OpenLineage/OpenLineage",
                    "_schemaURL": "https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json",
                    "run": {"runId": PARENT_ID},
                    "job": {"namespace": "airflow", "name": "dag.task"},
                }
            },
        },
        "job": {"namespace": "spark-prod", "name": "etl.orders", "facets": {}},
        "inputs": [{"namespace": "s3://raw", "name": "orders"}],
        "outputs": [],
    }
    doc.update(top)
    return doc


def dataset_doc() -> dict:
    return {
        "eventTime": "2024-05-01T10:15:30Z",
        "producer": "https://example.com/catalog-sync",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent",
        "dataset": {"namespace": "postgres://db:5432", "name": "public.orders", "facets": {}},
    }


def job_doc() -> dict:
    return {
        "eventTime": "2024-05-01T10:15:30+02:00",
        "producer": "https://example.com/scheduler",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/JobEvent",
        "job": {"namespace": "airflow", "name": "dag.task"},
        "inputs": [],
        "outputs": [{"namespace": "s3://lake", "name": "orders_clean"}],
    }


def decoded(value: bytes | dict, **kwargs) -> LineageEvent:
    if isinstance(value, dict):
        value = orjson.dumps(value)
    result = decode_record(value, max_bytes=kwargs.pop("max_bytes", MAX), **kwargs)
    assert isinstance(result, LineageEvent), result
    return result


def rejected(value: bytes | dict | None, **kwargs) -> Rejection:
    if isinstance(value, dict):
        value = orjson.dumps(value)
    result = decode_record(value, max_bytes=kwargs.pop("max_bytes", MAX), **kwargs)
    assert isinstance(result, Rejection), result
    return result


def edit(doc: dict, path: str, value: object = ...) -> dict:
    """Copy of ``doc`` with dotted ``path`` set to ``value`` (or deleted if omitted)."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    target = doc
    for key in parents:
        target = target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return doc


# --- accepted events ------------------------------------------------------------------


def test_run_event_fields_and_body_is_the_original_bytes():
    raw = orjson.dumps(run_doc())
    source = SourceRef("openlineage", 3, 42)
    event = decoded(raw, source=source)
    assert event.kind == "run"
    assert event.run_id == RUN_ID
    assert event.event_type == "START"
    assert (event.job_namespace, event.job_name) == ("spark-prod", "etl.orders")
    assert event.parent_run_id == PARENT_ID
    assert event.source is source
    assert event.body is raw
    assert event.doc == run_doc()
    assert len(event.digest) == 16
    assert not event.is_terminal


def test_java_nanosecond_timestamp_is_truncated_to_microseconds():
    event = decoded(run_doc(eventTime="2024-01-01T00:00:00.123456789Z"))
    assert event.event_time == datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=timezone.utc)
    # Truncated, not rounded: 0.9999999 s must stay inside the same second.
    late = decoded(run_doc(eventTime="2024-01-01T23:59:59.9999999+00:00"))
    assert late.event_time == datetime(2024, 1, 1, 23, 59, 59, 999999, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2024-01-01T00:00:00Z", datetime(2024, 1, 1, tzinfo=timezone.utc)),
        ("2024-01-01T00:00:00.5Z", datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=timezone.utc)),
        ("2024-01-01T00:00:00+00:00", datetime(2024, 1, 1, tzinfo=timezone.utc)),
        ("2024-01-01T05:30:00.000+05:30", datetime(2024, 1, 1, tzinfo=timezone.utc)),
        ("2023-12-31T19:00:00.123456789-05:00",
         datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=timezone.utc)),
        ("2024-01-01t00:00:00z", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    ],
)
def test_event_time_offsets_give_the_same_instant(text, expected):
    event = decoded(run_doc(eventTime=text))
    assert event.event_time == expected
    assert event.event_time.utcoffset() is not None


def test_run_id_and_parent_are_lower_cased_but_body_is_untouched():
    doc = edit(run_doc(), "run.runId", RUN_ID.upper())
    doc = edit(doc, "run.facets.parent.run.runId", PARENT_ID.upper())
    event = decoded(doc)
    assert event.run_id == RUN_ID
    assert event.parent_run_id == PARENT_ID
    assert RUN_ID.upper().encode() in event.body


def test_run_event_without_optional_parts():
    doc = run_doc()
    del doc["eventType"], doc["inputs"], doc["outputs"], doc["run"]["facets"]
    event = decoded(doc)
    assert event.event_type is None
    assert event.parent_run_id is None


def test_malformed_parent_facet_is_ignored_not_rejected():
    # Its contents, that is: a facet that is not an object at all is refused (wrong_type).
    event = decoded(edit(run_doc(), "run.facets.parent", {"run": {"runId": 7}}))
    assert event.parent_run_id is None
    assert decoded(edit(run_doc(), "run.facets.parent", {"run": "x"})).parent_run_id is None


def test_terminal_event_types():
    for event_type in ("COMPLETE", "FAIL", "ABORT"):
        assert decoded(run_doc(eventType=event_type)).is_terminal
    for event_type in ("START", "RUNNING", "OTHER"):
        assert not decoded(run_doc(eventType=event_type)).is_terminal


def test_event_with_run_and_dataset_is_a_run_event():
    # The spec's own example_full_event.json carries both.
    event = decoded(run_doc(dataset={"namespace": "123", "name": "1"}))
    assert event.kind == "run"


def test_event_with_run_and_dataset_but_no_job_is_a_dataset_event():
    # Not a RunEvent (no job), a valid DatasetEvent (extra fields allowed): the spec's oneOf.
    doc = dataset_doc()
    doc["run"] = {"runId": RUN_ID}
    validator().validate(doc)
    assert decoded(doc).kind == "dataset"


def test_dataset_event():
    event = decoded(dataset_doc())
    assert event.kind == "dataset"
    assert event.run_id is None and event.event_type is None and event.job_name is None
    assert event.event_time == datetime(2024, 5, 1, 10, 15, 30, tzinfo=timezone.utc)


def test_job_event():
    event = decoded(job_doc())
    assert event.kind == "job"
    assert event.run_id is None and event.event_type is None
    assert (event.job_namespace, event.job_name) == ("airflow", "dag.task")
    assert event.event_time.utcoffset() == timedelta(hours=2)


# --- digest ---------------------------------------------------------------------------


def test_digest_ignores_key_order_and_whitespace():
    doc = run_doc()
    compact = orjson.dumps(doc)
    reordered = orjson.dumps(dict(reversed(list(doc.items()))), option=orjson.OPT_INDENT_2)
    pretty_sorted = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    digests = {decoded(raw).digest for raw in (compact, reordered, pretty_sorted)}
    assert len(digests) == 1
    assert decoded(reordered).body == reordered


def test_digest_changes_with_content():
    a = decoded(run_doc(eventType="START")).digest
    b = decoded(run_doc(eventType="COMPLETE")).digest
    c = decoded(edit(run_doc(), "job.facets", {"sql": {"query": "SELECT 1"}})).digest
    assert len({a, b, c}) == 3


def test_events_differing_only_in_an_integer_beyond_64_bits_have_different_digests():
    stats = {"_producer": "https://example.com/p", "_schemaURL": "https://example.com/s.json", "rows": "ROWS"}
    raw = orjson.dumps(edit(run_doc(), "job.facets", {"stats": stats}))
    # 2**128 - 1 and 2**128 - 2: orjson reads both as the same float, the digest must not.
    one, other = (raw.replace(b'"ROWS"', rows) for rows in (b"340282366920938463463374607431768211455",
                                                          b"340282366920938463463374607431768211454"))
    assert orjson.loads(one) == orjson.loads(other)
    assert decoded(one).digest != decoded(other).digest


# --- rejections -----------------------------------------------------------------------

_VALID = orjson.dumps(run_doc())

# (id, value, reason, words the detail must contain)
REJECTIONS = [
    ("none", None, "empty", "null"),
    ("empty-bytes", b"", "empty", "empty"),
    ("latin1-bytes", b'{"producer": "caf\xe9"}', "not_utf8", "offset"),
    ("lone-continuation", b"\x80{}", "not_utf8", "0x80"),
    ("truncated", _VALID[:-7], "invalid_json", "JSON"),
    ("trailing-garbage", _VALID + b"}", "invalid_json", "JSON"),
    ("python-repr", b"{'eventType': 'START'}", "invalid_json", "JSON"),
    ("lone-surrogate", orjson.dumps(run_doc(producer="@")).replace(b"@", rb"\udcff"), "unsupported_json",
     "surrogate"),
    ("array", orjson.dumps([run_doc()]), "not_object", "an array"),
    ("string", b'"START"', "not_object", "a string"),
    ("null-literal", b"null", "not_object", "null"),
    ("no-kind", orjson.dumps({k: v for k, v in run_doc().items() if k not in ("run", "job")}),
     "missing_field", "`run`"),
    ("run-not-object", run_doc(run=RUN_ID), "wrong_type", "`run`"),
    ("missing-runId", edit(run_doc(), "run.runId"), "missing_field", "`run.runId`"),
    ("runId-not-uuid", edit(run_doc(), "run.runId", "not-a-uuid"), "invalid_value",
     "not-a-uuid"),
    ("runId-no-dashes", edit(run_doc(), "run.runId", RUN_ID.replace("-", "")),
     "invalid_value", "`run.runId`"),
    ("runId-trailing-junk", edit(run_doc(), "run.runId", RUN_ID + "-extra"), "invalid_value", "`run.runId`"),
    ("runId-braced", edit(run_doc(), "run.runId", "{" + RUN_ID + "}"), "invalid_value",
     "UUID"),
    ("runId-number", edit(run_doc(), "run.runId", 12345), "wrong_type", "a number"),
    ("missing-job", edit(run_doc(), "job"), "missing_field", "`job`"),
    ("job-list", run_doc(job=["spark-prod", "etl"]), "wrong_type", "`job`"),
    # An empty job.name is valid (the spec has no minLength; test_decode_spec_edges): a null one is not.
    ("null-job-name", edit(run_doc(), "job.name", None), "wrong_type", "`job.name`"),
    ("job-namespace-number", edit(run_doc(), "job.namespace", 1), "wrong_type",
     "`job.namespace`"),
    ("eventType-STARTED", run_doc(eventType="STARTED"), "invalid_value", "STARTED"),
    ("eventType-lowercase", run_doc(eventType="complete"), "invalid_value", "COMPLETE"),
    ("eventType-number", run_doc(eventType=5), "wrong_type", "`eventType`"),
    ("eventType-null", run_doc(eventType=None), "wrong_type", "null"),
    ("eventTime-yesterday", run_doc(eventTime="yesterday"), "invalid_value", "`eventTime`"),
    ("eventTime-naive", run_doc(eventTime="2024-01-01T00:00:00.123"), "invalid_value",
     "timezone"),
    ("eventTime-date-only", run_doc(eventTime="2024-01-01"), "invalid_value", "`eventTime`"),
    ("eventTime-feb-30", run_doc(eventTime="2024-02-30T00:00:00Z"), "invalid_value",
     "2024-02-30"),
    ("eventTime-bad-offset", run_doc(eventTime="2024-01-01T00:00:00+25:00"), "invalid_value",
     "`eventTime`"),
    ("eventTime-epoch", run_doc(eventTime=1704067200), "wrong_type", "`eventTime`"),
    ("missing-eventTime", edit(run_doc(), "eventTime"), "missing_field", "`eventTime`"),
    ("empty-producer", run_doc(producer=""), "invalid_value", "`producer`"),
    ("missing-schemaURL", edit(run_doc(), "schemaURL"), "missing_field", "`schemaURL`"),
    ("inputs-object", run_doc(inputs={"namespace": "s3://raw"}), "wrong_type", "`inputs`"),
    ("outputs-null", run_doc(outputs=None), "wrong_type", "`outputs`"),
    # The spec's InputDataset/OutputDataset: an object with string namespace and name.
    ("inputs-item-number", run_doc(inputs=[5]), "wrong_type", "`inputs[0]`"),
    ("inputs-item-empty", run_doc(inputs=[{"namespace": "s3://raw", "name": "a"}, {}]), "missing_field",
     "`inputs[1].namespace`"),
    ("outputs-item-name-number", run_doc(outputs=[{"namespace": "s3://raw", "name": 7}]), "wrong_type",
     "`outputs[0].name`"),
    ("eventTime-space", run_doc(eventTime="2024-01-01 12:00:00Z"), "invalid_value", "`eventTime`"),
    ("job-and-dataset-without-run", {**dataset_doc(), "job": {"namespace": "n", "name": "j"}}, "invalid_value",
     "exactly one"),
    ("run-facets-list", edit(run_doc(), "run.facets", []), "wrong_type", "`run.facets`"),
    ("job-facets-string", edit(run_doc(), "job.facets", "sql"), "wrong_type", "`job.facets`"),
    ("dataset-missing-name", edit(dataset_doc(), "dataset.name"), "missing_field",
     "`dataset.name`"),
    ("dataset-string", {**dataset_doc(), "dataset": "public.orders"}, "wrong_type",
     "`dataset`"),
    ("job-event-missing-namespace", edit(job_doc(), "job.namespace"), "missing_field",
     "`job.namespace`"),
    ("run-facet-string", edit(run_doc(), "run.facets.x", "a string"), "wrong_type", "`run.facets.x`"),
    ("too-deep",  # the event 1 level, run 2, facets 3, x 4, then 997 arrays: 1001 levels
     orjson.dumps(run_doc(run={"runId": RUN_ID, "facets": {"x": {"v": "DEEP"}}})).replace(
         b'"DEEP"', b"[" * 997 + b"]" * 997),
     "too_deep", "1001 levels deep"),
    ("avro-garbage", decode.AVRO_MARKER + b"\x00\x01garbage", "undecodable", "Avro"),
]


@pytest.mark.parametrize(
    "value, reason, words", [case[1:] for case in REJECTIONS], ids=[c[0] for c in REJECTIONS]
)
def test_rejection_reason_and_detail(value, reason, words):
    rejection = rejected(value)
    assert rejection.reason == reason
    assert words in rejection.detail


def test_every_reason_code_is_exercised():
    covered = {case[2] for case in REJECTIONS} | {decode.TOO_LARGE}
    assert covered == decode.REASONS


def test_too_large_is_checked_before_parsing():
    junk = b"\xff" * 101  # would be not_utf8 if it were parsed
    rejection = rejected(junk, max_bytes=100)
    assert rejection.reason == decode.TOO_LARGE
    assert "101" in rejection.detail and "100" in rejection.detail


def test_exactly_max_bytes_is_accepted():
    raw = orjson.dumps(run_doc())
    assert decoded(raw, max_bytes=len(raw)).run_id == RUN_ID
    assert rejected(raw, max_bytes=len(raw) - 1).reason == decode.TOO_LARGE


def test_avro_garbage_is_undecodable_whether_or_not_the_codec_exists():
    rejection = rejected(decode.AVRO_MARKER + b"\xde\xad\xbe\xef")
    assert rejection.reason == decode.UNDECODABLE
    try:
        import producer.codec.avro  # noqa: F401
    except ImportError:
        assert "Avro codec is unavailable" in rejection.detail


@pytest.fixture
def fake_avro_codec(monkeypatch):
    """Stands in for producer.codec.avro: decode() returns what the test sets."""
    codec = types.ModuleType("producer.codec.avro")
    package = types.ModuleType("producer.codec")
    package.avro = codec
    root = types.ModuleType("producer")
    root.codec = package
    for name, module in (("producer", root), ("producer.codec", package),
                         ("producer.codec.avro", codec)):
        monkeypatch.setitem(sys.modules, name, module)
    return codec


def test_avro_record_is_reencoded_as_json(fake_avro_codec):
    fake_avro_codec.decode = lambda value: run_doc()
    event = decoded(decode.AVRO_MARKER + b"\x00" * 8)
    assert orjson.loads(event.body) == run_doc()
    assert event.run_id == RUN_ID
    assert event.digest == decoded(run_doc()).digest


def test_avro_codec_errors_map_to_undecodable(fake_avro_codec):
    def broken(value: bytes) -> dict:
        raise ValueError("unknown schema fingerprint 0x1234")

    fake_avro_codec.decode = broken
    rejection = rejected(decode.AVRO_MARKER + b"\x00" * 8)
    assert rejection.reason == decode.UNDECODABLE
    assert "unknown schema fingerprint 0x1234" in rejection.detail


def test_avro_record_that_is_invalid_openlineage_is_rejected_by_field(fake_avro_codec):
    fake_avro_codec.decode = lambda value: edit(run_doc(), "run.runId", "nope")
    assert rejected(decode.AVRO_MARKER + b"\x00").reason == INVALID_VALUE
