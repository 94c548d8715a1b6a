"""Rewriter: a rebuilt event carries its integers beyond 64 bits exactly (orjson reads one
as the nearest float), and an event without one is rebuilt as before."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import orjson
import pytest

from relay.embedded.sample import CUSTOM_RUN_FACET_SCHEMA_URL, PRODUCER_URI, spark_run
from relay.stages.rewrite import Rewriter
from relay.stages.rewrite_config import RewriteConfig

START = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
BIG = "340282366920938463463374607431768211455"  # 2**128 - 1
NEG = "-9223372036854775809"  # one below the smallest 64-bit integer
CONFIGS = {
    "namespace_map": {"namespace_map": [{"from": "spark-*", "to": "analytics"}]},
    "redaction": {"redact_credentials": True},
    # The limit is the size with big ints, less 10 bytes: the sql facet goes, in either case.
    "shrinking": {"shrink_order": ["sql"]},
}


def complete_event() -> dict:
    doc = spark_run("spark-prod", "orders_etl.insert.orders_daily", start=START, rng=random.Random(11),
                    with_running=False)[-1]
    doc["job"]["facets"]["sql"] = {"_producer": PRODUCER_URI, "_schemaURL": CUSTOM_RUN_FACET_SCHEMA_URL,
                                   "query": "SELECT * FROM jdbc:postgresql://etl:hunter2@db/orders"}
    doc["run"]["facets"]["trace"] = {"_producer": PRODUCER_URI, "_schemaURL": CUSTOM_RUN_FACET_SCHEMA_URL,
                                     "id": "@id@", "offset": "@neg@", "label": BIG, "seq": [1, "@id@"]}
    return doc


def with_big_ints(doc: dict) -> bytes:
    return orjson.dumps(doc).replace(b'"@id@"', BIG.encode()).replace(b'"@neg@"', NEG.encode())


def rewritten(name: str, original: bytes) -> bytes:
    config = CONFIGS[name]
    if name == "shrinking":
        config = {**config, "max_event_bytes": len(with_big_ints(complete_event())) - 10}
    result = Rewriter(RewriteConfig.model_validate(config)).apply(orjson.loads(original), original=original)
    assert result.rejection is None and result.body is not None and result.body is not original
    return result.body


@pytest.mark.parametrize("name", CONFIGS)
def test_a_rebuilt_event_keeps_its_integers_beyond_64_bits_exactly(name: str) -> None:
    doc = complete_event()
    original = with_big_ints(doc)
    body = rewritten(name, original)
    assert b'"id":' + BIG.encode() + b',"offset":' + NEG.encode() in body
    assert b'"seq":[1,' + BIG.encode() + b"]" in body
    assert b'"label":"' + BIG.encode() + b'"' in body  # in a string: still a string
    assert b"e+" not in body  # no integer became a float
    # The rest is what the same rewrite makes of the event without them, byte for byte.
    if name == "shrinking":  # without the big ints it fits: what it drops is known
        del doc["job"]["facets"]["sql"]
        expected = orjson.dumps(doc)
    else:
        expected = rewritten(name, orjson.dumps(doc))
    assert body == expected.replace(b'"@id@"', BIG.encode()).replace(b'"@neg@"', NEG.encode())


@pytest.mark.parametrize("name", CONFIGS)
def test_an_event_without_one_is_rebuilt_as_orjson_writes_it(name: str) -> None:
    doc = complete_event()
    doc["run"]["facets"]["trace"].update(id=2**64 - 1, offset=-(2**63), seq=[1.5e300, 1e16],
                                         pad="x" * (len(BIG) + len(NEG)))
    original = orjson.dumps(doc)
    body = rewritten(name, original)
    rebuilt = orjson.loads(body)
    assert body == orjson.dumps(rebuilt)  # orjson's bytes, as before
    assert rebuilt["run"]["facets"].get("trace", {}).get("seq", [1.5e300, 1e16]) == [1.5e300, 1e16]


U64_PLUS_ONE = b"18446744073709551616"  # 2**64: 20 digits, 22 bytes as orjson's float


@pytest.mark.parametrize("shrink_order", [["trace"], ["no-such-facet"]], ids=["may-drop-it", "drops-nothing"])
def test_an_event_that_fits_with_its_exact_integers_is_neither_trimmed_nor_refused(shrink_order: list) -> None:
    # As floats, the integers make the event 20 bytes longer than it is: too large.
    doc = complete_event()
    doc["run"]["facets"]["trace"] = {"_producer": PRODUCER_URI, "_schemaURL": CUSTOM_RUN_FACET_SCHEMA_URL,
                                     "ids": ["@id@"] * 10}
    original = orjson.dumps(doc).replace(b'"@id@"', U64_PLUS_ONE)
    config = {"namespace_map": [{"from": "spark-prod", "to": "spark-PROD"}],  # the same length
              "max_event_bytes": len(original), "shrink_order": shrink_order}
    result = Rewriter(RewriteConfig.model_validate(config)).apply(orjson.loads(original), original=original)
    assert result.rejection is None and result.dropped == []
    assert result.body is not None and len(result.body) == len(original)
    assert b'"ids":[' + b",".join([U64_PLUS_ONE] * 10) + b"]" in result.body
    assert b'"namespace":"spark-PROD"' in result.body


def test_an_event_decode_found_none_in_is_not_looked_at_again(monkeypatch) -> None:
    import relay.stages.rewrite as rewrite

    def exact(original: bytes) -> None:
        raise AssertionError("the original bytes were scanned")
    monkeypatch.setattr(rewrite, "exact", exact)
    doc = complete_event()
    doc["run"]["facets"]["trace"]["id"] = 1.5e300  # what an integer beyond 64 bits looks like to orjson
    original = orjson.dumps(doc)
    mapping = {"namespace_map": [{"from": "spark-*", "to": "analytics"}]}
    rebuilt = Rewriter(RewriteConfig.model_validate(mapping)).apply(
        orjson.loads(original), original=original, big_int=False)
    assert b'"id":1.5e+300' in rebuilt.body
    refused = Rewriter(RewriteConfig.model_validate({**mapping, "max_event_bytes": 1024,
                                                     "shrink_order": ["no-such-facet"]})).apply(
        orjson.loads(original), original=original, big_int=False)
    assert refused.rejection is not None
