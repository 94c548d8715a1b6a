"""Record value encodings: JSON (the default, what the official OpenLineage Kafka
transports write) and Avro single-object encoding (:mod:`producer.codec.avro`).

A reader tells them apart by the first two bytes: Avro single-object records start with
``C3 01``, which no UTF-8 JSON text can (see :func:`producer.codec.avro.is_single_object`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

import orjson

Encoding = Literal["json", "avro"]
ENCODINGS: tuple[str, ...] = ("json", "avro")


def encode_json(event: dict) -> bytes:
    """Compact UTF-8 JSON. Whatever the official client's ``Serde.to_json`` (``json.dumps``)
    writes is written: dict keys that are not strings (int, float, bool, None: as
    ``json.dumps`` writes them) and integers beyond 64 bits, which orjson refuses (then
    ``json.dumps`` writes the event). Raises ``TypeError`` or ``ValueError`` for values JSON
    cannot carry (NaN and infinities are written as ``null``, as orjson writes them, unless
    ``json.dumps`` is needed: then they raise)."""
    try:
        return orjson.dumps(event, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json_dumps(event).encode("utf-8")


def json_dumps(value: object) -> str:
    """``json.dumps`` as compact as orjson's output, for what orjson refuses (integers beyond
    64 bits). NaN and infinities raise ``ValueError``: no JSON reader takes ``NaN``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encoder(encoding: str) -> Callable[[dict], bytes]:
    """The event encoder for a ProducerConfig ``encoding`` (Avro imported only when used)."""
    if encoding == "avro":
        from producer.codec import avro

        return avro.encode
    return encode_json
