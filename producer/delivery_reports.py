"""librdkafka's callbacks for the producer's sender: delivery reports and errors.

:class:`DeliveryReports` is a mixin of :class:`producer.sender.Sender`, whose
``_init_sender`` sets up the state below and whose ``_drop`` and ``_error`` count and log.
The callbacks run on the sender thread, inside ``poll()`` (see :mod:`producer.sender`).
They never take ``_lock`` (emit() holds it around ``produce()``) and leave every
decision to the sender's next ``_step``: they count, log drops and errors, and record
what they saw -- a failed direct record on ``_returned`` (to be journaled), and the flags
``_want_journal`` (go to journal mode), ``_fatal`` (replace the librdkafka instance),
``_refused_batch`` (rebuild it with smaller batches), ``_replay_failed`` (read the replay
batch again) and ``_kafka_down``; an acknowledgement resets what is logged once an outage
(``_journal_mode_told``, ``_rdkafka_log``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError

from producer.delivery import REJECT, batch_too_large, classify, poisons_instance

if TYPE_CHECKING:
    from producer.config import ProducerConfig
    from producer.librdkafka_log import LibrdkafkaLog

_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


class DeliveryReports:
    """librdkafka's delivery and error callbacks; see the module docstring."""

    config: ProducerConfig
    _batch_bytes: int | None
    _refused_batch: int | None
    _last_report_at: float
    _delivered: int
    _delivery_failures: int
    _returned: list[tuple[int, bytes | None, bytes]]
    _direct_done: int
    _spilling: bool
    _kafka_down: bool
    _rdkafka_log: LibrdkafkaLog
    _journal_mode_told: str | None
    _want_journal: str | None
    _fatal: KafkaError | None
    _replay_outstanding: int
    _replay_failed: bool
    _replay_rejected: int
    _replay_dropped: tuple[Any, tuple[int, int], dict[int, tuple[bytes | None, bytes]]] | None

    def _configured_batch_bytes(self) -> int:
        return int(self.config.kafka_properties().get("batch.size", 1_000_000))

    def _shrinks_batch(self, err: KafkaError, size: int) -> bool:
        """A batch refused for its size, holding this record of ``size`` bytes: if the
        record may have shared it (it is under batch.size), ask for smaller batches and
        keep the record; else it was alone, and is itself too large."""
        if not batch_too_large(err.code()):
            return False
        if size >= (self._batch_bytes or self._configured_batch_bytes()):
            return False
        self._refused_batch = max(self._refused_batch or 0, size)
        return True

    def _on_delivery(self, cell: list[int], err: KafkaError | None, msg: Any) -> None:
        self._last_report_at = time.monotonic()
        try:
            seq = cell.pop()   # the record's emit number (Sender._abandon empties it first, or never)
        except IndexError:
            # Placed again by the emit() an exception cut short (producer.deferred_close), and
            # counted done then: this copy's fate changes nothing (a delivery is a duplicate).
            return
        try:
            if err is None:
                self._delivered += 1
                self._kafka_up()
            elif classify(err.code()) == REJECT and not self._shrinks_batch(err, len(msg.value() or b"")):
                self._drop("rejected_by_broker", err.str(), key=msg.key())
            else:
                if err.code() not in _PURGED:   # not those the producer took back itself (reclaim)
                    self._delivery_failures += 1
                self._returned.append((seq, msg.key(), msg.value()))
                self._note_failure(err)
                if not self._spilling:
                    self._want_journal = f"delivery_failed:{err.name()}"
                if poisons_instance(err.code()) and self._fatal is None:
                    self._fatal = err           # replaced, as after a fatal error
        except Exception as cb_err:  # noqa: BLE001 - an exception here would surface in poll()
            self._error("delivery_callback_failed", cb_err)
        finally:
            # Done only once it is on _returned: _not_journaled(), read from other threads
            # without a lock, must not miss the record in between.
            self._direct_done += 1

    def _on_replay_delivery(self, place: int, err: KafkaError | None, msg: Any) -> None:
        """A replay batch's record's report (``place``: its index in the batch)."""
        self._replay_outstanding -= 1
        self._last_report_at = time.monotonic()
        if err is None:
            self._kafka_up()
            return
        if classify(err.code()) == REJECT and not self._shrinks_batch(err, len(msg.value() or b"")):
            self._replay_rejected += 1
            # Counted once: if another record fails the batch, it is sent again without this one.
            if self._replay_dropped is not None:
                self._replay_dropped[2][place] = (msg.key(), msg.value())
            self._drop("rejected_by_broker", err.str(), key=msg.key())
        else:
            self._replay_failed = True
            self._note_failure(err)
            if poisons_instance(err.code()) and self._fatal is None:
                self._fatal = err

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            self._error("kafka_fatal", err.str())
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._kafka_down = True
            if not self._spilling:
                self._want_journal = "all_brokers_down"

    def _kafka_up(self) -> None:
        # Kafka took a record: the next journal mode, and the next outage's librdkafka lines,
        # are reported at WARNING again (a partly down cluster's lines only once it was all down).
        self._journal_mode_told = None
        if self._kafka_down:
            self._kafka_down = False
            self._rdkafka_log.forget()

    def _note_failure(self, err: KafkaError) -> None:
        # A record we purged ourselves (reclaim) says nothing about Kafka.
        if err.code() not in _PURGED:
            self._kafka_down = True
