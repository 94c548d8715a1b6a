"""Dead letters written straight to a dead-letter topic, as the relay writes them (layout:
:mod:`relay.sinks.deadletter`), for tests of ``lineage-relay dlq`` that need many or
large ones without running the relay over them; and large events to fill them with."""

from __future__ import annotations

from typing import Any

import orjson
from confluent_kafka import KafkaError, Producer

_PADDING_FACET = "https://example.com/facets/Padding.json#/$defs/Padding"


def padded(value: bytes, size: int) -> bytes:
    """``value`` (an OpenLineage event) with a run facet that brings it to about ``size``
    bytes (under 1,000,000: librdkafka's default ``message.max.bytes``, overhead included)."""
    doc: dict[str, Any] = orjson.loads(value)
    filler = max(0, size - len(value) - 200)
    doc["run"].setdefault("facets", {})["padding"] = {"_producer": doc["producer"], "_schemaURL": _PADDING_FACET,
                                                      "data": "x" * filler}
    return orjson.dumps(doc)


def write_dead_letters(bootstrap: str, dlq: str, records: list[tuple[bytes | None, bytes | None]], *,
                       reason: str, collector: str | None, source_topic: str = "ol",
                       detail: str = "HTTP 400: rejected") -> None:
    """One dead letter per ``(key, value)``, its ``source`` ``<source_topic>/0/<index>``;
    returns once the broker acknowledged them all."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failures: list[KafkaError] = []
    for index, (key, value) in enumerate(records):
        headers = [("reason", reason.encode()), ("detail", detail.encode()),
                   ("source", f"{source_topic}/0/{index}".encode()),
                   ("relay_time", b"2024-05-01T00:00:00+00:00")]
        if collector:
            headers.append(("collector", collector.encode()))
        producer.produce(dlq, key=key, value=value, headers=headers,
                         on_delivery=lambda err, _msg: failures.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failures, f"dead letters not written: {failures[:3]}"
