"""The partitions' end offsets as the broker states them, asked for without waiting.

librdkafka's consumer knows a partition's end offset (``get_watermark_offsets(cached=True)``)
from its fetch responses only, and does not say how old that value is. A partition the
relay paused (backpressure: a collector failing) is not fetched, nor is any while the
broker is unreachable: the value stays where it was when fetching stopped, however many
records arrive. The consumer lag computed from it stayed at ~0 while records piled up,
and the alerts on it never fired in the outages they are for. :class:`EndOffsets` asks the
broker itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from relay.logs import log_event
from relay.source.offsets import Partition

log = logging.getLogger("relay.source")

#: How long the broker has to answer a request for the end offsets: under the relay's lag
#: interval (5 s), so that a request is answered or failed before the next is due.
ASK_TIMEOUT_S = 4.0


class EndOffsets:
    """Each partition's end offset as the broker last stated it: the high watermark, or
    under ``isolation_level`` ``read_committed`` (librdkafka's default) the last stable
    offset, as the consumer's own cached value.

    :meth:`ask` sends the request for the partitions it is given, one ListOffsets request
    per partition leader (an admin client built from ``conf``), and returns at once: it
    never waits for the broker. The answer, once it came, is what :meth:`known` gives from
    the next :meth:`ask` on. At most one request is outstanding: an :meth:`ask` while one
    is unanswered sends no other (librdkafka fails a request after ``timeout_s``).
    A partition the broker did not answer for (unreachable, no leader, a deleted topic)
    keeps its last known value; the first failure (and the first after an answer) is
    logged ``end_offsets_unanswered``, the answer after it ``end_offsets_answered``.
    ``on_answer`` is called for each answer
    (:meth:`relay.source.broker_contact.BrokerContact.mark_answered`).

    Not thread-safe: use it from one thread (the consumer's). confluent-kafka hands an
    admin client's librdkafka log lines (``conf``'s ``logger``) over only when it is
    polled: :meth:`ask` does, so they are logged at most one lag interval late.
    """

    def __init__(self, conf: dict[str, Any], *, isolation_level: str = "read_committed",
                 timeout_s: float = ASK_TIMEOUT_S, on_answer: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._admin: AdminClient | None = AdminClient(conf)
        self._isolation = (IsolationLevel.READ_UNCOMMITTED if isolation_level.lower() == "read_uncommitted"
                           else IsolationLevel.READ_COMMITTED)
        self._timeout_s = timeout_s
        self._on_answer = on_answer
        self._clock = clock
        self._ends: dict[Partition, int] = {}
        self._asked: dict[TopicPartition, Future] | None = None
        self._asked_at = 0.0
        self._unanswered = False

    def ask(self, partitions: Iterable[Partition]) -> None:
        """Take the answer to the previous request if it came, and ask for ``partitions``
        (values of other partitions are forgotten) unless that request is still unanswered."""
        admin = self._admin
        if admin is None:
            return
        admin.poll(0)
        self._take_answer()
        wanted = set(partitions)
        self._ends = {part: end for part, end in self._ends.items() if part in wanted}
        # Twice the timeout: librdkafka fails a request at its timeout; this only keeps a
        # request it never completed from stopping every later one.
        if not wanted or (self._asked is not None and self._clock() - self._asked_at < 2 * self._timeout_s):
            return
        try:
            self._asked = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t, p in sorted(wanted)},
                                             isolation_level=self._isolation, request_timeout=self._timeout_s)
        except KafkaException as err:
            self._asked = None
            self._failed(str(err))
            return
        self._asked_at = self._clock()

    def known(self) -> dict[Partition, int]:
        """The end offsets the broker stated (a copy), for the partitions last asked for."""
        return dict(self._ends)

    def close(self) -> None:
        """Drop the admin client (librdkafka fails a request still outstanding)."""
        self._admin = None
        self._asked = None

    def _take_answer(self) -> None:
        asked = self._asked
        if asked is None or not all(future.done() for future in asked.values()):
            return
        self._asked = None
        error = None
        for tp, future in asked.items():
            try:
                end = future.result().offset
            except Exception as err:  # noqa: BLE001 - whatever failed, the last known value stays
                error = str(err)
                continue
            if end >= 0:
                self._ends[(tp.topic, tp.partition)] = end
        # One partition answered for: the broker did (another's topic may be gone).
        if self._on_answer is not None and any(future.exception() is None for future in asked.values()):
            self._on_answer()
        if error is not None:
            self._failed(error)
        elif self._unanswered:
            self._unanswered = False
            log_event(log, logging.INFO, "end_offsets_answered", partitions=len(asked))

    def _failed(self, error: str) -> None:
        if not self._unanswered:
            self._unanswered = True
            log_event(log, logging.WARNING, "end_offsets_unanswered", error=error[:300],
                      hint="the consumer lag keeps its last known value until the broker answers")
