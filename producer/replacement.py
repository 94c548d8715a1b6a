"""Taking records back from a librdkafka instance, and replacing it: a mixin of
:class:`producer.sender.Sender` (its thread, but for close()'s :meth:`_take_back_if_kafka_is_down`).

Guarantees:

* *Reclaim* (:meth:`InstanceReplacement._reclaim`): every record librdkafka holds is
  purged and its delivery report puts it back on ``_returned`` (the sender journals those
  in emit order, ahead of anything emitted since), within :data:`RECLAIM_TIMEOUT_S` per
  purge; before a replacement (``settle_in_flight``) the answers to requests already on the
  wire are awaited first (bounded the same way), so an old instance's late request does not
  land after the new one's resend. Records it still holds after that are logged
  (``reclaim_incomplete``), and dropped as ``lost_in_fatal_producer`` when it is replaced.
  While it waits, a spill queue filling up goes to a journal of its own (logged
  ``event=journal_created ... reason=reclaim_wait``), sent after the records given back,
  which go to the journal before it (:meth:`producer.sender.Sender._persist_aside`): emit()
  waits for the disk, never for these answers. The two journals share ``journal_max_bytes``
  with the producer's other journals, one budget checked at each append: records given back
  that no longer fit are dropped (``journal_full``, counted).
* *Stall detection* (:meth:`InstanceReplacement._check_stall`): records outstanding and no
  delivery report for ``_stall_s`` (:data:`_STALL_S`: 5 s, doubling at each stall up to
  60 s, back to 5 s once a journal replay is acknowledged) marks Kafka down and the
  instance stalled.
* *Replacement* (:meth:`InstanceReplacement._rebuild`): after a fatal error, a stall, or a
  batch the broker refused for its size (then with half the batch size, logged
  ``batch_size_reduced``), a new librdkafka instance takes the old one's place under
  ``_lock`` (logged ``producer_rebuilt``); a replay batch in flight is read again.
* close() or settle() while Kafka is known down (:meth:`InstanceReplacement._take_back_if_kafka_is_down`)
  gives Kafka :data:`_DOWN_GRACE_S` to answer, then has the sender take the records back
  into the journal rather than wait for the stall detector.

When these run is the sender's decision (:meth:`producer.sender.Sender._step`,
``_shutdown``); what the delivery reports record for them (``_fatal``, ``_refused_batch``)
is :mod:`producer.delivery_reports`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Producer

if TYPE_CHECKING:
    from producer.config import ProducerConfig

log = logging.getLogger("producer.kafka")

#: Records outstanding and no delivery report for this long: reclaim them into the journal
#: and start a fresh librdkafka producer (the wait doubles up to the second value while
#: it keeps happening). It un-sticks an idempotent producer whose id the broker forgot (a
#: wiped broker), at the price of one reconnect per period during an outage.
_STALL_S = (5.0, 60.0)
RECLAIM_TIMEOUT_S = 5.0
#: close() while Kafka is known down: how long it waits for any answer from Kafka before
#: taking the records in librdkafka back into the journal (see _take_back_if_kafka_is_down).
_DOWN_GRACE_S = 2.0


class InstanceReplacement:
    """The sender's reclaim, stall detection and librdkafka instance replacement; see the module docstring."""

    config: ProducerConfig
    _topic: str
    _producer: Producer
    _lock: threading.RLock
    _spilling: bool
    _kafka_down: bool
    _need_reclaim: bool
    _want_journal: str | None
    _fatal: KafkaError | None
    _stalled: bool
    _stall_s: float
    _quiet_since: float
    _last_report_at: float
    _batch_bytes: int | None
    _refused_batch: int | None
    _direct_sent: int
    _direct_done: int
    _direct_abandoned: int
    _replay: object
    _replay_failed: bool
    _replay_outstanding: int
    # The Sender's, LineageProducer's and DeliveryReports' (see producer.sender):
    _new_producer: Callable[[], Producer]
    _direct_outstanding: Callable[[], int]
    _configured_batch_bytes: Callable[[], int]
    _poll: Callable[[float], None]
    _wait: Callable[[float | None, Callable[[], bool]], None]
    _drop: Callable[..., None]
    _error: Callable[..., None]
    _persist_aside: Callable[[], None]
    _end_aside: Callable[[], None]

    def _take_back_if_kafka_is_down(self, timeout_s: float | None, reason: str = "closing_while_kafka_down") -> None:
        """For close() (and settle(): ``reason`` settling_while_kafka_down): Kafka said all
        brokers are down (librdkafka says it once per outage,
        often before the first event) and acknowledged nothing since, while records sit in
        librdkafka, where they would wait for the stall detector (``_stall_s``, 5 s and more).
        Kafka gets ``_DOWN_GRACE_S`` to answer anything: a broker that is back answers within
        it, which clears ``_kafka_down``, and close() then waits for delivery as usual. No
        answer at all: the records go to the journal now."""
        if not (self._kafka_down and not self._spilling and self._direct_outstanding()):
            return
        since = self._last_report_at
        grace = min(_DOWN_GRACE_S, self.config.close_timeout_s if timeout_s is None else timeout_s)
        self._wait(grace, lambda: self._last_report_at != since or self._direct_outstanding() == 0)
        if self._kafka_down and self._last_report_at == since and self._direct_outstanding():
            self._want_journal = reason

    def _check_stall(self) -> None:
        """Records waiting and no delivery report for ``_stall_s``: librdkafka is stuck."""
        now = time.monotonic()
        if self._direct_outstanding() + self._replay_outstanding == 0:
            self._quiet_since = now
        elif now - max(self._quiet_since, self._last_report_at) > self._stall_s:
            self._stalled = True
            self._kafka_down = True

    def _reset_stall(self) -> None:
        self._stall_s = _STALL_S[0]

    def _reclaim(self, settle_in_flight: bool = False) -> None:
        """Take back every record librdkafka holds; their delivery reports put the direct
        ones, in order, on ``_returned`` (ahead of anything emitted since).

        ``settle_in_flight`` (a fatal error or a stall, before the instance is replaced):
        purge only the queues first and wait for the answers to requests already on the
        wire. A purged in-flight request is only forgotten, not withdrawn: the broker may
        still write it after the new instance's resend of the same records (a reorder),
        and a broker that restarted may hand the new instance the old one's producer id,
        so the old instance's late requests would count as the new one's. (A stalled
        instance gets no answer for ``_stall_s`` already; a slow broker may still answer.)
        """
        self._need_reclaim = False
        try:
            if settle_in_flight:
                self._purge_and_wait(in_flight=False)
            self._purge_and_wait(in_flight=True)
        finally:
            self._end_aside()
        if self._direct_outstanding():
            self._error("reclaim_incomplete", f"{self._direct_outstanding()} records still in librdkafka")

    def _purge_and_wait(self, in_flight: bool) -> None:
        try:
            self._producer.purge(in_queue=True, in_flight=in_flight)
        except KafkaException as err:
            self._error("purge_failed", err)
        deadline = time.monotonic() + RECLAIM_TIMEOUT_S
        while self._direct_outstanding() + self._replay_outstanding > 0 and time.monotonic() < deadline:
            self._poll(0.05)
            # emit() must not wait for the network meanwhile: a spill queue filling up goes to
            # a journal of its own, sent after the records given back here (Sender._persist_aside).
            self._persist_aside()

    def _rebuild(self) -> None:
        # A fatal error (e.g. the broker forgot our producer id) poisons the instance.
        cause = (self._fatal if self._fatal is not None else f"no delivery report for {self._stall_s}s"
                 if self._stalled else "a batch refused as too large")
        log.warning("event=producer_rebuilt topic=%s cause=%s", self._topic, cause)
        if self._refused_batch is not None:
            before = self._batch_bytes or self._configured_batch_bytes()
            self._batch_bytes = max(1, before // 2)
            log.warning("event=batch_size_reduced topic=%s batch_size=%d was=%d largest_refused_record=%d "
                        "hint=the topic's max.message.bytes is under batch.size: set batch.size below it",
                        self._topic, self._batch_bytes, before, self._refused_batch)
            self._refused_batch = None
        if self._stalled:
            self._stall_s = min(self._stall_s * 2, _STALL_S[1])
            self._stalled = False
        self._quiet_since = time.monotonic()
        with self._lock:
            self._producer = self._new_producer()
            # Whatever the old instance did not report back after _reclaim is past saving.
            lost = self._direct_outstanding()
            self._direct_done = self._direct_sent
            self._direct_abandoned = 0
        if lost:
            self._drop("lost_in_fatal_producer", "records the replaced librdkafka instance never gave back",
                       n=lost)
        self._fatal = None
        if self._replay is not None:
            self._replay_failed = True
        self._replay_outstanding = 0
