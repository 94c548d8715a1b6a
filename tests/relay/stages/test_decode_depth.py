"""decode_record and deeply nested events: accepted up to MAX_DEPTH levels, one digest per
content whatever the depth, refused beyond with ``too_deep``.

orjson reads 1024 levels but writes only 254; the canonical JSON the digest is taken of
must not depend on that (dedupe would miss copies, or the event be refused).
"""

from __future__ import annotations

import sys
import types

import orjson
import pytest

from relay.events import LineageEvent, Rejection
from relay.stages import decode
from relay.stages.decode import decode_record
from relay.stages.decode_worker import DecodeWorker
from relay.stages.event_checks import INVALID_VALUE, MAX_DEPTH, TOO_DEEP, content_digest

RUN_ID = "f69a6e9b-9bac-3c9a-9cf6-eacb70ecc9a9"
MAX = 1 << 22
FACET = {"_producer": "https://example.com/producer", "_schemaURL": "https://example.com/Deep.json#/$defs/Deep"}
#: Levels above a value at ``run.facets.deep.value``: the event, run, facets, deep.
ABOVE = 4


def event(value: object = "@deep@") -> dict:
    return {
        "eventTime": "2024-05-01T10:15:30Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "eventType": "START",
        "run": {"runId": RUN_ID, "facets": {"deep": {**FACET, "value": value}}},
        "job": {"namespace": "spark-prod", "name": "etl", "facets": {}},
        "inputs": [{"namespace": "s3://lake", "name": "raw é 😀"}],
        "outputs": [],
    }


#: Two levels: an object holding an array; unicode (one character escaped), floats, big integers.
LEAF = b'{"z":"\xc3\xa9\\u00e9 \xf0\x9f\x98\x80","a":[1e-7,0.1,-0.0,18446744073709551615,-9223372036854775808]}'


def nested(levels: int, *, indent: bool = False, sort_keys: bool = False) -> bytes:
    """A value ``levels`` deep: objects of two keys and arrays, alternating, around LEAF;
    ``sort_keys``: as orjson writes it with sorted keys."""
    text = orjson.dumps(orjson.loads(LEAF), option=orjson.OPT_SORT_KEYS) if sort_keys else LEAF
    space = b" \n  " if indent else b""
    for i in range(levels - 2):
        if i % 2:
            text = b"[" + space + text + b"]"
        elif sort_keys:
            text = b'{"b":' + str(i).encode() + b',"k":' + text + b"}"
        else:
            text = b'{"k":' + space + text + b"," + space + b'"b":' + str(i).encode() + b"}"
    return text


def canonical(levels: int) -> bytes:
    """What the digest of the event holding ``nested(levels)`` must be taken of: orjson's
    canonical form of it (sorted keys, compact), the deep value spelt out as orjson would
    write it without its limit."""
    return orjson.dumps(event(), option=orjson.OPT_SORT_KEYS).replace(b'"@deep@"', nested(levels, sort_keys=True))


def body(levels: int, **kwargs: bool) -> bytes:
    """An event nested ``levels`` deep in all (the event object is level 1)."""
    return orjson.dumps(event()).replace(b'"@deep@"', nested(levels - ABOVE, **kwargs))


@pytest.mark.parametrize("levels", [254, 255, 256, 600, MAX_DEPTH])
def test_deep_event_is_accepted_as_it_came(levels: int) -> None:
    raw = body(levels)
    got = decode_record(raw, max_bytes=MAX)
    assert isinstance(got, LineageEvent), got
    assert got.body is raw
    assert (got.run_id, got.event_type, got.job_name) == (RUN_ID, "START", "etl")
    assert got.digest == content_digest(canonical(levels - ABOVE))


@pytest.mark.parametrize("levels", [255, 600, MAX_DEPTH])
def test_copies_of_a_deep_event_have_one_digest(levels: int) -> None:
    compact = body(levels)
    pretty = body(levels, indent=True)
    reordered = orjson.dumps(dict(reversed(list(event().items())))).replace(
        b'"@deep@"', nested(levels - ABOVE))
    assert len({compact, pretty, reordered}) == 3
    digests = {decode_record(raw, max_bytes=MAX).digest for raw in (compact, pretty, reordered)}
    assert len(digests) == 1
    other = compact.replace(b"18446744073709551615", b"18446744073709551614")
    assert decode_record(other, max_bytes=MAX).digest not in digests


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1024])
def test_deeper_than_max_depth_is_too_deep_naming_depth_and_limit(levels: int) -> None:
    got = decode_record(body(levels), max_bytes=MAX)
    assert isinstance(got, Rejection)
    assert got.reason == TOO_DEEP
    assert got.detail == (f"event is nested {levels} levels deep (objects and arrays within one another), "
                          f"over the limit of {MAX_DEPTH} levels")


@pytest.mark.parametrize("levels", [1025, 100_000])
def test_deeper_than_the_parser_reads_is_too_deep(levels: int) -> None:
    got = decode_record(b"[" * levels + b"]" * levels, max_bytes=1 << 20)
    assert isinstance(got, Rejection)
    assert got.reason == TOO_DEEP
    assert "more than 1024 levels" in got.detail and f"limit of {MAX_DEPTH} levels" in got.detail


def test_a_deep_event_with_a_bad_field_gets_the_fields_reason() -> None:
    raw = body(MAX_DEPTH + 10).replace(RUN_ID.encode(), b"not-a-uuid")
    assert decode_record(raw, max_bytes=MAX).reason == INVALID_VALUE


def test_the_decode_worker_answers_as_decode_does() -> None:
    values = [body(255), body(MAX_DEPTH), body(MAX_DEPTH + 1), b"[" * 2000 + b"]" * 2000]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        answers = worker.decode(values, timeout_s=120)
    finally:
        worker.close()
    assert not worker.in_process  # answered by the child
    for got, value in zip(answers, values, strict=True):
        want = decode_record(value, max_bytes=MAX)
        if isinstance(want, Rejection):
            assert got == want
        else:
            assert (got.digest, got.body, got.run_id) == (want.digest, want.body, want.run_id)


@pytest.fixture
def avro_codec(monkeypatch):
    """Stands in for producer.codec.avro: decode() returns what the test sets."""
    codec = types.ModuleType("producer.codec.avro")
    package = types.ModuleType("producer.codec")
    package.avro = codec
    root = types.ModuleType("producer")
    root.codec = package
    for name, module in (("producer", root), ("producer.codec", package), ("producer.codec.avro", codec)):
        monkeypatch.setitem(sys.modules, name, module)
    return codec


def test_a_deep_avro_record_is_written_as_json_and_accepted(avro_codec) -> None:
    json_body = body(600)
    avro_codec.decode = lambda value: orjson.loads(json_body)
    # As long as a real record of it would be: its JSON is bounded by its size (avro_body_bound).
    got = decode_record(decode.AVRO_MARKER + b"\x00" * len(json_body), max_bytes=MAX)
    assert isinstance(got, LineageEvent), got
    assert got.digest == decode_record(json_body, max_bytes=MAX).digest
    # orjson's JSON, keys in their order: what the Avro record holds, written at any depth.
    as_written = nested(600 - ABOVE).replace(b"\\u00e9", "\u00e9".encode())
    assert got.body == orjson.dumps(event()).replace(b'"@deep@"', as_written)


def test_a_too_deep_avro_record_is_too_deep(avro_codec) -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH + 20):
        deep = [deep]
    avro_codec.decode = lambda value: event(deep)
    got = decode_record(decode.AVRO_MARKER + b"\x00", max_bytes=MAX)
    assert isinstance(got, Rejection) and got.reason == TOO_DEEP
    assert f"nested {MAX_DEPTH + 20 + ABOVE} levels deep" in got.detail
