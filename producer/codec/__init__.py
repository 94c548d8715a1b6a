"""Record value encodings: JSON (the default, what the official OpenLineage Kafka
transports write) and Avro single-object encoding (:mod:`producer.codec.avro`).

A reader tells them apart by the first two bytes: Avro single-object records start with
``C3 01``, which no UTF-8 JSON text can (see :func:`producer.codec.avro.is_single_object`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import orjson

Encoding = Literal["json", "avro"]
ENCODINGS: tuple[str, ...] = ("json", "avro")


def encode_json(event: dict) -> bytes:
    """Compact UTF-8 JSON. Raises ``TypeError`` (orjson) for values JSON cannot carry."""
    return orjson.dumps(event)


def encoder(encoding: str) -> Callable[[dict], bytes]:
    """The event encoder for a ProducerConfig ``encoding`` (Avro imported only when used)."""
    if encoding == "avro":
        from producer.codec import avro

        return avro.encode
    return encode_json
