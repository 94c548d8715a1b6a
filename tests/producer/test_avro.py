"""Avro single-object codec: lossless for every spec example, readable by the relay."""

from __future__ import annotations

import json

import orjson
import pytest

from producer import events
from producer.codec import avro, encode_json
from relay.stages.decode import decode_record
from tests.support.spec import default_spec_dir, validator


def _examples() -> list[tuple[str, dict]]:
    root = default_spec_dir() / "examples"
    return [(str(p.relative_to(root)), json.loads(p.read_text())) for p in sorted(root.rglob("*.json"))]


def test_every_spec_example_round_trips_losslessly():
    examples = _examples()
    assert len(examples) > 40
    for name, doc in examples:
        data = avro.encode(doc)
        assert avro.is_single_object(data)
        back = avro.decode(data)
        assert back == doc, name
        # Same JSON types too (1 stays 1, 1.0 stays 1.0): the canonical bytes are equal.
        assert orjson.dumps(back, option=orjson.OPT_SORT_KEYS) == orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _facet_examples_as_events() -> list[dict]:
    """Each facet example placed where it belongs in a realistic RunEvent."""
    out = []
    for name, doc in _examples():
        if name == "example_full_event.json":
            out.append(doc)
            continue
        kind = name.split("/")[0]
        run_facets, job_facets, ds_facets = {}, {}, {}
        target = run_facets if "Run" in kind else job_facets if "Job" in kind else ds_facets
        target.update(doc)
        out.append(events.run_event(
            "COMPLETE", run_id=events.new_run_id(), job_namespace="spark://cluster", job_name="etl.orders",
            inputs=[events.dataset("s3://bucket", "raw/orders", ds_facets)],
            outputs=[events.dataset("postgres://db:5432", "public.orders")],
            run_facets=run_facets, job_facets=job_facets))
    return out


def test_avro_is_smaller_than_json_for_realistic_events(record_property):
    docs = _facet_examples_as_events()
    json_bytes = sum(len(encode_json(d)) for d in docs)
    avro_bytes = sum(len(avro.encode(d)) for d in docs)
    assert all(avro.decode(avro.encode(d)) == d for d in docs)
    ratio = avro_bytes / json_bytes
    record_property("avro_json_size_ratio", round(ratio, 3))
    print(f"avro/json size ratio over {len(docs)} events: {ratio:.3f} ({avro_bytes}/{json_bytes} bytes)")
    assert ratio < 0.9


def test_anything_json_survives_including_odd_and_invalid_events():
    odd = {
        "eventTime": None, "eventType": "WEIRD", "extra": 1, "facetTypes": [],
        "run": {"runId": 5, "facets": None},
        "job": {"namespace": "a", "name": "b", "x": 1,
                "facets": {"f": {"_producer": 3, "a": [1, 2.0, True, None, {"z": "é"}]}}},
        "inputs": [{"name": "only-name", "facets": {}}], "outputs": "not-a-list",
        "dataset": {"namespace": "a", "name": "b", "foo": None},
        "big": 2**63 - 1, "small": -(2**63), "float": 1.5, "empty": {}, "list": [],
    }
    assert avro.decode(avro.encode(odd)) == odd


def test_what_json_cannot_carry_is_refused_at_encode():
    for bad in ({"o": object()}, {"d": {(1, 2): "tuple key"}}, {"n": 2**64, "o": object()}):
        for encode in (avro.encode, encode_json):
            with pytest.raises(TypeError):
                encode(bad)
    for encode in (avro.encode, encode_json):   # NaN where json.dumps writes the event: no JSON reader takes it
        with pytest.raises(ValueError):
            encode({"n": 2**64, "f": float("nan")})
    with pytest.raises(ValueError):
        avro.encode(["not", "an", "object"])  # type: ignore[arg-type]


def test_what_the_official_client_writes_is_written_by_both_encodings():
    """Integers beyond 64 bits and dict keys that are not strings: openlineage-python's
    Serde.to_json (json.dumps) writes them, and so do both encodings, as json.dumps does."""
    run_id = events.new_run_id()
    facet = events.custom_facet({"total": 2**64 + 1, "negative": -(2**70), "histogram": {1: 3, 2.5: 4, None: 0}},
                                schema_url="https://example.com/stats.json")
    event = events.run_event("COMPLETE", run_id=run_id, job_namespace="n", job_name="j",
                             run_facets={"stats": facet}, job_facets={7: events.custom_facet({"a": 1}, schema_url="https://example.com/a.json")})
    expected = json.loads(json.dumps(event))
    assert json.loads(encode_json(event)) == expected
    assert json.loads(encode_json(event))["run"]["facets"]["stats"]["total"] == 2**64 + 1
    assert encode_json({"a": 2**64, "b": "é"}) == '{"a":18446744073709551616,"b":"é"}'.encode()
    record = avro.to_record(event)   # facets travel as JSON text: exactly what json.dumps writes
    assert {k: json.loads(v) for k, v in record["run"][1]["facets"][1].items()} == expected["run"]["facets"]
    back = avro.decode(avro.encode(event))
    assert back["job"]["facets"] == expected["job"]["facets"]
    # Read back as the integers they were, not orjson's nearest floats.
    assert back["run"]["facets"] == expected["run"]["facets"]
    stats = back["run"]["facets"]["stats"]
    assert (stats["total"], stats["negative"]) == (2**64 + 1, -(2**70))
    assert type(stats["total"]) is int and type(stats["negative"]) is int
    validator().validate(json.loads(encode_json(event)))


def _big_int_event(n: int) -> dict:
    return {"eventType": "RUNNING", "eventTime": "2024-01-01T00:00:00Z", "producer": "https://p",
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": "3f5e83fa-3480-44ff-99c5-ff943904e5e8", "facets": {"stats": {
                "_producer": "https://p", "_schemaURL": "https://example.com/stats.json", "bytesWritten": n}}},
            "job": {"namespace": "n", "name": "j", "facets": {"x": {"_producer": "https://p",
                                                                    "_schemaURL": "https://example.com/x.json"}}},
            "inputs": [{"namespace": "n", "name": "d", "inputFacets": {"q": {
                "_producer": "https://p", "_schemaURL": "https://example.com/q.json", "v": [n, -n, 1.5]}}, "odd": n}],
            "custom": {"n": n}}


@pytest.mark.parametrize("n", [2**64, 2**70, -(2**63) - 1, 10**300])
def test_integers_beyond_64_bits_are_read_back_exactly_and_the_relay_tells_them_apart(n):
    """In facets and in `extra` (unknown keys), at every level: as the JSON encoding keeps them."""
    other = n + 1 if n > 0 else n - 1   # beyond 64 bits too
    for value in (n, other):
        event = _big_int_event(value)
        validator().validate(event)
        back = avro.decode(avro.encode(event))
        assert back == event and json.dumps(back, sort_keys=True) == json.dumps(event, sort_keys=True)
        assert type(back["run"]["facets"]["stats"]["bytesWritten"]) is int
        assert back["inputs"][0]["inputFacets"]["q"]["v"][1] == -value and back["custom"]["n"] == value
    relay = [decode_record(encode(_big_int_event(value)), max_bytes=1 << 20)
             for encode in (avro.encode, encode_json) for value in (n, other)]
    assert all(e.big_int for e in relay)     # what rebuilds the event reads its body exactly
    avro_n, avro_n1, json_n, json_n1 = relay
    assert avro_n.digest != avro_n1.digest   # not deduplicated as one event
    assert (avro_n.digest, avro_n1.digest) == (json_n.digest, json_n1.digest)
    assert avro_n.doc == json_n.doc and json.loads(bytes(avro_n.body)) == _big_int_event(n)


def test_an_event_without_big_integers_is_not_marked_big_int():
    event = _big_int_event(2**63 - 1)
    assert avro.decode(avro.encode(event)) == event
    assert not decode_record(avro.encode(event), max_bytes=1 << 20).big_int


def _record_with(path: str, text: str) -> bytes:
    """An Avro record whose JSON text at ``path`` (run.facets.<name> or extra) is ``text``."""
    import io

    import fastavro

    record = avro.to_record(_big_int_event(1))
    if path == "extra":
        record["extra"] = text
    else:
        record["run"][1]["facets"][1][path.rsplit(".", 1)[1]] = text
    buf = io.BytesIO()
    buf.write(avro.MAGIC + avro.FINGERPRINT.to_bytes(8, "little"))
    fastavro.schemaless_writer(buf, avro._PARSED, record)
    return buf.getvalue()


@pytest.mark.parametrize("path", ["run.facets.stats", "extra"])
def test_json_text_orjson_refuses_is_unsupported_json_as_for_the_same_event_sent_as_json(path):
    huge = {"n": 10**310}
    as_json = decode_record(encode_json({**_big_int_event(1), "custom": huge}), max_bytes=1 << 20)
    assert as_json.reason == "unsupported_json"
    for text, word in ((json.dumps(huge), "number is infinity"), ('{"s":"\\ud800"}', "surrogate")):
        data = _record_with(path, text)
        with pytest.raises(avro.UnsupportedJsonText, match=word) as err:
            avro.decode(data)
        assert err.value.where == path and isinstance(err.value, avro.AvroDecodeError)
        rejection = decode_record(data, max_bytes=1 << 20)
        assert rejection.reason == "unsupported_json", rejection.detail
        assert rejection.detail.startswith(f"Avro record holds, in the JSON text of {path}, a ")
        assert word in rejection.detail and "I-JSON (RFC 7493) forbids both" in rejection.detail
    with pytest.raises(avro.UnsupportedJsonText, match="^extra JSON text: number is infinity"):
        avro.decode(avro.encode({**_big_int_event(1), "custom": huge}))  # what encode writes of it
    # JSON text that is not JSON at all is still a corrupt record.
    rejection = decode_record(_record_with(path, '{"n": 1e400'), max_bytes=1 << 20)
    assert rejection.reason == "undecodable" and "corrupt Avro body" in rejection.detail


def test_a_huge_integer_in_a_facet_is_unsupported_json_in_both_encodings():
    event = _big_int_event(10**310)
    json_rejection = decode_record(encode_json(event), max_bytes=1 << 20)
    avro_rejection = decode_record(avro.encode(event), max_bytes=1 << 20)
    assert json_rejection.reason == avro_rejection.reason == "unsupported_json"
    assert "a number beyond the range of a 64-bit float" in avro_rejection.detail


@pytest.mark.parametrize("event_type", [*avro.EVENT_TYPES, None])
def test_peek_event_type_reads_the_enum_without_decoding(event_type):
    event = {"eventTime": "t" * 300, "producer": "p", "schemaURL": "s" * 70, "run": {"runId": "r"}}
    if event_type is not None:
        event["eventType"] = event_type
    data = avro.encode(event)
    assert avro.peek_event_type(data) == event_type
    assert avro.peek_event_type(memoryview(data)) == event_type
    for extra in ({"eventType": "start"}, {"eventType": 1}, {"eventTime": 5}):
        assert avro.peek_event_type(avro.encode({**event, **extra})) == (
            None if "eventType" in extra else event_type)


def test_peek_event_type_refuses_what_is_not_this_schemas_record():
    data = avro.encode(_big_int_event(1))
    for bad in (data[:10], data[:12], b"\xc3\x01" + bytes(8) + data[10:], b"{}", data[:10] + b"\xff" * 12):
        with pytest.raises(avro.AvroDecodeError):
            avro.peek_event_type(bad)


@pytest.mark.parametrize("data, message", [
    (b"", "not Avro single-object encoded"),
    (b'{"eventType": "START"}', "not Avro single-object encoded"),
    (b"\xc3\x01\x00\x01", "truncated single-object header"),
    (b"\xc3\x01" + bytes(8) + b"\x00", "unknown Avro schema fingerprint 0000000000000000"),
])
def test_bad_input_raises_a_clear_error(data, message):
    with pytest.raises(avro.AvroDecodeError, match=message):
        avro.decode(data)


def test_corrupt_and_trailing_bytes_are_detected():
    data = avro.encode(_examples()[-1][1])
    with pytest.raises(avro.AvroDecodeError, match="corrupt Avro body"):
        avro.decode(data[:-5])
    with pytest.raises(avro.AvroDecodeError, match="2 trailing bytes"):
        avro.decode(data + b"zz")
    assert isinstance(avro.AvroDecodeError("x"), ValueError)


def test_the_fingerprint_is_the_spec_crc64_of_the_canonical_schema():
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    canonical = to_parsing_canonical_form(avro._PARSED)
    # fastavro renders the 8 bytes in wire (little-endian) order.
    assert fingerprint(canonical, "CRC-64-AVRO") == avro.FINGERPRINT.to_bytes(8, "little").hex()
    assert avro.encode({})[:10] == avro.MAGIC + avro.FINGERPRINT.to_bytes(8, "little")


def test_the_relay_decodes_both_encodings_to_the_same_event():
    event = _facet_examples_as_events()[0]
    from_json = decode_record(encode_json(event), max_bytes=1 << 20)
    from_avro = decode_record(avro.encode(event), max_bytes=1 << 20)
    assert from_json.doc == from_avro.doc == event
