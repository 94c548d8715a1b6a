"""The run-state changelog topic: create and check it, write records, read a partition back.

:class:`RunStateChangelog` owns one idempotent producer (``acks=all``) whose delivery reports
are served by its own thread and handed to the event loop (a :class:`ProducerHost`, which
replaces it after a fatal error), and opens a group-less consumer for each partition it
reads. Writes never block the loop; :meth:`wait_acked` waits for them.

At start-up, a broker that does not answer is waited for (:meth:`RunStateChangelog.start`),
as the relay's consumer waits for it; what the broker answers is checked once, and a topic
missing or mis-partitioned fails at once (:class:`StateError`, naming the key and the fix).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from relay.errors import RelayError
from relay.kafka_log import with_log
from relay.logs import log_event
from relay.loop_threads import call_on_daemon_thread
from relay.sinks.retry import backoff
from relay.source.admin import connection_properties, create_topic
from relay.source.producer import BATCH_TOO_LARGE, ProducerHost

log = logging.getLogger("relay.state.changelog")

#: Write outcomes handed to ``on_done``.
OK, FAILED, TOO_LARGE = "ok", "failed", "too_large"
_READ_TIMEOUT_S = 120.0
#: A run's record holds its merged state and its undelivered events, which can be large
#: (real events reach 23 MB): the producer and the topic it creates take records as large
#: as the relay's consumer can receive (librdkafka's receive.message.max.bytes), as the
#: dead-letter ones do. At librdkafka's default (1 MB) such a run was kept in memory only.
MAX_RECORD_BYTES = "100000000"
#: How long one look at the cluster's topics, and the topic's creation, wait for the broker.
_METADATA_TIMEOUT_S = 10.0
_CREATE_TIMEOUT_S = 15.0
#: Between two checks of the topic while the broker does not answer: full jitter, doubling
#: from the first to the cap (each check itself waits up to _METADATA_TIMEOUT_S).
_UNREACHABLE_BACKOFF_S = (1.0, 30.0)
#: librdkafka's answers for "no answer from the cluster" (not "the cluster said no"): the
#: topic is checked again until the broker answers, as the relay's consumer waits for it.
_NO_ANSWER = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION})


class StateError(RelayError):
    """The state topic is missing, mis-partitioned or unreadable."""


class _NoAnswer(Exception):
    """The broker did not answer a check of the topics (worth trying again)."""


class RunStateChangelog:
    def __init__(self, *, bootstrap_servers: str, topic: str, input_topic: str, create: bool,
                 producer_properties: dict[str, str], consumer_properties: dict[str, str],
                 on_producer_replaced: Callable[[], None] | None = None, replication_factor: int | None = None) -> None:
        self.topic = topic
        self._replication_factor = replication_factor
        self._input_topic = input_topic
        self._create = create
        self._bootstrap = bootstrap_servers
        self._producer_conf: dict[str, Any] = {
            "enable.idempotence": True, "acks": "all", "linger.ms": 5, "compression.type": "zstd",
            "message.max.bytes": MAX_RECORD_BYTES, **producer_properties, "bootstrap.servers": bootstrap_servers}
        self._reader_conf: dict[str, Any] = {
            **connection_properties(consumer_properties), "bootstrap.servers": bootstrap_servers,
            "group.id": f"{topic}.restore", "enable.auto.commit": False, "enable.partition.eof": True}
        self._admin_conf = connection_properties(producer_properties)
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="run-state")
        self._host = ProducerHost(self._producer_conf, "run-state-producer", on_replaced=on_producer_replaced)
        #: Keys whose last write the broker refused as too large (see write()).
        self._size_refused: set[bytes] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.partitions = 0
        self.unacked = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        """Create the topic when missing (compacted, as many partitions as the input topic) and
        check it; raises :class:`StateError` naming the fix, at once, when the broker's answer
        shows a topic missing or mis-partitioned, or refuses the request.

        While the broker does not answer, checks again (backoff with full jitter, 1 s doubling
        to 30 s), logging ``run_state_topic_unreachable`` each time, for as long as it takes:
        cancel it to give up (a stop during start-up does). Each check runs on a daemon thread
        of its own, so one given up on does not hold up the process's exit."""
        self._loop = asyncio.get_running_loop()
        first_s, cap_s = _UNREACHABLE_BACKOFF_S
        attempt = 0
        while True:
            attempt += 1
            try:
                self.partitions = await call_on_daemon_thread(self._ensure_topic, f"run-state-topic-{attempt}")
                break
            except _NoAnswer as err:
                error = str(err)
            retry_in_s = backoff(attempt, initial_s=first_s, cap_s=cap_s, rand=random.random)
            log_event(log, logging.WARNING, "run_state_topic_unreachable", topic=self.topic, attempt=attempt,
                      error=error, retry_in_s=round(retry_in_s, 1))
            await asyncio.sleep(retry_in_s)
        self._host.start()

    def _ensure_topic(self) -> int:
        """On a thread of its own (blocking); raises :class:`_NoAnswer` while the broker does
        not answer, :class:`StateError` for what the answer shows."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(with_log({**self._admin_conf, "bootstrap.servers": self._bootstrap}))
        try:
            topics = _topics(admin)
            wanted = _partition_count(topics, self._input_topic)
            if wanted is None:
                raise StateError(f"kafka.topics: input topic {self._input_topic!r} does not exist; consolidated/"
                                 "coalesce collectors partition their state like it, so create it first")
            have = _partition_count(topics, self.topic)
            if have is None and self._create:
                self._create_topic(wanted)
                have = _partition_count(_topics(admin), self.topic)
        finally:
            # A raised error's traceback holds this frame: without this the client (its
            # threads, its connection attempts) lived on until a cyclic collection.
            del admin
        if have is None:
            raise StateError(f"kafka.state_topic: {self.topic!r} does not exist; create it (cleanup.policy=compact, "
                             f"{wanted} partitions) or set kafka.create_state_topic: true")
        if have != wanted:
            raise StateError(f"kafka.state_topic: {self.topic!r} has {have} partitions but {self._input_topic!r} has "
                             f"{wanted}; state of input partition p lives in state partition p, so give it "
                             f"{wanted} partitions or name another kafka.state_topic")
        log_event(log, logging.INFO, "run_state_topic_ready", topic=self.topic, partitions=have)
        return have

    def _create_topic(self, partitions: int) -> None:
        try:
            create_topic(self._bootstrap, self.topic, partitions,
                         {"cleanup.policy": "compact", "max.message.bytes": MAX_RECORD_BYTES},
                         client_properties=self._admin_conf, replication_factor=self._replication_factor,
                         timeout_s=_CREATE_TIMEOUT_S)
        except TimeoutError:  # its text is empty
            raise _NoAnswer(f"creating the topic: TimeoutError: no answer from the broker within "
                            f"{_CREATE_TIMEOUT_S:g}s") from None
        except KafkaException as err:
            if _no_answer(err):
                raise _NoAnswer(f"creating the topic: {err.args[0].str()}") from None
            raise StateError(f"kafka.state_topic: creating {self.topic!r} failed: {err.args[0].str()}; create it "
                             f"(cleanup.policy=compact, {partitions} partitions) or let the relay's "
                             "kafka.producer_properties credentials create topics") from err

    # -- writing -----------------------------------------------------------------------

    def write(self, partition: int, key: bytes, value: bytes | None, on_done: Callable[[str], None]) -> None:
        """Produce one record (``value`` None: a tombstone); ``on_done(OK | FAILED | TOO_LARGE)``
        runs on the loop once the broker answered."""
        assert self._loop is not None
        loop = self._loop
        self.unacked += 1
        self._idle.clear()

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            status = OK if err is None else FAILED
            if err is not None and err.code() in BATCH_TOO_LARGE:
                # The broker refused the record's batch for its size: a record that shared
                # it may fit on its own, so it is written again once (FAILED: its run stays
                # dirty) before it counts as too large (on the poll thread, as every report).
                if key in self._size_refused:
                    self._size_refused.discard(key)
                    status = TOO_LARGE
                else:
                    self._size_refused.add(key)
            elif err is None:
                self._size_refused.discard(key)
            if err is not None:
                log_event(log, logging.ERROR, "run_state_write_failed", topic=self.topic, partition=partition,
                          error=str(err))
                self._host.delivery_failed(err)
            loop.call_soon_threadsafe(self._done, on_done, status)
        try:
            if not self._host.produce(self.topic, value=value, key=key, partition=partition, on_delivery=delivered):
                loop.call_soon(self._done, on_done, FAILED)  # closed
        except BufferError:
            loop.call_soon(self._done, on_done, FAILED)
        except KafkaException as err:
            too_large = err.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
            log_event(log, logging.ERROR, "run_state_write_failed", topic=self.topic, partition=partition,
                      error=str(err))
            loop.call_soon(self._done, on_done, TOO_LARGE if too_large else FAILED)

    def _done(self, on_done: Callable[[str], None], status: str) -> None:
        self.unacked -= 1
        if self.unacked == 0:
            self._idle.set()
        on_done(status)

    async def wait_acked(self, timeout_s: float) -> bool:
        """Wait until every write so far was answered; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # -- reading -----------------------------------------------------------------------

    async def read_partition(self, partition: int) -> dict[bytes, bytes]:
        """The latest value of every key in ``partition``, from its beginning to its current
        end (tombstoned keys left out)."""
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, self._read, partition)

    def _read(self, partition: int) -> dict[bytes, bytes]:
        # To the end a fetch reports (end of partition, at or past the end ListOffsets
        # answered), not to that answer: some Kafka-compatible brokers (the embedded one)
        # answer the last batch's first offset + 1, and reading to it left the rest of that
        # batch unread (1,000 of 5,000 runs restored from one batch).
        consumer = Consumer(with_log(self._reader_conf))
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)
            latest: dict[bytes, bytes] = {}
            if high <= low:
                return latest
            consumer.assign([TopicPartition(self.topic, partition, low)])
            position, deadline = low, time.monotonic() + _READ_TIMEOUT_S
            while True:
                if time.monotonic() > deadline:
                    raise StateError(f"reading {self.topic}/{partition} stalled at offset {position} "
                                     f"(end at least {high})")
                for message in consumer.consume(1000, 0.5):
                    if message.error() is not None:
                        if message.error().code() == KafkaError._PARTITION_EOF:
                            if message.offset() >= high:
                                return latest
                            continue
                        raise StateError(f"reading {self.topic}/{partition}: {message.error()}")
                    position = message.offset() + 1
                    key = message.key()
                    if key is None:
                        continue
                    if message.value() is None:
                        latest.pop(key, None)
                    else:
                        latest[key] = message.value()
        except KafkaException as err:
            raise StateError(f"reading {self.topic}/{partition}: {err}") from err
        finally:
            consumer.close()

    async def close(self, timeout_s: float = 10.0) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._host.close, timeout_s)
        self._executor.shutdown(wait=False)


def _no_answer(err: KafkaException) -> bool:
    error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
    return error is not None and (error.code() in _NO_ANSWER or error.retriable())


def _topics(admin: Any) -> dict[str, Any]:
    """The cluster's topics (all of them: asking for one may auto-create it with the
    broker's default partition count)."""
    try:
        return admin.list_topics(timeout=_METADATA_TIMEOUT_S).topics
    except KafkaException as err:
        if _no_answer(err):
            raise _NoAnswer(err.args[0].str()) from None
        raise StateError(f"kafka.state_topic: listing the cluster's topics failed: {err.args[0].str()} (the "
                         "relay's admin client uses the connection settings of kafka.producer_properties)") from err


def _partition_count(topics: dict[str, Any], topic: str) -> int | None:
    metadata = topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return len(metadata.partitions)
