"""json_bytes with integers beyond 64 bits: written exactly, read back exactly."""

from __future__ import annotations

import orjson
import pytest

from relay.stages.json_bytes import dumps, exact, has_big_int, loads, may_hold_big_int
from tests.relay.stages.test_json_bytes import chain, events, stress_doc

SORT = orjson.OPT_SORT_KEYS
BIG = 340282366920938463463374607431768211455  # 2**128 - 1
EDGES = [2**64, -(2**63) - 1, BIG, -BIG, 10**400]


def spelt(doc: dict, big: int, option: int) -> bytes:
    """``doc`` holding ``big`` at "@big@", as orjson would write it without its 64-bit limit."""
    return orjson.dumps(doc, option=option).replace(b'"@big@"', str(big).encode())


@pytest.mark.parametrize("option", [0, SORT], ids=["insertion-order", "sort-keys"])
@pytest.mark.parametrize("big", EDGES)
def test_an_integer_beyond_64_bits_is_written_exactly_and_the_rest_as_orjson_writes_it(option: int, big: int):
    for doc in events():
        holder = {**doc, "facet": {"z": 1.5, "id": "@big@", "a": [1e16, "@big@", {"n": "@big@"}]}}
        with_big = orjson.loads(orjson.dumps(holder).replace(b'"@big@"', b'"x"'))
        with_big["facet"]["id"] = with_big["facet"]["a"][1] = with_big["facet"]["a"][2]["n"] = big
        assert dumps(with_big, option) == spelt(holder, big, option)
        assert dumps(big, option) == str(big).encode()
        deep = chain(300, with_big, "mixed")  # beyond what orjson writes, too
        assert dumps(deep, option) == dumps(chain(300, "@big@", "mixed"), option).replace(
            b'"@big@"', dumps(with_big, option))


def test_integers_at_the_64_bit_edges_are_still_orjsons():
    for value in (2**64 - 1, -(2**63), 0, -1):
        assert dumps({"n": value}) == orjson.dumps({"n": value})
    assert orjson.loads(dumps(stress_doc(), SORT)) == orjson.loads(orjson.dumps(stress_doc(), option=SORT))


def test_loads_keeps_integers_beyond_64_bits_and_strings_as_strings():
    text = (b'{"id": 340282366920938463463374607431768211455, "neg": -9223372036854775809, '
            b'"s": "340282366920938463463374607431768211455", "f": 1.234567890123456789012, '
            b'"ns": 1700000000000000000, "u64": 18446744073709551615}')
    doc = loads(text)
    assert doc == {"id": BIG, "neg": -(2**63) - 1, "s": "340282366920938463463374607431768211455",
                   "f": 1.234567890123456789012, "ns": 1700000000000000000, "u64": 2**64 - 1}
    assert type(doc["s"]) is str and type(doc["f"]) is float
    assert orjson.loads(text)["id"] != BIG  # what orjson alone reads: the nearest float
    assert loads(memoryview(text)) == doc and loads(text.decode()) == doc


def test_loads_is_orjsons_for_everything_else():
    for doc in events():
        raw = orjson.dumps(doc)
        assert exact(raw) is None and loads(raw) == orjson.loads(raw)
    with pytest.raises(orjson.JSONDecodeError):
        loads(b'{"n": NaN}')  # json.loads would take it; orjson's errors stay
    with pytest.raises(orjson.JSONDecodeError):
        loads(b'{"n": 340282366920938463463374607431768211455')


def test_detection():
    assert has_big_int(b'[18446744073709551616]') and has_big_int(b'[-9223372036854775809]')
    assert not has_big_int(b'[18446744073709551615, -9223372036854775808, 1700000000000000000]')
    assert may_hold_big_int(orjson.dumps(orjson.loads(b'[340282366920938463463374607431768211455]')))
    assert may_hold_big_int(orjson.dumps(orjson.loads(b'[-9223372036854775809]')))
    assert not any(may_hold_big_int(orjson.dumps(doc)) for doc in events()[2:])  # Spark events: no false alarm


def test_orjson_writes_the_plus_of_a_positive_exponent():
    # may_hold_big_int looks for "e+": orjson before 3.11.7 wrote 1.8446744073709552e19, and
    # with it every integer beyond 64 bits would silently become the nearest float again.
    # pyproject.toml requires orjson>=3.12 (past 3.11.7); if a later orjson writes exponents otherwise,
    # this fails rather than the feature.
    assert orjson.dumps(2.0**64) == b"1.8446744073709552e+19"
    assert orjson.dumps(orjson.loads(b"-9223372036854775809")) == b"-9.223372036854776e+18"
    for text in (b"[18446744073709551616]", b"[-9223372036854775809]", b"[1" + b"0" * 300 + b"]"):
        assert may_hold_big_int(orjson.dumps(orjson.loads(text))), text


def test_may_hold_big_int_alarms_only_for_a_float_of_9e18_or_more():
    for written in (b'{"q":"SELECT price+tax FROM t"}', b'{"t":"2024-05-01T00:00:00+00:00"}', b"[1e+16]",
                    b"[1.5e+17]", b'["e+19"]', b'["+e+19"]', b"[1e-19]", b"+", b"e+", b"e+19", b""):
        assert not may_hold_big_int(written), written
    for written in (b"[9.223372036854776e+18]", b"[1e+19]", b"[-3.4e+38]", b"[1e+100]", b"[1e+308]",
                    b'{"q":"a+b","n":1.8e+19}', b"1e+19", b'["a 1e+25 b"]'):
        assert may_hold_big_int(written), written
    # A "+" at index 0 or 1 does not end the search.
    assert may_hold_big_int(b"+1e+19") and may_hold_big_int(b"a+1e+19") and may_hold_big_int(b"++9e+18")
