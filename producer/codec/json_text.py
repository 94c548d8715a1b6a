"""Reading JSON text without losing an integer beyond 64 bits.

orjson reads an integer literal beyond 64 bits (``1180591620717411303424``) as the nearest
float, which neither encoding writes back as the integer it was. :func:`loads` is
``orjson.loads`` except that it keeps such an integer. It lives here, in the producer's
codec package, because both sides read JSON text: the producer (an event given to
``emit`` as text, the facets and ``extra`` of an Avro record) and the relay
(:mod:`relay.stages.json_bytes` re-exports it), and the producer must not import the relay.

Finding one costs a scan of the bytes (~1.5 us for 3.5 KB), and reading it again the
stdlib's parser, only when one is there.

orjson also refuses two things RFC 8259's grammar allows (I-JSON, RFC 7493, forbids
both): a lone UTF-16 surrogate escape (``"\\ud800"``) and a number beyond a 64-bit float
(``1e400``, an integer of 310 digits). :func:`unsupported` tells such a refusal from
text that is not JSON at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# The integers orjson reads and writes as integers.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
# Digits to "0", every other byte to " ": an integer beyond 64 bits has at least 19 digits.
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN = b"0" * 19
_LONG_NUMBER = re.compile(rb"-?[0-9]{19,}")

#: orjson's message for a number beyond a 64-bit float (1e400, an integer of 310 digits).
OUT_OF_RANGE = "number is infinity when parsed as double"
#: orjson's messages (their beginnings) for text RFC 8259's grammar allows that it refuses.
NOT_CARRIED = ("no low surrogate in string", "invalid high surrogate in string", "invalid low surrogate in string",
               OUT_OF_RANGE)


class UnsupportedJson(ValueError):
    """JSON text at ``where`` holds what orjson refuses though RFC 8259 allows it
    (:data:`NOT_CARRIED`); ``message`` is orjson's. The Avro codec raises its subclass
    ``producer.codec.avro.UnsupportedJsonText``, which the relay catches as this (the
    relay's decode need not import the codec, nor fastavro, to name it)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where} JSON text: {message}")
        self.where = where
        self.message = message


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads(data)`` (its errors too), except that an integer beyond 64 bits is
    read as that integer, not the nearest float; see :func:`exact`."""
    doc = orjson.loads(data)
    found = exact(data)
    return doc if found is None else found


def exact(original: bytes | bytearray | memoryview | str) -> Any:
    """``original`` (JSON orjson reads) read again keeping its integers beyond 64 bits, or
    None when it holds none. Not kept, the nearest float (None), when the stdlib's parser
    cannot read it: nested deeper than Python's recursion limit (~1000 levels; decode
    accepts 1000), or an integer of more than ``sys.get_int_max_str_digits()`` (4300) digits."""
    if not has_big_int(original):
        return None
    try:
        return json.loads(original if not isinstance(original, memoryview) else bytes(original))
    except (RecursionError, ValueError):
        return None


def has_big_int(data: bytes | bytearray | memoryview | str) -> bool:
    """Whether ``data`` may hold an integer literal beyond 64 bits: true for one, and for
    a long run of digits that is none (in a string, a float's fraction), never false for
    one. A scan of the bytes (~1.5 us for 3.5 KB): for the paths that rebuild an event.
    ``data`` need not be JSON: any bytes that hold JSON text verbatim (an Avro record, whose
    strings are UTF-8) hold its integers as runs of digits, which bytes around can only
    lengthen."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _LONG_RUN not in raw.translate(_DIGITS):
        return False
    for match in _LONG_NUMBER.finditer(raw):
        digits = match.group()
        if len(digits) > 21 or not _INT_MIN <= int(digits) <= _INT_MAX:
            return True
    return False


def unsupported(text: str, err: orjson.JSONDecodeError) -> bool:
    """Whether orjson's refusal ``err`` of ``text`` is one of text RFC 8259 allows
    (:data:`NOT_CARRIED`), ``text`` being JSON by the stdlib's grammar. Only on failure."""
    return str(err).startswith(NOT_CARRIED) and is_json(text)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def is_json(text: str) -> bool:
    """Whether ``text`` is JSON by RFC 8259's grammar (the stdlib's parser reads lone
    surrogates and numbers of any size; its NaN and Infinity are refused). Only on failure."""
    try:
        json.loads(text, parse_int=len, parse_float=len, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return False
    return True
