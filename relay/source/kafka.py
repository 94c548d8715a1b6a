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
from relay.source.admin import connection_properties
from relay.source.broker_contact import BrokerContact
from relay.source.consumer_config import consumer_config
from relay.source.consumer_thread import ConsumerThread
from relay.source.end_offsets import EndOffsets
from relay.source.offset_check import OffsetCheck
from relay.source.offsets import Partition, format_partitions
from relay.source.properties import scrub

log = logging.getLogger("relay.source")

#: Seconds ``KafkaSource.close()`` waits for librdkafka to leave the group.
CLOSE_TIMEOUT_S = 30.0
#: Seconds a check of the subscribed topics' metadata may take (see :meth:`KafkaSource.check_topics`).
TOPIC_CHECK_TIMEOUT_S = 5.0
#: What a rebalance handler leaves of max.poll.interval.ms (a fifth of it at most) for what
#: the callback does after it: the commit of a revocation, the answer crossing threads.
HANDOVER_MARGIN_S = 3.0
#: How librdkafka reports a subscribed topic the cluster does not hold (a consumer error).
MISSING_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})

RebalanceHandler = Callable[[list[Partition]], Awaitable[dict[Partition, int]]]
T = TypeVar("T")


def _nothing_to_do() -> None:
    pass


class SourceError(RelayError):
    pass


class KafkaSource:
    """Consumes ``topics`` in consumer group ``group_id`` with manual commits.

    ``on_assign(partitions)``, ``on_revoke(partitions)`` and ``on_lost(partitions)`` are
    coroutines run on the event loop before the consumer goes on; ``on_revoke`` returns the
    offsets to commit before giving them up. Lost partitions (the group moved on without
    us) commit nothing; ``on_lost`` defaults to ``on_revoke``.

    :attr:`joined` turns True once the first assignment was handled (an empty one too: an
    idle member has joined); :attr:`unseen_topics` names the subscribed topics not yet seen
    in the cluster's metadata (all of them until :meth:`check_topics` saw them), and
    :attr:`missing_topics` those of them the cluster said it does not hold (none while it
    has not answered: an unreachable broker is not a missing topic). Every answer of the
    cluster is told to ``broker`` (:class:`~relay.source.broker_contact.BrokerContact`).

    A newly assigned partition whose committed offset it no longer holds starts where
    ``auto.offset.reset`` says, logged ``offset_reset`` and passed to ``on_offset_reset``
    (:mod:`relay.source.offset_check`; a committed offset beyond the partition's end is
    confirmed with ``open_reader()``, an assign-only consumer; the check ends once
    ``stopping()``). All of librdkafka's log lines become log events (:mod:`relay.kafka_log`).
    """

    def __init__(self, *, bootstrap_servers: str, group_id: str, topics: tuple[str, ...],
                 properties: dict[str, str], on_assign: RebalanceHandler, on_revoke: RebalanceHandler,
                 on_lost: RebalanceHandler | None = None, on_offset_reset: OffsetReset | None = None,
                 open_reader: Callable[[], Consumer] | None = None, broker: BrokerContact | None = None,
                 stopping: Callable[[], bool] | None = None) -> None:
        self.broker = broker or BrokerContact(bootstrap_servers)
        conf = consumer_config(bootstrap_servers, group_id, properties)
        self._offset_check = OffsetCheck(str(conf["auto.offset.reset"]).lower(), on_offset_reset, open_reader,
                                         stopping=stopping)
        #: Partitions of the latest assignment that start elsewhere than their committed
        #: offset (nothing before their start was delivered: there is nothing to read back).
        self.reset_at_assignment: frozenset[Partition] = frozenset()
        #: Where each assigned partition starts, as the offset check found (see :meth:`lag`).
        self._starts: dict[Partition, int] = {}
        self._conf = with_log(conf, KafkaLog(on_offset_reset))
        # What asks the broker for the end offsets (:meth:`lag`): the consumer's connection.
        self._admin_conf = with_log({"client.id": "lineage-relay-lag", **connection_properties(properties),
                                     "bootstrap.servers": bootstrap_servers})
        self._isolation_level = str(conf.get("isolation.level", "read_committed"))
        self._end_offsets: EndOffsets | None = None
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
        #: is consumed. :attr:`missing_topics`: those the cluster said it does not hold (a
        #: misspelt name, a topic not created yet or deleted); the others have had no answer.
        self.unseen_topics: frozenset[str] = frozenset(self._topics)
        self.missing_topics: frozenset[str] = frozenset()
        self._reported_missing: frozenset[str] = frozenset()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._consumer = await self._call(Consumer, self._conf)
        except KafkaException as err:
            # librdkafka quotes values (a file's path, a mechanism from a secret variable).
            text = scrub(str(err), {k: v for k, v in self._conf.items() if isinstance(v, str)})
            raise SourceError(f"cannot create the Kafka consumer: {text}") from err
        try:
            self._end_offsets = EndOffsets(self._admin_conf, isolation_level=self._isolation_level,
                                           on_answer=self.broker.mark_answered)
        except KafkaException as err:
            text = scrub(str(err), {k: v for k, v in self._admin_conf.items() if isinstance(v, str)})
            raise SourceError(f"cannot create the Kafka admin client that measures the consumer lag: {text}") from err
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

    def handover_left(self) -> float:
        """Seconds the rebalance handler running now may still take: what is left of
        max.poll.interval.ms since it began, less :data:`HANDOVER_MARGIN_S` for the rest of
        the callback (infinite when none runs). On the loop, from the handler."""
        since = self.rebalancing_since
        if since is None:
            return float("inf")
        margin = min(HANDOVER_MARGIN_S, self.handover_timeout_s / 5)
        return max(0.0, since + self.handover_timeout_s - margin - time.monotonic())

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
        self.broker.mark_answered()  # the group coordinator did
        self._hand_over(self._on_assign, parts)
        self.joined = True
        log_event(log, logging.INFO, "partitions_assigned", partitions=format_partitions(parts))

    def _checked(self, consumer: Consumer, tps: list[TopicPartition]) -> list[TopicPartition]:
        """``tps``, or a copy where a partition that no longer holds its committed offset
        starts where ``auto.offset.reset`` says (see the class docstring); sets
        :attr:`reset_at_assignment`. A check that fails is logged, and the partitions it
        did not decide start at their committed offset."""
        self.reset_at_assignment = frozenset()
        starts: dict[Partition, int] = {}
        checked, self.reset_at_assignment = self._offset_check.checked(consumer, tps, starts)
        for tp in tps:
            self._starts.pop((tp.topic, tp.partition), None)
        self._starts.update(starts)
        return checked

    def _revoked(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        parts = [(tp.topic, tp.partition) for tp in tps]
        self._mark_revoked(parts)
        offsets = self._given_up(self._on_revoke, parts)
        try:
            self._commit_now(offsets, consumer)
        except KafkaException:
            offsets = {}  # logged (commit_failed): the new owner reads them again from the last commit
        if self._cooperative:
            consumer.incremental_unassign(tps)
        self.assignment.difference_update(parts)
        self._forget_starts(parts)
        log_event(log, logging.INFO, "partitions_revoked", partitions=format_partitions(parts), committed=len(offsets))

    def _lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Lost, not revoked: another member may already own them, so commit nothing.
        parts = [(tp.topic, tp.partition) for tp in tps]
        self._mark_revoked(parts)
        self._given_up(self._on_lost, parts)
        if self._cooperative:
            consumer.incremental_unassign(tps)
        self.assignment.difference_update(parts)
        self._forget_starts(parts)
        log_event(log, logging.WARNING, "partitions_lost", partitions=format_partitions(parts))

    def _given_up(self, handler: RebalanceHandler, parts: list[Partition]) -> dict[Partition, int]:
        """Hand revoked or lost ``parts`` over to ``handler``. Should it fail (or outlast
        max.poll.interval.ms), they are no longer assigned all the same: no later commit
        (the shutdown's) includes them, since another member reads them from the last
        commit, and may have committed further already (moving its offset back: duplicates)."""
        try:
            return self._hand_over(handler, parts)
        except BaseException:
            self.assignment.difference_update(parts)
            raise

    def _forget_starts(self, parts: list[Partition]) -> None:
        for part in parts:
            self._starts.pop(part, None)

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
        """librdkafka reported ``topic`` (a subscribed one) missing from the cluster (its
        metadata said so): counted as missing until :meth:`check_topics` sees it. Any thread."""
        self.broker.mark_answered()
        if topic in self._topics and topic not in self.missing_topics:
            self.unseen_topics = self.unseen_topics | {topic}
            self.missing_topics = self.missing_topics | {topic}

    async def check_topics(self) -> None:
        """Ask the cluster's metadata whether the topics in :attr:`unseen_topics` exist now
        (one request per such topic; nothing when all were seen): those it does not hold
        are :attr:`missing_topics`. A check that fails (the cluster unreachable) changes
        nothing."""
        consumer, unseen = self._consumer, self.unseen_topics
        if consumer is None or not unseen:
            return

        def present(topic: str) -> bool:
            # One topic's metadata: a consumer does not create it (allow.auto.create.topics).
            found = consumer.list_topics(topic, timeout=TOPIC_CHECK_TIMEOUT_S).topics.get(topic)
            self.broker.mark_answered()
            return found is not None and found.error is None and bool(found.partitions)
        try:
            seen = {topic for topic in unseen if await self._call(present, topic)}
        except KafkaException as err:
            log_event(log, logging.WARNING, "topic_check_failed", topics=",".join(sorted(unseen)),
                      error=str(err)[:300])
            return
        self.unseen_topics = self.unseen_topics - seen
        self.missing_topics = (self.missing_topics | unseen) - seen
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
        """Per assigned partition: its end offset minus its position; for one the consumer has
        not fetched from since it was assigned (assigned while paused: its position is
        unknown), minus where it starts, as the offset check found at the assignment. Left
        out: a partition of neither (its check did not decide it; ``auto.offset.reset``
        ``error``), or whose end offset is not known yet.

        The end offset is the later of librdkafka's cached one (from fetch responses: none
        come for a paused partition, nor while the broker is unreachable) and the broker's
        answer to the previous call, which asked it (:class:`~relay.source.end_offsets.EndOffsets`,
        without waiting): called every lag interval, a paused partition's lag counts the
        records that arrived up to one interval before. While the broker does not answer,
        the last known end offset stays."""
        consumer, end_offsets = self._consumer, self._end_offsets
        if consumer is None:
            return {}

        def compute() -> dict[Partition, int]:
            parts = list(self.assignment)
            if end_offsets is not None:
                end_offsets.ask(parts)
            if not parts:
                return {}
            stated = end_offsets.known() if end_offsets is not None else {}
            starts = self._starts
            out = {}
            for tp in consumer.position([TopicPartition(t, p) for t, p in parts]):
                part = (tp.topic, tp.partition)
                try:
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                except KafkaException:
                    high = -1
                high = max(high, stated.get(part, -1))
                at = tp.offset if tp.offset >= 0 else starts.get(part, -1)
                if high >= 0 and at >= 0:
                    out[part] = max(0, high - at)
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
        end_offsets, self._end_offsets = self._end_offsets, None
        if end_offsets is not None:
            end_offsets.close()
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
