"""Read back what came before the committed offset when partitions are assigned.

A relay reads a newly assigned partition from its committed offset: at start, after a
restart, or when a rebalance hands it partitions another replica had. The runs begun
before that offset are unknown to it. Their later events would be held for
``hold_timeout_s`` waiting for a START that was delivered long ago (and dead-lettered at
the timeout with ``on_hold_timeout: dead_letter``); a terminal delivered before the
commit would not stop a late copy of an earlier event; and events their producer sent
again across the restart would not be recognised as duplicates.

So, before the first record of a newly assigned partition is handled, the last
``max_records`` records before its committed offset are read (an assign-only consumer: no
group membership, no commits) and decoded, and each collector lane is told about them
(:meth:`relay.lane.CollectorLane.prime`): a START marks its run started, a terminal marks
it finished, digests are remembered for dedupe, as if the lane had just forwarded them.
Nothing is delivered. Everything below the committed offset was delivered, dead-lettered
or deliberately not forwarded, and nothing there is held (held events keep their offsets
uncommitted), so this is what the lane knew then.

Bounded: at most ``max_records`` per partition and ``timeout_s`` in all (then what was
read so far is used: logged ``lookback_incomplete``); records are decoded in steps of
about 8 MB (at least one record), each handed to the event loop before the next is
decoded, and librdkafka fetches at most 16 MB ahead. A failure to read
is logged (``lookback_failed``) and consumption goes on without it: ordering then falls
back to holding (see the README).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from relay.config import KafkaConfig, LookbackConfig
from relay.events import LineageEvent, SourceRef
from relay.logs import log_event
from relay.ops import OpsError
from relay.ops.kafka_range import PartitionRange, open_consumer, read_topics
from relay.source.offsets import Partition, format_partitions
from relay.stages.decode import decode_record

log = logging.getLogger("relay.lookback")

#: Bytes of records decoded per step (at least one record): what a step holds decoded.
_CHUNK_BYTES = 8 << 20
#: What librdkafka fetches ahead for the read back (its default is 64 MB a partition).
_QUEUED_KBYTES = "16384"


class LookbackError(Exception):
    pass


class Lookback:
    """Primes the lanes (``prime(event, now)``) with what came before the committed
    offsets of newly assigned partitions; see the module docstring."""

    def __init__(self, kafka: KafkaConfig, config: LookbackConfig, *, max_bytes: int,
                 prime: Callable[[LineageEvent, float], None], stopping: Callable[[], bool] | None = None) -> None:
        self._kafka = kafka
        self._config = config
        self._max_bytes = max_bytes
        self._prime = prime
        #: True once the relay is asked to stop: a read back under way ends (on its thread).
        self._stopping = stopping
        # One thread: a consumer is used from the thread that made it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookback")
        #: Partitions read back from above their start: (their start, where the read began).
        #: What lies below is unknown (see relay.source.run_search). Kept while assigned.
        self.floors: dict[Partition, tuple[int, int]] = {}

    def forget(self, partitions: list[Partition]) -> None:
        """No longer assigned: what was read back from them no longer applies."""
        for p in partitions:
            self.floors.pop(p, None)

    async def prime(self, partitions: list[Partition]) -> int:
        """Read back and hand over; returns how many events the lanes were told about."""
        if not partitions or self._config.max_records == 0:
            return 0
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        reader = _Reader(self._kafka, partitions, self._config.max_records, self._max_bytes,
                         began + self._config.timeout_s, stop=self._stopping)
        primed = 0
        given_up = False
        try:
            while True:
                chunk = await loop.run_in_executor(self._executor, reader.next_chunk)
                if chunk is None:
                    break
                now = time.monotonic()
                for event in chunk:
                    self._prime(event, now)
                primed += len(chunk)
        except (KafkaException, LookbackError, OpsError) as err:
            log_event(log, logging.WARNING, "lookback_failed", partitions=format_partitions(partitions), events=primed,
                      error=str(err)[:300],
                      hint="runs begun before the committed offset are held until hold_timeout_s")
            return primed
        except asyncio.CancelledError:
            given_up = True  # a stop: not waited for (see below)
            raise
        finally:
            closing = loop.run_in_executor(self._executor, reader.close)
            if not given_up:
                await closing
            # else: closed on its thread once its step ends (soon: it sees the stop), unwaited.
        self.floors.update((p, floor) for p, floor in reader.floors.items() if p not in reader.unfinished)
        if reader.unfinished:
            log_event(log, logging.WARNING, "lookback_incomplete", partitions=format_partitions(sorted(reader.unfinished)),
                      events=primed, timeout_s=self._config.timeout_s,
                      hint="raise pipeline.lookback.timeout_s, or lower max_records")
        log_event(log, logging.INFO, "lookback_read", partitions=format_partitions(partitions), records=reader.records,
                  events=primed, seconds=round(time.monotonic() - began, 3))
        return primed

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class _Reader:
    """Runs on the lookback thread only."""

    def __init__(self, kafka: KafkaConfig, partitions: list[Partition], max_records: int, max_bytes: int,
                 deadline: float, stop: Callable[[], bool] | None = None) -> None:
        self._kafka = kafka
        self._stop = stop
        self._partitions = partitions
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._consumer: Consumer | None = None
        #: The read (None until opened).
        self._reading: Generator[Message, None, None] | None = None
        #: Partitions not read back to their committed offset for want of time.
        self.unfinished: set[Partition] = set()
        #: Partitions read back from above their start: (their start, where the read began).
        self.floors: dict[Partition, tuple[int, int]] = {}
        self.records = 0

    def _open(self) -> dict[str, list[PartitionRange]]:
        """The ranges to read: up to ``max_records`` before each committed offset."""
        consumer = self._consumer = open_consumer(self._kafka, self._kafka.group_id, client_id="lineage-relay-lookback",
                                                  overrides={"queued.max.messages.kbytes": _QUEUED_KBYTES})
        committed = consumer.committed([TopicPartition(t, p) for t, p in self._partitions], timeout=self._left())
        ranges: dict[str, list[PartitionRange]] = {}
        for tp in committed:
            if tp.error is not None:
                raise LookbackError(f"committed offset of {tp.topic}/{tp.partition}: {tp.error}")
            if tp.offset <= 0:
                continue  # nothing committed (or nothing before it)
            low, _high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=self._left())
            start = max(low, tp.offset - self._max_records)
            if start < tp.offset:
                ranges.setdefault(tp.topic, []).append(PartitionRange(tp.partition, start, tp.offset))
            if start > low:
                self.floors[(tp.topic, tp.partition)] = (low, start)
        return ranges

    def _left(self) -> float:
        """Seconds left for the look-back (a broker request needs some, even late)."""
        return max(0.1, self._deadline - time.monotonic())

    def next_chunk(self) -> list[LineageEvent] | None:
        """The next events read back (about ``_CHUNK_BYTES`` of records, decoded), or None
        when done (or out of time: see ``unfinished``)."""
        if self._reading is None:
            if self._stop is not None and self._stop():
                return None
            ranges = self._open()
            assert self._consumer is not None
            self._reading = read_topics(self._consumer, ranges, self._deadline, self.unfinished, stop=self._stop)
        events: list[LineageEvent] = []
        size = 0
        while size < _CHUNK_BYTES:
            msg = next(self._reading, None)
            if msg is None:
                return events or None
            self.records += 1
            value = msg.value()
            size += len(value) if value else 0
            decoded = decode_record(value, max_bytes=self._max_bytes,
                                    source=SourceRef(msg.topic(), msg.partition(), msg.offset()))
            if type(decoded) is LineageEvent:
                events.append(decoded)
        return events

    def close(self) -> None:
        if self._reading is not None:
            self._reading.close()  # it unassigns the consumer
            self._reading = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
