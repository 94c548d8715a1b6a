"""json_bytes.dumps: orjson's bytes, byte for byte, at depths orjson refuses to write."""

from __future__ import annotations

import random
from datetime import datetime

import orjson
import pytest

from relay.embedded.sample import spark_run
from relay.stages.json_bytes import ORJSON_WRITE_DEPTH, TooDeep, dumps, dumps_deep, nesting
from tests.support.spec import default_spec_dir

SORT = orjson.OPT_SORT_KEYS


def stress_doc() -> dict:
    """What could make a writer differ from orjson: keys in many scripts and planes (their
    sort order), escapes, floats in every notation, integers at the 64-bit edges."""
    return {
        "z": 1, "Z": 2, "a": 3, "é": 4, "e\u0301": 5, "ß": 6, "ｚ": 7, "😀": 8, "\uffff": 9, "": 10,
        "\u00a0": 11, "日本": 12, "a\u0000b": 13,
        "strings": ["", "quote \" backslash \\ slash /", "\b\f\n\r\t\u0001\u001f\u007f", "\u2028\u2029",
                    "é 日本 😀 \U0010ffff", "<script>&amp;</script>"],
        "floats": [0.1, -0.0, 1.0, 1e-7, 1.5e-10, 1e16, 1e22, 1.7976931348623157e308, 5e-324, 123456.789,
                   -2.5e-5, 3.141592653589793],
        "ints": [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1],
        "others": [True, False, None, [], {}, [[]], [{}], {"": {}}],
    }


def events() -> list[dict]:
    docs = [stress_doc(), orjson.loads((default_spec_dir() / "examples" / "example_full_event.json").read_bytes())]
    docs += spark_run("spark-prod", "orders_etl.daily", start=datetime(2024, 5, 1),
                      rng=random.Random(3), with_running=1)
    return [orjson.loads(orjson.dumps(doc)) for doc in docs]  # as parsed: JSON types only


@pytest.mark.parametrize("option", [0, SORT], ids=["insertion-order", "sort-keys"])
@pytest.mark.parametrize("write_depth", [0, 1, 3])
def test_joined_containers_are_byte_identical_to_orjson(option: int, write_depth: int) -> None:
    # write_depth 0: every object and array is joined here, only strings and numbers by orjson.
    for doc in events():
        assert dumps_deep(doc, option, write_depth=write_depth) == orjson.dumps(doc, option=option)


def chain(levels: int, leaf: object, shape: str) -> object:
    value = leaf
    for i in range(levels):
        value = [value] if shape == "arrays" or (shape == "mixed" and i % 2) else {"k": value, "b": i}
    return value


def written(levels: int, leaf: bytes, shape: str) -> bytes:
    """``chain(levels, ...)`` as orjson would write it sorted, spelt out by hand."""
    text = leaf
    for i in range(levels):
        text = b"[" + text + b"]" if shape == "arrays" or (shape == "mixed" and i % 2) else \
            b'{"b":' + str(i).encode() + b',"k":' + text + b"}"
    return text


@pytest.mark.parametrize("shape", ["arrays", "objects", "mixed"])
@pytest.mark.parametrize("levels", [ORJSON_WRITE_DEPTH, ORJSON_WRITE_DEPTH + 1, 600, 1000])
def test_deep_value_is_written_as_orjson_would_without_its_limit(shape: str, levels: int) -> None:
    for doc in events()[:2]:
        deep = {**doc, "deep": chain(levels, doc, shape), "zz": "after"}
        # The oracle: orjson's own canonical text, the deep part replaced by its spelling.
        expected = orjson.dumps({**deep, "deep": "@deep@"}, option=SORT).replace(
            b'"@deep@"', written(levels, orjson.dumps(doc, option=SORT), shape))
        assert dumps(deep, SORT) == expected
        assert dumps(orjson.loads(dumps(deep)), SORT) == expected  # (== on the trees would recurse)
    if levels > ORJSON_WRITE_DEPTH:
        with pytest.raises(orjson.JSONEncodeError):
            orjson.dumps(chain(levels, 1, shape))  # the limit this works around is still there


def test_nesting_and_max_depth() -> None:
    assert [nesting(v) for v in ("x", 1, None, [], {}, [[]], {"a": [1, {"b": {}}]})] == [0, 0, 0, 1, 1, 2, 4]
    deep = chain(400, 1, "mixed")
    assert nesting(deep) == 400
    assert dumps(deep, max_depth=400) == dumps(deep)
    with pytest.raises(TooDeep) as err:
        dumps(deep, max_depth=399)
    assert (err.value.depth, err.value.limit) == (400, 399)


def test_no_recursion_at_any_depth() -> None:
    deep = chain(50_000, "bottom", "arrays")
    assert dumps(deep) == b"[" * 50_000 + b'"bottom"' + b"]" * 50_000


def test_orjson_refusals_are_raised_as_orjson_raises_them() -> None:
    for bad in ({1: "int key"}, {"s": {1, 2}}):
        with pytest.raises(orjson.JSONEncodeError) as shallow:
            dumps(bad)
        with pytest.raises(orjson.JSONEncodeError) as deep:
            dumps(chain(300, bad, "mixed"))
        assert str(deep.value) == str(shallow.value)


def test_a_value_that_contains_itself_raises_instead_of_looping() -> None:
    loop: list = []
    loop.append({"again": loop})
    with pytest.raises(orjson.JSONEncodeError, match="circular"):
        dumps(loop)


def test_shared_subtrees_are_written_at_each_place() -> None:
    shared = chain(300, "x", "arrays")
    assert dumps({"a": shared, "b": shared}) == orjson.dumps({"a": "@", "b": "@"}).replace(
        b'"@"', b"[" * 300 + b'"x"' + b"]" * 300)
