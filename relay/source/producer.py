"""A Kafka producer for the relay's own topics (dead letters, run state), polled by a thread
of its own and replaced when librdkafka reports a fatal error.

A fatal error (e.g. the broker forgot the idempotent producer's id, or a sequence gap it
cannot repair) leaves a librdkafka producer refusing every record for good: without a new
one the relay would retry its dead letters and state writes forever and commit nothing.
:class:`ProducerHost` then, on its poll thread:

1. purges the records still queued (their delivery reports fail: the writers retry them),
2. waits, up to :data:`SETTLE_S`, for the answers to requests already sent -- a purged
   in-flight request is only forgotten, not withdrawn: the broker could still write it
   after its retry, and a stale run-state record would then win over a newer one,
3. purges what is left and starts a new producer, which the writers use from then on.

``produce()`` on the old producer meanwhile raises :class:`KafkaException`; the writers
treat that as a failed write and retry it.

confluent-kafka raises a producer's fatal error from ``poll()`` (as a
:class:`KafkaException` whose error is fatal) rather than passing it to ``error_cb``; both
ways are handled. Some answers about the producer id (:data:`SPOILING`) only fail the
delivery: librdkafka then bumps the producer epoch on its own, and a broker without that
bump (KIP-360; Tansu is one) refuses the producer for good. The writers report their failed
deliveries to :meth:`ProducerHost.delivery_failed`, which treats those as fatal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from relay.kafka_log import with_log
from relay.logs import log_event

log = logging.getLogger("relay.source.producer")

#: How long a fatal producer's in-flight requests may take to be answered before they are
#: given up on (then again for the purge's reports).
SETTLE_S = 5.0

#: The broker's refusals of a record batch for its size (the topic's max.message.bytes).
#: They fail every record of the batch, each of which may fit on its own: the writers try
#: a refused record once more before they give up on it.
BATCH_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})

#: Delivery errors after which the producer is replaced, as after a fatal error. A batch
#: refused for its size leaves a gap in the sequence too: librdkafka bumps the epoch.
SPOILING = frozenset({KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_EPOCH,
                      KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.PRODUCER_FENCED}) | BATCH_TOO_LARGE


class ProducerHost:
    """``producer``: the live producer (None before :meth:`start` and after :meth:`close`).
    ``on_replaced`` is called (on the poll thread) each time a new producer took over."""

    def __init__(self, conf: dict[str, Any], name: str, on_replaced: Callable[[], None] | None = None) -> None:
        self._conf = with_log({**conf, "error_cb": self._on_error})
        self.name = name
        self._on_replaced = on_replaced
        self.producer: Producer | None = None
        #: Producers replaced after a fatal error so far.
        self.replaced = 0
        self._fatal: KafkaError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Held to produce and to swap producers (see produce()).
        self._swap = threading.Lock()

    def start(self) -> None:
        producer = self.producer = Producer(self._conf)
        # The thread keeps its own reference: close() drops self.producer before the last flush.
        self._thread = threading.Thread(target=self._poll_forever, args=(producer,), name=self.name, daemon=True)
        self._thread.start()

    def produce(self, topic: str, **kwargs: Any) -> bool:
        """``Producer.produce`` on the live producer (its exceptions pass through); False when
        closed. A record goes either to a producer before it is replaced, whose last purge
        then fails it (its writer tries again), or to the new one: never to a replaced
        producer nobody polls any more, whose report would never come."""
        with self._swap:
            producer = self.producer
            if producer is None:
                return False
            producer.produce(topic, **kwargs)
            return True

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback, on the poll thread (inside poll or flush)."""
        if err.fatal():
            self._fatal = err

    def delivery_failed(self, err: KafkaError) -> None:
        """A writer's failed delivery (called from its delivery callback, on the poll thread)."""
        if err.code() in SPOILING and self._fatal is None:
            self._fatal = err

    def _poll(self, producer: Producer, timeout_s: float) -> None:
        """Serve ``producer``'s reports; a fatal error raised from poll() is noted, and any
        other error is logged: this thread must go on serving reports."""
        try:
            producer.poll(timeout_s)
        except KafkaException as err:
            kafka_err = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
            if kafka_err is not None and kafka_err.fatal():
                self._fatal = kafka_err
                return
            log_event(log, logging.ERROR, "kafka_producer_poll_failed", producer=self.name, error=str(err)[:300])
        except Exception as err:  # noqa: BLE001 - e.g. a delivery callback that raised
            log_event(log, logging.ERROR, "kafka_producer_poll_failed", producer=self.name, error=repr(err)[:300])

    def _poll_forever(self, producer: Producer) -> None:
        while not self._stop.is_set():
            self._poll(producer, 0.1)
            if self._fatal is not None and not self._stop.is_set():
                fatal = self._fatal
                try:
                    producer = self._replace(producer)
                except Exception as err:  # noqa: BLE001 - this thread must go on: it serves the reports
                    log_event(log, logging.ERROR, "kafka_producer_replace_failed", producer=self.name,
                              error=repr(err)[:300])
                    self._fatal = fatal   # tried again after a pause
                    self._stop.wait(1.0)

    def _replace(self, old: Producer) -> Producer:
        err, self._fatal = self._fatal, None
        log_event(log, logging.ERROR, "kafka_producer_fatal", producer=self.name, error=str(err),
                  in_librdkafka=len(old))
        for in_flight in (False, True):
            self._purge_and_serve(old, in_flight)
        self._fatal = None  # the old producer's, raised again while it was served
        new = Producer(self._conf)
        with self._swap:
            if self.producer is old:  # else close() took it meanwhile: the new one is not used
                self.producer = new
        # Records produced on the old one since its purge (a producer spoilt by an answer, not
        # fatal in librdkafka, still takes them): failed now, so their writers try again.
        self._purge_and_serve(old, in_flight=True)
        self.replaced += 1
        if self._on_replaced is not None:
            self._on_replaced()
        log_event(log, logging.WARNING, "kafka_producer_replaced", producer=self.name, replaced=self.replaced)
        return new

    def _purge_and_serve(self, old: Producer, in_flight: bool) -> None:
        try:
            old.purge(in_queue=True, in_flight=in_flight)
        except KafkaException as purge_err:
            log_event(log, logging.WARNING, "kafka_producer_purge_failed", producer=self.name,
                      error=str(purge_err))
        deadline = time.monotonic() + SETTLE_S
        while len(old) and time.monotonic() < deadline:
            self._poll(old, 0.05)  # serves the delivery reports: the writers retry what failed

    def close(self, timeout_s: float) -> None:
        """Flush for up to ``timeout_s`` (blocking: run it off the event loop), then stop."""
        with self._swap:
            producer, self.producer = self.producer, None
        if producer is not None:
            try:
                producer.flush(timeout_s)
            except KafkaException as err:  # a fatal producer: what it holds is not committed, it comes again
                log_event(log, logging.ERROR, "kafka_producer_flush_failed", producer=self.name, error=str(err)[:300])
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
