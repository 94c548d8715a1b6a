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
