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
