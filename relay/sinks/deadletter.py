"""The dead-letter topic: where records that cannot be delivered go, with the reason.

Record layout (a contract for ``lineage-relay dlq`` and for operators):
value = the original bytes, unchanged; key = the original key; headers ``reason``
(machine code), ``detail`` (human text), ``source`` (``topic/partition/offset``),
``collector`` (when a collector refused it) and ``relay_time`` (ISO-8601).

A write counts as done only when the broker acknowledged it; failed writes are retried
until they succeed, so a record's offset is never committed before its dead letter exists.
The producer is replaced after a fatal error (see :class:`ProducerHost`).

A dead letter the broker refuses as too large (a dead-letter topic created with a smaller
``max.message.bytes`` than the records it must hold) is tried once more as it is -- it may
only have shared a batch with a bigger one -- and then written without its value, with
header ``value_omitted`` = the original size in bytes: the original stays in the source
topic at ``source`` (within its retention), and the relay does not stall on it for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from relay.events import SourceRef
from relay.logs import log_event
from relay.metrics import RelayMetrics
from relay.source.producer import BATCH_TOO_LARGE, ProducerHost

log = logging.getLogger("relay.sinks.deadletter")
_DETAIL_MAX = 2000
_RESEND_DELAY_S = 1.0
#: Size refusals of a dead letter before it is written without its value.
_SIZE_REFUSALS = 2
#: The refusals for size: the broker's (a delivery report), and librdkafka's own for a
#: record over message.max.bytes (produce() raises MSG_SIZE_TOO_LARGE too). Nothing else:
#: another failure (a TLS error, a timeout) leaves the dead letter whole, retried as it is.
_TOO_LARGE = BATCH_TOO_LARGE


class DeadLetterWriter:
    def __init__(self, *, bootstrap_servers: str, topic: str, properties: dict[str, str],
                 metrics: RelayMetrics) -> None:
        conf: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 20,
                                "compression.type": "zstd", **properties}
        conf["bootstrap.servers"] = bootstrap_servers
        self.topic = topic
        self._host = ProducerHost(conf, "dlq-producer",
                                  on_replaced=metrics.producers_replaced.labels(producer="dead_letter").inc)
        self._metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._host.start()

    def send(self, value: bytes | None, key: bytes | None, *, reason: str, detail: str,
             source: SourceRef | None, on_done: Callable[[], None], collector: str | None = None) -> None:
        headers = [("reason", reason.encode()), ("detail", detail[:_DETAIL_MAX].encode("utf-8", "replace")),
                   ("source", str(source).encode() if source else b""),
                   ("relay_time", datetime.now(timezone.utc).isoformat().encode())]
        if collector:
            headers.append(("collector", collector.encode()))
        self.in_flight += 1
        log_event(log, logging.WARNING, "dead_lettered", reason=reason, source=str(source),
                  collector=collector, detail=detail[:300])
        self._produce(value, key, headers, reason, on_done)

    def _produce(self, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]],
                 reason: str, on_done: Callable[[], None], size_refusals: int = 0) -> None:
        if self._host.producer is None:  # closed: the record's offset is not committed, it comes again
            return
        assert self._loop is not None
        loop = self._loop

        def retry(err: KafkaError) -> None:
            """On the loop: send again in a while (without the value after size refusals)."""
            refusals = size_refusals + (err.code() in _TOO_LARGE)
            args = (value, key, headers, reason, on_done, refusals)
            if refusals >= _SIZE_REFUSALS and value is not None:
                log_event(log, logging.ERROR, "dead_letter_value_omitted", reason=reason, bytes=len(value),
                          error=str(err))
                self._metrics.dead_letter_values_omitted.labels(reason=reason).inc()
                args = (None, key, [*headers, ("value_omitted", str(len(value)).encode())], reason, on_done, 0)
            loop.call_later(_RESEND_DELAY_S, self._produce, *args)

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                loop.call_soon_threadsafe(self._acked, reason, on_done)
            else:
                log_event(log, logging.ERROR, "dead_letter_write_failed", error=str(err), reason=reason)
                self._host.delivery_failed(err)
                loop.call_soon_threadsafe(retry, err)
        try:
            # False: closed meanwhile (the offset is not committed, the record comes again).
            self._host.produce(self.topic, value=value, key=key, headers=headers, on_delivery=delivered)
        except BufferError:
            loop.call_later(0.05, self._produce, value, key, headers, reason, on_done, size_refusals)
        except KafkaException as err:  # a fatal producer until its replacement, or a record over message.max.bytes
            log_event(log, logging.ERROR, "dead_letter_write_failed", error=str(err), reason=reason)
            retry(err.args[0])

    def _acked(self, reason: str, on_done: Callable[[], None]) -> None:
        self.in_flight -= 1
        self._metrics.dead_lettered.labels(reason=reason).inc()
        on_done()

    async def close(self, timeout_s: float = 10.0) -> None:
        if self._host.producer is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._host.close, timeout_s)
