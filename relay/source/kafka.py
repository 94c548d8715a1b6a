"""The Kafka consumer, driven from asyncio.

confluent-kafka's consumer blocks, so every call to it (poll, commit, pause, resume,
close) runs on one dedicated thread, in order. Rebalance callbacks fire on that thread
inside ``poll``; they hand over to the event loop and wait for its answer, so the
pipeline can settle and commit what it owns before a partition moves away.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from relay.errors import RelayError
from relay.kafka_log import KafkaLog, OffsetReset, with_log
from relay.logs import log_event
from relay.ops import OpsError
from relay.ops.kafka_range import watermarks
from relay.source.consumer_thread import ConsumerThread
from relay.source.offsets import Partition, format_partitions

log = logging.getLogger("relay.source")

#: What librdkafka may fetch in one response (``fetch.max.bytes``, a third of its default):
#: with events of tens of MB this memory counts, and for small events it costs nothing
#: measurable. A record larger than a fetch is still fetched whole; records of up to
#: librdkafka's ``receive.message.max.bytes`` (100 MB) are received. What it may hold
#: fetched ahead is ``queued.max.messages.kbytes`` (64 MiB by default; halving it halved
#: the relay's intake of small events).
FETCH_BYTES = 16 * 1024 * 1024
#: Once that fetched-ahead queue has been full, librdkafka waits ``fetch.queue.backoff.ms``
#: (1000 by default) before it fetches again, even when the queue was emptied meanwhile.
#: A relay that drains the queue faster than that (small events at batch-collector rates)
#: then got polls back empty for up to a second every ~27k events: the pipeline alone did
#: 25.5k events/s, against 39-40k at 250 ms (and 37-39k at 20 ms). 250 ms covers queues
#: drained at up to ~256 MiB/s, and with 20 MB events it leaves peak memory where the
#: default does (~470-490 MiB in tests/relay/test_relay_oversize.py; 20 ms: ~530).
FETCH_QUEUE_BACKOFF_MS = 250

#: Defaults that make a manual-commit, at-least-once consumer; user properties win
#: except for the ones the relay's guarantees depend on (see _FORCED).
_DEFAULTS = {
    "auto.offset.reset": "earliest",
    "session.timeout.ms": "10000",
    "heartbeat.interval.ms": "1000",
    "max.poll.interval.ms": "300000",
    "partition.assignment.strategy": "cooperative-sticky",
    "fetch.wait.max.ms": "100",
    "fetch.max.bytes": str(FETCH_BYTES),
    "fetch.queue.backoff.ms": str(FETCH_QUEUE_BACKOFF_MS),
}
_FORCED = {"enable.auto.commit": "false", "enable.auto.offset.store": "false"}
#: Where ``auto.offset.reset`` sends a position the partition does not hold: its start
#: (low watermark) or its end (high watermark). ``error`` is left to librdkafka.
_RESET_TO_START = frozenset({"smallest", "earliest", "beginning"})
_RESET_TO_END = frozenset({"largest", "latest", "end"})
#: Seconds ``KafkaSource.close()`` waits for librdkafka to leave the group.
CLOSE_TIMEOUT_S = 30.0
#: Seconds the check of newly assigned partitions' committed offsets may take.
OFFSET_CHECK_TIMEOUT_S = 10.0
#: Seconds a check of the subscribed topics' metadata may take (see :meth:`KafkaSource.check_topics`).
TOPIC_CHECK_TIMEOUT_S = 5.0
#: How librdkafka reports a subscribed topic the cluster does not hold (a consumer error).
MISSING_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})

RebalanceHandler = Callable[[list[Partition]], Awaitable[dict[Partition, int]]]
T = TypeVar("T")


def _nothing_to_do() -> None:
    pass


class SourceError(RelayError):
    pass


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


class KafkaSource:
    """Consumes ``topics`` in consumer group ``group_id`` with manual commits.

    ``on_assign(partitions)``, ``on_revoke(partitions)`` and ``on_lost(partitions)`` are
    coroutines run on the event loop before the consumer goes on; ``on_revoke`` returns the
    offsets to commit before giving them up. Lost partitions (the group moved on without
    us) commit nothing; ``on_lost`` defaults to ``on_revoke``.

    :attr:`joined` turns True once the first assignment was handled (an empty one too: an
    idle member has joined); :attr:`missing_topics` names the subscribed topics the cluster
    is not known to hold (all of them until :meth:`check_topics` saw them).

    A newly assigned partition whose committed offset it no longer holds starts where
    ``auto.offset.reset`` says, logged ``offset_reset`` and passed to ``on_offset_reset``.
    librdkafka would do the same on the first fetch, but silently, and only with a broker
    that answers ``OFFSET_OUT_OF_RANGE`` (some Kafka-compatible brokers answer an empty
    fetch: the relay would wait there for ever). A committed offset beyond the partition's
    end is confirmed with ``open_reader()``, an assign-only consumer (without one, only
    offsets before the start are checked). Resets librdkafka makes later (retention
    overtaking a lagging relay) come through its log line; all of librdkafka's log lines
    become log events (:mod:`relay.kafka_log`).
    """

    def __init__(self, *, bootstrap_servers: str, group_id: str, topics: tuple[str, ...],
                 properties: dict[str, str], on_assign: RebalanceHandler, on_revoke: RebalanceHandler,
                 on_lost: RebalanceHandler | None = None, on_offset_reset: OffsetReset | None = None,
                 open_reader: Callable[[], Consumer] | None = None) -> None:
        conf: dict[str, Any] = {**_DEFAULTS, **properties, **_FORCED}
        conf["bootstrap.servers"] = bootstrap_servers
        conf["group.id"] = group_id
        conf.setdefault("client.id", "lineage-relay")
        self._reset_policy = str(conf["auto.offset.reset"]).lower()
        self._on_offset_reset = on_offset_reset
        self._open_reader = open_reader
        #: Partitions of the latest assignment that start elsewhere than their committed
        #: offset (nothing before their start was delivered: there is nothing to read back).
        self.reset_at_assignment: frozenset[Partition] = frozenset()
        self._conf = with_log(conf, KafkaLog(on_offset_reset))
        self._topics = list(topics)
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost or on_revoke
        self._executor = ConsumerThread()
        self._consumer: Consumer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.assignment: set[Partition] = set()
        #: Counts revocations (and losses); a batch polled at one generation must skip the
        #: partitions :meth:`revoked_since` names (see :meth:`poll_soon`).
        self.generation = 0
        self._revoked_at: dict[Partition, int] = {}
        self.paused = False
        self._cooperative = conf["partition.assignment.strategy"] == "cooperative-sticky"
        #: How long a rebalance handler may take (restoring run state, the look-back, the
        #: wait for deliveries on revoke): the consumer does not poll meanwhile, and past
        #: max.poll.interval.ms the group removes it anyway.
        self.handover_timeout_s = int(conf["max.poll.interval.ms"]) / 1000
        #: When the rebalance handler running now began (monotonic), else None: the loop
        #: does not turn meanwhile, and may legitimately not for max.poll.interval.ms.
        self.rebalancing_since: float | None = None
        #: The group handed this member its share (possibly none) and on_assign handled it.
        self.joined = False
        #: Subscribed topics not (yet) seen in the cluster's metadata: none of their records
        #: is consumed (a misspelt name, a topic not created yet or deleted).
        self.missing_topics: frozenset[str] = frozenset(self._topics)
        self._reported_missing: frozenset[str] = frozenset()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._consumer = await self._call(Consumer, self._conf)
        except KafkaException as err:
            raise SourceError(f"cannot create the Kafka consumer: {err}") from err
        await self._call(lambda: self._consumer.subscribe(
            self._topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost))

    # -- rebalance callbacks: consumer thread ---------------------------------------
    def _hand_over(self, handler: RebalanceHandler, partitions: list[Partition]) -> dict[Partition, int]:
        assert self._loop is not None
        self.rebalancing_since = time.monotonic()
        try:
            future = asyncio.run_coroutine_threadsafe(handler(partitions), self._loop)
            return future.result(timeout=self.handover_timeout_s)
        except FutureTimeout:
            future.cancel()
            raise SourceError(
                f"handling the rebalance of {format_partitions(partitions)} took longer than max.poll.interval.ms "
                f"({self.handover_timeout_s:g} s), after which the group removes this member: restoring run state "
                "and the look-back happen there; raise kafka.consumer_properties.max.poll.interval.ms, or lower "
                "pipeline.lookback.timeout_s") from None
        finally:
            self.rebalancing_since = None

    def _assigned(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        parts = [(tp.topic, tp.partition) for tp in tps]
        checked = self._checked(consumer, tps)
        if self._cooperative:
            consumer.incremental_assign(checked)
        elif checked is not tps:
            consumer.assign(checked)  # eager: the whole assignment, some with a start offset
        self.assignment.update(parts)
        if tps:
            # librdkafka keeps a partition paused by the application across its unassignment
            # and a later assignment: one paused when it was revoked or lost, and not resumed
            # since (set_paused resumes only what is assigned), would never be fetched again.
            (consumer.pause if self.paused else consumer.resume)(tps)
        self._hand_over(self._on_assign, parts)
        self.joined = True
        log_event(log, logging.INFO, "partitions_assigned", partitions=format_partitions(parts))

    def _checked(self, consumer: Consumer, tps: list[TopicPartition]) -> list[TopicPartition]:
        """``tps``, or a copy where a partition that no longer holds its committed offset
        starts where ``auto.offset.reset`` says (see the class docstring); sets
        :attr:`reset_at_assignment`. A check that fails is logged, and the partitions it
        did not decide start at their committed offset."""
        self.reset_at_assignment = frozenset()
        policy = self._reset_policy
        if not tps or (policy not in _RESET_TO_START and policy not in _RESET_TO_END):
            return tps
        deadline = time.monotonic() + OFFSET_CHECK_TIMEOUT_S
        out = list(tps)
        #: Committed beyond the end the broker's ListOffsets answers: some Kafka-compatible
        #: brokers answer the last batch's first offset + 1 there, so a fetch confirms it.
        beyond: dict[str, dict[int, tuple[int, int, int]]] = {}  # topic: {partition: (index, committed, low)}
        try:
            committed = consumer.committed(tps, timeout=OFFSET_CHECK_TIMEOUT_S)
            for i, tp in enumerate(committed):
                if tp.error is not None or tp.offset < 0:
                    continue
                if time.monotonic() > deadline:  # many partitions, a slow broker: bounded all the same
                    log_event(log, logging.WARNING, "offset_check_incomplete", timeout_s=OFFSET_CHECK_TIMEOUT_S,
                              unchecked=format_partitions([(t.topic, t.partition) for t in committed[i:]
                                                           if t.error is None and t.offset >= 0]),
                              hint="unchecked partitions start at their committed offset")
                    break
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                           timeout=max(0.1, deadline - time.monotonic()))
                cause = out_of_range(tp.offset, low, high)
                if cause == "before_start":
                    out[i] = self._reset(tp, low, high, cause)
                elif cause == "beyond_end" and self._open_reader is not None:
                    beyond.setdefault(tp.topic, {})[tp.partition] = (i, tp.offset, low)
            if beyond:
                assert self._open_reader is not None
                reader = self._open_reader()
                try:
                    for topic, parts in beyond.items():
                        ends = watermarks(reader, topic, list(parts), timeout_s=max(0.1, deadline - time.monotonic()))
                        for p, (i, at, low) in parts.items():
                            if at > ends[p][1]:
                                out[i] = self._reset(TopicPartition(topic, p, at), low, ends[p][1], "beyond_end")
                finally:
                    reader.close()
        except (KafkaException, OpsError) as err:
            log_event(log, logging.WARNING, "offset_check_failed", partitions=format_partitions(
                [(tp.topic, tp.partition) for tp in tps]), error=str(err)[:300],
                hint="partitions not checked start at their committed offset")
        self.reset_at_assignment = frozenset((tp.topic, tp.partition) for a, tp in zip(tps, out) if a is not tp)
        return out if self.reset_at_assignment else tps

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

    def _revoked(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        parts = [(tp.topic, tp.partition) for tp in tps]
        self._mark_revoked(parts)
        offsets = self._hand_over(self._on_revoke, parts)
        try:
            self._commit_now(offsets, consumer)
        except KafkaException:
            offsets = {}  # logged (commit_failed): the new owner reads them again from the last commit
        if self._cooperative:
            consumer.incremental_unassign(tps)
        self.assignment.difference_update(parts)
        log_event(log, logging.INFO, "partitions_revoked", partitions=format_partitions(parts), committed=len(offsets))

    def _lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Lost, not revoked: another member may already own them, so commit nothing.
        parts = [(tp.topic, tp.partition) for tp in tps]
        self._mark_revoked(parts)
        self._hand_over(self._on_lost, parts)
        if self._cooperative:
            consumer.incremental_unassign(tps)
        self.assignment.difference_update(parts)
        log_event(log, logging.WARNING, "partitions_lost", partitions=format_partitions(parts))

    def _mark_revoked(self, parts: list[Partition]) -> None:
        self.generation += 1
        for part in parts:
            self._revoked_at[part] = self.generation

    def _commit_now(self, offsets: dict[Partition, int], consumer: Consumer | None = None) -> None:
        """Commit ``offsets`` on the consumer's thread (with the consumer a rebalance callback
        was given: during ``close()`` it is no longer :attr:`_consumer`)."""
        consumer = consumer if consumer is not None else self._consumer
        if consumer is None or not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as err:
            code = err.args[0].code() if err.args else None
            if code != KafkaError._NO_OFFSET:
                log_event(log, logging.WARNING, "commit_failed", error=str(err))
                raise

    # -- loop side -------------------------------------------------------------------
    def poll_soon(self, max_records: int, timeout_s: float,
                  then: Callable[[list[Message]], T]) -> asyncio.Future[tuple[T, int]]:
        """Start polling now, on the consumer's thread, and run ``then(messages)`` there
        too; the future gives its result and the :attr:`generation` the messages belong to.

        The caller can handle one batch while the next is fetched (and, through ``then``,
        decoded). A revocation may then happen in between: before handling a batch, skip
        the records of ``revoked_since(generation)``, which may have moved to another member
        (or come back with older offsets) since they were polled.
        """
        consumer = self._consumer
        assert consumer is not None

        def job() -> tuple[T, int]:
            messages = consumer.consume(max_records, timeout_s)
            generation = self.generation  # rebalance callbacks run inside consume, on this thread
            return then(messages), generation
        return asyncio.get_running_loop().run_in_executor(self._executor, job)

    def revoked_since(self, generation: int) -> set[Partition]:
        """Partitions revoked or lost after ``generation``."""
        if generation == self.generation:
            return set()
        # A copy: the consumer's thread may add to it meanwhile (a revocation in progress).
        return {part for part, revoked in list(self._revoked_at.items()) if revoked > generation}

    async def commit(self, offsets: dict[Partition, int],
                     still_own: Callable[[Partition], bool] | None = None) -> bool:
        """Commit synchronously; False (logged) when the broker refused, e.g. mid-rebalance.

        ``still_own(partition)``: whether the offsets computed for ``partition`` are still
        the relay's to commit (see :meth:`relay.source.offsets.OffsetTracker.still_owned`);
        asked on the consumer's thread, just before committing. A commit waits there behind
        a poll, whose rebalance may revoke a partition, commit its newer offsets, and assign
        it back: committing these afterwards would move the group's offset back."""
        if not offsets:
            return True
        try:
            await self._call(self._commit_owned, offsets, self.generation, still_own)
            return True
        except KafkaException:
            return False

    def _commit_owned(self, offsets: dict[Partition, int], generation: int,
                      still_own: Callable[[Partition], bool] | None) -> None:
        """On the consumer's thread: commit the offsets of partitions still assigned, not
        revoked since ``generation`` (when :meth:`commit` was called) and ``still_own``.

        ``still_own`` is what keeps a revoked partition out: the generation is bumped on
        this thread before the revoke handler runs on the loop, so offsets computed on the
        loop from the tracker's state before the revocation may come with the bumped
        generation; the tracker gives the partition's log up only in that handler, which
        ``still_own`` sees. The generation still covers a revocation whose handler did not
        get to give the partition up (it failed or outlasted max.poll.interval.ms), and
        callers without a ``still_own``."""
        revoked = self.revoked_since(generation)
        self._commit_now({part: o for part, o in offsets.items()
                          if part in self.assignment and part not in revoked
                          and (still_own is None or still_own(part))})

    def topic_missing(self, topic: str | None) -> None:
        """librdkafka reported ``topic`` (a subscribed one) missing from the cluster: counted
        as missing until :meth:`check_topics` sees it. Any thread."""
        if topic in self._topics and topic not in self.missing_topics:
            self.missing_topics = self.missing_topics | {topic}

    async def check_topics(self) -> None:
        """Ask the cluster's metadata whether the topics in :attr:`missing_topics` exist now
        (one request per such topic; nothing when none is missing). A check that fails
        (the cluster unreachable) changes nothing."""
        consumer, missing = self._consumer, self.missing_topics
        if consumer is None or not missing:
            return

        def present(topic: str) -> bool:
            # One topic's metadata: a consumer does not create it (allow.auto.create.topics).
            found = consumer.list_topics(topic, timeout=TOPIC_CHECK_TIMEOUT_S).topics.get(topic)
            return found is not None and found.error is None and bool(found.partitions)
        try:
            seen = {topic for topic in missing if await self._call(present, topic)}
        except KafkaException as err:
            log_event(log, logging.WARNING, "topic_check_failed", topics=",".join(sorted(missing)),
                      error=str(err)[:300])
            return
        self.missing_topics = self.missing_topics - seen
        if self.missing_topics and self.missing_topics != self._reported_missing:
            log_event(log, logging.WARNING, "topics_missing", topics=",".join(sorted(self.missing_topics)),
                      hint="nothing of them is consumed and /readyz answers 503: check kafka.topics, or create "
                           "them")
        self._reported_missing = self.missing_topics

    async def set_paused(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        assert self._consumer is not None

        def apply() -> None:
            tps = [TopicPartition(t, p) for t, p in self.assignment]
            if tps:
                (self._consumer.pause if paused else self._consumer.resume)(tps)
        await self._call(apply)
        log_event(log, logging.INFO, "consumption_paused" if paused else "consumption_resumed",
                  partitions=len(self.assignment))

    async def lag(self) -> dict[Partition, int]:
        """Per assigned partition: high watermark minus position (from cached fetch data)."""
        consumer = self._consumer
        if consumer is None:
            return {}

        def compute() -> dict[Partition, int]:
            tps = [TopicPartition(t, p) for t, p in self.assignment]
            if not tps:
                return {}
            out = {}
            for tp in consumer.position(tps):
                try:
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                except KafkaException:
                    continue
                if high >= 0 and tp.offset >= 0:
                    out[(tp.topic, tp.partition)] = max(0, high - tp.offset)
            return out
        return await self._call(compute)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Leave the group (librdkafka runs the revoke callback from here: what it commits
        goes through the consumer it is given), within ``timeout_s`` all told: the wait for
        what the consumer's thread is doing (a poll, a commit) and the close. Bounded:
        librdkafka's close has been seen to wait for ever after an assignment callback
        failed, and a relay stopping on that error must still exit; it runs on a daemon
        thread of its own, left behind past ``timeout_s`` (logged ``consumer_close_timeout``,
        with the step that did not finish): the group then drops this member after
        ``session.timeout.ms``, and the partitions are read again from the last commit."""
        deadline = time.monotonic() + timeout_s
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            # After what the consumer's thread is doing: it must not use the consumer while it closes.
            idle = asyncio.get_running_loop().run_in_executor(self._executor, _nothing_to_do)
            done, _ = await asyncio.wait((idle,), timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                self._executor.shutdown(wait=False)
                _close_timed_out(timeout_s, "the consumer's thread was still busy")
                return
        self._executor.shutdown(wait=False)
        if consumer is None:
            return
        failure: list[BaseException] = []

        def close() -> None:
            try:
                consumer.close()
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                failure.append(err)

        closer = threading.Thread(target=close, name="kafka-consumer-close", daemon=True)
        closer.start()
        while closer.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the revoke callback runs its handler on this loop
        if closer.is_alive():
            _close_timed_out(timeout_s, "leaving the group")
        elif failure:
            raise failure[0]


def _close_timed_out(timeout_s: float, step: str) -> None:
    log_event(log, logging.WARNING, "consumer_close_timeout", timeout_s=round(timeout_s, 1), step=step,
              hint="the group drops this member after session.timeout.ms; its partitions are read "
                   "again from the last commit")
