"""The dead-letter topic: where records that cannot be delivered go, with the reason.

Record layout (a contract for ``lineage-relay dlq`` and for operators):
value = the original bytes, unchanged; key = the original key; headers ``reason``
(machine code), ``detail`` (human text), ``source`` (``topic/partition/offset``),
``collector`` (when a collector refused it) and ``relay_time`` (ISO-8601).

A write counts as done only when the broker acknowledged it; failed writes are retried
until they succeed, so a record's offset is never committed before its dead letter exists.
The producer is replaced after a fatal error (see :class:`ProducerHost`).
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
from relay.source.producer import ProducerHost

log = logging.getLogger("relay.sinks.deadletter")
_DETAIL_MAX = 2000
_RESEND_DELAY_S = 1.0


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
                 reason: str, on_done: Callable[[], None]) -> None:
        producer = self._host.producer
        if producer is None:  # closed: the record's offset is not committed, it comes again
            return
        assert self._loop is not None
        loop = self._loop

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                loop.call_soon_threadsafe(self._acked, reason, on_done)
            else:
                log_event(log, logging.ERROR, "dead_letter_write_failed", error=str(err), reason=reason)
                self._host.delivery_failed(err)
                loop.call_soon_threadsafe(loop.call_later, _RESEND_DELAY_S, self._produce,
                                          value, key, headers, reason, on_done)
        try:
            producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=delivered)
        except BufferError:
            loop.call_later(0.05, self._produce, value, key, headers, reason, on_done)
        except KafkaException as err:  # a fatal producer, until its replacement
            log_event(log, logging.ERROR, "dead_letter_write_failed", error=str(err), reason=reason)
            loop.call_later(_RESEND_DELAY_S, self._produce, value, key, headers, reason, on_done)

    def _acked(self, reason: str, on_done: Callable[[], None]) -> None:
        self.in_flight -= 1
        self._metrics.dead_lettered.labels(reason=reason).inc()
        on_done()

    async def close(self, timeout_s: float = 10.0) -> None:
        if self._host.producer is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._host.close, timeout_s)
