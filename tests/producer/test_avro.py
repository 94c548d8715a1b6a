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
    assert avro.decode(avro.encode(event))["job"]["facets"] == expected["job"]["facets"]
    validator().validate(json.loads(encode_json(event)))


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
