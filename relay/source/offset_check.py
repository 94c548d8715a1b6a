"""The check of newly assigned partitions' committed offsets.

A newly assigned partition whose committed offset it no longer holds starts where
``auto.offset.reset`` says: at its start (low watermark) for ``earliest`` and its
spellings, at its end (high watermark) for ``latest`` and its spellings; ``error`` and
anything else is left to librdkafka. Each such partition is logged ``offset_reset`` and
passed to ``on_offset_reset``. librdkafka would do the same on the first fetch, but
silently, and only with a broker that answers ``OFFSET_OUT_OF_RANGE`` (some
Kafka-compatible brokers answer an empty fetch: the relay would wait there for ever).

* ``before_start``: retention removed records not read yet (they are lost).
* ``beyond_end``: the topic was deleted and recreated (or truncated). A committed offset
  beyond the end that ListOffsets answers is confirmed with ``open_reader()``, an
  assign-only consumer (some Kafka-compatible brokers answer the last batch's first
  offset + 1 there); without one, only offsets before the start are checked.

Bounded by :data:`OFFSET_CHECK_TIMEOUT_S`: partitions not reached by then are logged
(``offset_check_incomplete``) and start at their committed offset, as do those a failed
check did not decide (logged ``offset_check_failed``), and all once the relay is asked to
stop (none of their records is handled then; a broker request under way is waited for).
Where a partition with nothing committed starts (its start, or end, now) is asked only
for the lag of one assigned while paused, after the committed ones are checked and with
the time left, in one request for all; a failure there costs only that lag
(``offset_check_starts_unknown``). Under ``latest`` that end is the one at the assignment:
librdkafka takes the end when it starts fetching, so should that be later (assigned while
paused), the lag also counts records it then skips, until the first record is consumed.
It runs on the consumer's thread, in the assignment callback.
Resets librdkafka makes later (retention overtaking a lagging relay) come through its log
line (:mod:`relay.kafka_log`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

from relay.kafka_log import OffsetReset
from relay.logs import log_event
from relay.ops import OpsError
from relay.ops.kafka_range import watermarks
from relay.source.offsets import Partition, format_partitions

log = logging.getLogger("relay.source")

#: Where ``auto.offset.reset`` sends a position the partition does not hold: its start
#: (low watermark) or its end (high watermark). ``error`` is left to librdkafka.
_RESET_TO_START = frozenset({"smallest", "earliest", "beginning"})
_RESET_TO_END = frozenset({"largest", "latest", "end"})
#: Seconds the check of newly assigned partitions' committed offsets may take.
OFFSET_CHECK_TIMEOUT_S = 10.0


def out_of_range(committed: int, low: int, high: int) -> str | None:
    """Why a partition no longer holds its ``committed`` offset, or None when it does (or
    nothing is committed): ``before_start``, retention removed records not read yet (they
    are lost); ``beyond_end``, the topic was deleted and recreated (or truncated), and what
    it holds now was never read."""
    if committed < 0:
        return None
    if committed < low:
        return "before_start"
    if committed > high:
        return "beyond_end"
    return None


class OffsetCheck:
    """Checks assignments under one ``auto.offset.reset`` ``policy`` (lower case); see the
    module docstring."""

    def __init__(self, policy: str, on_offset_reset: OffsetReset | None,
                 open_reader: Callable[[], Consumer] | None, stopping: Callable[[], bool] | None = None) -> None:
        self._reset_policy = policy
        self._on_offset_reset = on_offset_reset
        self._open_reader = open_reader
        #: True once the relay is asked to stop: no check then (none of the partitions'
        #: records is handled), and one under way ends at its next step.
        self._stopping = stopping or (lambda: False)

    def checked(self, consumer: Consumer, tps: list[TopicPartition],
                starts: dict[Partition, int] | None = None) -> tuple[list[TopicPartition], frozenset[Partition]]:
        """``tps``, or a copy where a partition that no longer holds its committed offset
        starts where ``auto.offset.reset`` says; and the partitions so reset. ``starts``
        gets the offset each partition checked starts from: its committed offset, the one
        it was reset to, or for one with nothing committed its start or end now (where
        ``auto.offset.reset`` sends it: librdkafka takes the end at its first fetch). A
        partition not checked (see the module docstring) is left out of it."""
        policy = self._reset_policy
        if not tps or (policy not in _RESET_TO_START and policy not in _RESET_TO_END) or self._stopping():
            return tps, frozenset()
        starts = {} if starts is None else starts
        deadline = time.monotonic() + OFFSET_CHECK_TIMEOUT_S
        out = list(tps)
        #: Committed beyond the end the broker's ListOffsets answers: some Kafka-compatible
        #: brokers answer the last batch's first offset + 1 there, so a fetch confirms it.
        beyond: dict[str, dict[int, tuple[int, int, int]]] = {}  # topic: {partition: (index, committed, low)}
        fresh: list[Partition] = []  # nothing committed
        try:
            committed = consumer.committed(tps, timeout=OFFSET_CHECK_TIMEOUT_S)
            for i, tp in enumerate(committed):
                if tp.error is not None:
                    continue
                if self._stopping():  # not handled anyway: the relay exits within its time
                    break
                if time.monotonic() > deadline:  # many partitions, a slow broker: bounded all the same
                    log_event(log, logging.WARNING, "offset_check_incomplete", timeout_s=OFFSET_CHECK_TIMEOUT_S,
                              unchecked=format_partitions([(t.topic, t.partition) for t in committed[i:]
                                                           if t.error is None and t.offset >= 0]),
                              hint="unchecked partitions start at their committed offset")
                    break
                part = (tp.topic, tp.partition)
                if tp.offset < 0:  # nothing committed: nothing to check (where it starts is asked after)
                    fresh.append(part)
                    continue
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                           timeout=max(0.1, deadline - time.monotonic()))
                starts[part] = tp.offset
                cause = out_of_range(tp.offset, low, high)
                if cause == "before_start":
                    out[i] = self._reset(tp, low, high, cause)
                    starts[part] = out[i].offset
                elif cause == "beyond_end" and self._open_reader is not None:
                    beyond.setdefault(tp.topic, {})[tp.partition] = (i, tp.offset, low)
            if beyond and not self._stopping():
                assert self._open_reader is not None
                reader = self._open_reader()
                try:
                    for topic, parts in beyond.items():
                        ends = watermarks(reader, topic, list(parts), timeout_s=max(0.1, deadline - time.monotonic()))
                        for p, (i, at, low) in parts.items():
                            if at > ends[p][1]:
                                out[i] = self._reset(TopicPartition(topic, p, at), low, ends[p][1], "beyond_end")
                                starts[(topic, p)] = out[i].offset
                finally:
                    reader.close()
        except (KafkaException, OpsError) as err:
            log_event(log, logging.WARNING, "offset_check_failed", partitions=format_partitions(
                [(tp.topic, tp.partition) for tp in tps]), error=str(err)[:300],
                hint="partitions not checked start at their committed offset")
        if fresh and not self._stopping() and time.monotonic() < deadline:
            self._fresh_starts(consumer, fresh, deadline, starts)
        reset = frozenset((tp.topic, tp.partition) for a, tp in zip(tps, out) if a is not tp)
        return (out if reset else tps), reset

    def _fresh_starts(self, consumer: Consumer, parts: list[Partition], deadline: float,
                      starts: dict[Partition, int]) -> None:
        """Where partitions with nothing committed start (their start or end now, as
        ``auto.offset.reset`` says), into ``starts``: one ListOffsets request for all
        (``offsets_for_times`` with the logical offset as its timestamp). Only for the lag
        of a partition assigned while paused, so asked after the check, with the time left;
        a failure costs only that (logged ``offset_check_starts_unknown``, at INFO)."""
        logical = OFFSET_BEGINNING if self._reset_policy in _RESET_TO_START else OFFSET_END
        try:
            answered = consumer.offsets_for_times([TopicPartition(t, p, logical) for t, p in parts],
                                                  timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as err:
            log_event(log, logging.INFO, "offset_check_starts_unknown", partitions=format_partitions(parts),
                      error=str(err)[:300], hint="their lag is reported once records are consumed from them")
            return
        for tp in answered:
            if tp.error is None and tp.offset >= 0:
                starts[(tp.topic, tp.partition)] = tp.offset

    def _reset(self, committed: TopicPartition, low: int, high: int, cause: str) -> TopicPartition:
        """Where a partition that does not hold its ``committed`` offset starts (logged)."""
        start = low if self._reset_policy in _RESET_TO_START else high
        topic, partition = committed.topic, committed.partition
        log_event(log, logging.WARNING, "offset_reset", topic=topic, partition=partition,
                  from_offset=committed.offset, to_offset=start, low=low, high=high, cause=cause,
                  records_lost=low - committed.offset if cause == "before_start" else 0,
                  hint="retention removed records before the relay read them: raise the topic's retention.ms "
                       "or the relay's capacity" if cause == "before_start" else
                       "the topic was deleted and recreated (or truncated): it is read from where "
                       "auto.offset.reset says")
        if self._on_offset_reset is not None:
            self._on_offset_reset(topic, partition)
        return TopicPartition(topic, partition, start)
