"""The producer's Kafka client: a mixin of :class:`producer.LineageProducer`.

Guarantees:

* :meth:`KafkaClient._new_producer` builds the librdkafka instance from the configuration
  (at construction, and when the sender replaces an instance: :mod:`producer.replacement`),
  with the batch size a refused batch reduced; a configuration librdkafka refuses raises
  :class:`producer.errors.ConfigError` naming the property, never its value, and is not
  chained (librdkafka's exception holds the value).
* In a forked child whose resolver a parent thread held at the fork (:mod:`producer.forking`)
  it is :class:`producer.forking.NoKafka` instead (``_can_send`` False): journal mode,
  ``resolver_locked_at_fork``; once the resolver answers after all,
  :meth:`KafkaClient._kafka_client_back` (the sender's) builds the real client, adopts the
  journals dead processes left, and lets replay begin -- never once close() began, and once
  only if librdkafka refuses the configuration (``kafka_client_refused``, logged).
* :meth:`KafkaClient._adopt_orphans`: the journals dead processes left for this topic and
  cluster, locked and opened (not counted: :mod:`producer.replay`); none, logged, if the
  journal directory is unreadable.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any, Callable

from confluent_kafka import KafkaException, Producer

from producer.errors import ConfigError, JournalError
from producer.forking import NoKafka, resolver_answered, resolver_usable
from producer.journal import Journal
from producer.orphans import adopt_orphans

if TYPE_CHECKING:
    from producer.config import ProducerConfig
    from producer.journal_dir import Destination

log = logging.getLogger("producer.kafka")
_REJECTED_VALUE = re.compile(r'Invalid value ".*" (for configuration property ")', re.DOTALL)


class KafkaClient:
    """LineageProducer's librdkafka instance, or none; see the module docstring."""

    config: ProducerConfig
    _topic: str
    _producer: Any
    _journals: list[Journal]
    _lock: threading.RLock
    _closing: bool
    _kafka_down: bool
    _batch_bytes: int | None
    _rdkafka_log: Any
    # The Sender's and its mixins':
    _begin_journal_mode_locked: Callable[[str], None]
    _on_error: Callable[[Any], None]
    _segment_bytes: Callable[[], int]
    _destination: Callable[[], Destination]
    _error: Callable[..., None]

    _client_refused = False   # a late Kafka client refused its configuration (_kafka_client_back)

    def _new_producer(self, props: dict[str, str] | None = None) -> Producer | NoKafka:
        if not resolver_usable():
            # A fork child that cannot resolve names (producer.forking): journal only. Called
            # before the sender runs or (a rebuild) under _lock, so no lock is taken here.
            self._kafka_down = True
            self._begin_journal_mode_locked("resolver_locked_at_fork")
            return NoKafka()
        props = props or self.config.kafka_properties()
        if self._batch_bytes is not None:   # reduced after the broker refused a batch as too large
            props = {**props, "batch.size": str(self._batch_bytes)}
        try:
            return Producer({**props, "error_cb": self._on_error,
                             "logger": self._rdkafka_log})
        except KafkaException as err:
            # librdkafka quotes the value it rejects (Invalid value "..." for configuration property
            # "..."): only the property is named, and its exception is not chained (it holds the value).
            reason = _REJECTED_VALUE.sub(r"Invalid value \1", err.args[0].str())
            raise ConfigError(f"properties: librdkafka rejected the configuration: {reason} "
                              "(fix or remove that property)") from None

    def _kafka_client_back(self) -> bool:
        """Journal-only for want of a Kafka client: the resolver probe answered late after all
        (a loaded process, not a lock held for ever): a real client now, the journals a dead
        process left (not adopted at construction), and replay. Not once close() began."""
        if self._client_refused or self._closing or not resolver_answered():
            return False
        try:
            client = self._new_producer()
        except ConfigError as err:   # not checked at construction, which built no client
            self._client_refused = True
            self._error("kafka_client_refused", err)
            return False
        # Before the client: flush() must not see "can send, nothing pending" without them.
        self._journals = self._adopt_orphans()
        with self._lock:
            if self._closing:   # the adopted journals are closed with the others, still pending
                return False
            self._producer = client   # _can_send from here on
            self._kafka_down = False
        log.warning("event=kafka_client_started topic=%s reason=resolver_answered_late", self._topic)
        return True

    @property
    def _can_send(self) -> bool:
        """Whether this process has a Kafka client (producer.forking: not when its resolver
        did not answer)."""
        return not isinstance(self._producer, NoKafka)

    def _adopt_orphans(self) -> list[Journal]:
        """The journals dead processes left in the journal directory for this topic and
        cluster (none if unreadable: logged), locked and opened; the sender counts their
        records (:mod:`producer.replay`)."""
        try:
            return adopt_orphans(self.config.journal_path, max_bytes=self.config.journal_max_bytes,
                                 segment_bytes=self._segment_bytes(), destination=self._destination(),
                                 recover=False)
        except (OSError, JournalError) as err:
            self._error("journal_unreadable", err, path=str(self.config.journal_path))
            return []
