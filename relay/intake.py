"""What the relay's loop takes in: batches of records polled from the source, and their
decoding.

:meth:`RecordIntake.fetch` starts polling the next batch (at most :data:`_POLL_BATCH`
records) on the consumer's thread, and there too sorts out consumer errors and hands the
records' values to the decode worker, if there is one: the loop handles one batch while
the next is polled and decoded. Without a decode worker the loop decodes a batch itself
(:meth:`RecordIntake.decode_here`), which costs less than on the consumer's thread (GIL
contention).

Consumer errors: a fatal one raises :class:`~relay.source.kafka.SourceError` from the
batch's future (the relay stops; a restart makes a new consumer); one naming a subscribed
topic the cluster does not hold marks it missing (``KafkaSource.topic_missing``) and, like
any other, is logged ``consume_error`` and skipped; end-of-partition events are ignored.
"""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import KafkaError

from relay.events import LineageEvent, Rejection
from relay.logs import log_event
from relay.loop_threads import settle_soon
from relay.source.kafka import MISSING_TOPIC, KafkaSource, SourceError
from relay.stages.decode import decode_record
from relay.stages.decode_worker import DecodeWorker

# The relay loop's logger (``consume_error`` has always been logged there): users filter by it.
log = logging.getLogger("relay.app")

#: Records per poll. Each batch costs a fixed round of thread hand-offs (consumer thread,
#: decode worker's reader thread, event loop), each waiting for the GIL: 1000 -> 4000
#: measured +3.5% events/s to one HTTP collector, +13% to a batch collector and the
#: pipeline alone; 4000 -> 8000 another +3% and +10% (the loop's pause stays that of
#: :data:`relay.app._HANDLE_SLICE` records). Memory is bounded by bytes, not by this
#: count (see :mod:`relay.app`).
_POLL_BATCH = 8000
_POLL_TIMEOUT_S = 0.1


class RecordIntake:
    """Polls ``source`` and decodes what it returns (``decoder``: the decode worker, or None
    to decode on the loop); see the module docstring. :meth:`start` on the event loop
    before the first :meth:`fetch`."""

    def __init__(self, source: KafkaSource, decoder: DecodeWorker | None, *, max_bytes: int) -> None:
        self._source = source
        self._decoder = decoder
        self._max_bytes = max_bytes
        self._event_loop: asyncio.AbstractEventLoop | None = None  # set by start()

    def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()

    def fetch(self) -> asyncio.Future:
        """The next batch, polled and handed to the decode worker: a future of
        ``((records, decoding), generation)`` (``decoding``: a future of their decoded
        results, None without a decode worker; ``generation``: see
        :meth:`~relay.source.kafka.KafkaSource.poll_soon`)."""
        return self._source.poll_soon(_POLL_BATCH, _POLL_TIMEOUT_S, then=self._decode)

    def _decode(self, messages: list) -> tuple[list, asyncio.Future[list[LineageEvent | Rejection]] | None]:
        """On the consumer's thread: the records among ``messages`` (consumer errors are
        logged and skipped) and, with a decode worker, their decoding under way (a future
        of this loop's, set from the worker's reader thread)."""
        records = []
        for message in messages:
            err = message.error()
            if err is None:
                records.append(message)
            elif err.code() == KafkaError._FATAL or err.fatal():
                # The consumer is unusable for good (e.g. fenced by a member with the same
                # group.instance.id): stop, so that a restart makes a new one, rather than
                # go on consuming nothing. The last commit is tried on the way out.
                # librdkafka hands a consumer's fatal error over as a message whose code is
                # _FATAL and whose fatal() is False (the underlying error is in its text).
                raise SourceError(f"the Kafka consumer hit a fatal error: {err.str()}; a restart makes a new "
                                  "consumer (with static membership, give each replica its own "
                                  "group.instance.id)")
            elif err.code() != KafkaError._PARTITION_EOF:
                if err.code() in MISSING_TOPIC:
                    self._source.topic_missing(message.topic())
                log_event(log, logging.WARNING, "consume_error", error=str(err))
        if self._decoder is None:
            return records, None
        loop = self._event_loop
        decoded: asyncio.Future[list[LineageEvent | Rejection]] = loop.create_future()
        self._decoder.submit([m.value() for m in records], lambda results: settle_soon(loop, decoded, results))
        return records, decoded

    def decode_here(self, records: list) -> list[LineageEvent | Rejection]:
        """Decode ``records`` on the calling thread (the loop, without a decode worker)."""
        max_bytes = self._max_bytes
        return [decode_record(m.value(), max_bytes=max_bytes) for m in records]
