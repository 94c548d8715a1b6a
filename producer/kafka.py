"""``LineageProducer``: OpenLineage events to Kafka without ever holding up the job.

Guarantees:

* ``emit(event)`` never blocks on the network and never raises. It encodes the event
  (JSON, or Avro single-object), picks the official transports' message key
  (:mod:`producer.keys`) and hands the record to librdkafka, or to the journal queue.
  Every problem is logged (one line, key=value) and counted in :attr:`stats`.
* Order: records with one key reach their partition in ``emit`` order, across broker
  outages and journal replays (idempotent producer, ``acks=all``, and the journal is
  replayed, one acknowledged batch at a time, before direct sending resumes).
* Nothing is lost while the process lives or exits normally: when the broker is
  unreachable, the producer is fenced, a delivery fails, or librdkafka's queue
  (``queue_max_events``) is full, the producer switches to *journal mode*: it takes back
  everything librdkafka still holds (in order), appends it and every later event to the
  on-disk journal (:mod:`producer.journal`, fsync-ed), and replays the journal when Kafka
  takes records again. ``close()`` and interpreter exit flush for ``close_timeout_s`` and
  journal whatever is left; while Kafka is not taking records they wait only for events
  not yet in the journal. A journal a dead process left (for the same topic and cluster)
  is resent by the next producer that starts on the same journal directory, before its
  own events (its construction only locks and opens it; the sender thread counts its
  records), and by a running producer, one journal at a time while Kafka is up and its
  own backlog is sent, behind its own events (:mod:`producer.replay`).
* Delivery is at-least-once: a replay after a crash or an outage can repeat events (the
  relay deduplicates).
* ``emit()``, ``flush()``, ``close()`` and ``stats`` are safe in a signal handler, whatever
  it interrupted: an ``emit()`` it interrupted keeps its event and its place, even when
  the handler closes the producer or raises (``sys.exit()``), and a close() that cannot
  finish there is finished when that call returns, or at exit (:mod:`producer.deferred_close`).

Bounded memory: librdkafka holds at most ``queue_max_events`` records, and so does the
spill queue in front of the journal. If the journal writer falls that far behind (a
very slow disk), ``emit`` waits for it -- for the disk, never the network -- up to 1 s,
then drops the event with reason ``queue_full``.

Not guaranteed: events still in memory when the process is killed with SIGKILL (or
crashes in native code) are lost -- up to ``queue_max_events`` in librdkafka plus as many
in the spill queue; the journal itself survives. Dropped, counted and logged by reason:
``not_an_event`` (not a dict, event object or JSON object text: :mod:`producer.event_values`),
``unencodable`` (JSON cannot carry a value), ``too_large`` (over ``message.max.bytes``),
``rejected_by_broker`` (a record Kafka will never accept), ``journal_full``,
``journal_write_failed``, ``queue_full`` (above), ``closed`` (emit after close),
``lost_in_fatal_producer`` (records a broken librdkafka instance never gave back within
5 s), ``late_for_close`` (an event a thread placed holding the producer's lock past a
close's budget, once the sender had journaled without the lock). A forked child gets a
fresh producer of its own (:mod:`producer.forking`).

This module is the caller-facing half; the background thread (journal mode, reclaim,
replay) is :mod:`producer.sender`, and the placement of emit() calls a signal handler
interrupts, or makes, is :mod:`producer.held_emits`.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import weakref
from functools import partial
from threading import get_ident
from typing import Any, Callable

from confluent_kafka import KafkaException, Producer

from producer import log_gate  # noqa: F401 - the producer's loggers and fork() (producer.log_gate)
from producer.codec import encoder
from producer.config import ProducerConfig, load_config, with_overrides
from producer.errors import ConfigError, JournalError
from producer.event_values import NotAnEvent, as_event
from producer.forking import (
    NoKafka,
    close_at_exit,
    register_in_multiprocessing_child,
    reset_in_forked_children,
    resolver_answered,
    resolver_usable,
    start_in_forked_child,
)
from producer.held_emits import FULL_WAIT_S, Emit, HeldEmits
from producer.journal import Journal
from producer.journal_dir import check_journal_dir
from producer.keys import message_key
from producer.orphans import adopt_orphans
from producer.sender import LOCK_WAIT_S, RECLAIM_TIMEOUT_S, Sender
from producer.sources import TRANSPORT_TYPES, disabled, spark_disabled, spark_transport_type
from producer.stats import ProducerStats

log = logging.getLogger(__name__)
_REJECTED_VALUE = re.compile(r'Invalid value ".*" (for configuration property ")', re.DOTALL)


class LineageProducer(HeldEmits, Sender):
    """Sends OpenLineage events (dicts) to one Kafka topic; see the module docstring.

    ``LineageProducer()`` reads every configuration source (:func:`load_config`);
    ``LineageProducer(config)`` uses the given config; keyword ``overrides`` (ProducerConfig
    field names) take precedence over either. Configuration mistakes, including unknown
    librdkafka properties, raise :class:`producer.errors.ConfigError` here. While
    ``OPENLINEAGE_DISABLED=true`` (the OpenLineage clients' switch) it builds a
    :class:`producer.disabled.DisabledProducer` instead (a subclass's constructor too: an
    instance of both): no configuration source is read, nothing is sent.
    """

    _client_refused = False   # a late Kafka client refused its configuration (_kafka_client_back)
    _closing = False          # close() began: no late Kafka client

    def __new__(cls, *args: Any, **kwargs: Any) -> LineageProducer:
        if disabled(os.environ):
            from producer.disabled import disabled_class  # it subclasses this one
            producer = super().__new__(disabled_class(cls))
        else:
            producer = super().__new__(cls)
        _EVERY.add(producer)   # its locks are renewed in a forked child (producer.forking)
        return producer

    def __init__(self, config: ProducerConfig | None = None, **overrides: Any) -> None:
        if config is None:
            config = load_config(overrides)
        elif overrides:
            config = with_overrides(config, overrides)
        self.config = config
        self._encode = encoder(config.encoding)
        self._topic = config.topic
        self._fixed_key = config.message_key.encode() if config.message_key else None
        props = config.kafka_properties()
        # Headroom for the record overhead librdkafka adds to the value.
        self._max_value = int(props.get("message.max.bytes", 1_000_000)) - 512
        check_journal_dir(config.journal_path)
        self._init_sender(config.queue_max_events)
        self._producer = self._new_producer(props)
        # Without a Kafka client (producer.forking), a dead process's journals are left for a
        # producer that can send them. Only locked and opened here: the sender counts them.
        self._journals = self._adopt_orphans() if self._can_send else []
        if self._journals:
            # Events a dead process left behind go first: start in journal mode. (Every one
            # taken may hold records: those with no bytes after their cursor were removed.)
            self._spilling = True
        self._forked = False
        self._start_sender()
        _LIVE.add(self)
        register_in_multiprocessing_child(_close_all_at_exit)

    def _start_sender(self) -> None:
        self._sender = threading.Thread(target=self._run, name=f"lineage-producer[{self._topic}]",
                                        daemon=True)
        self._sender.start()

    # --- construction helpers --------------------------------------------------------

    @classmethod
    def from_spark_conf(cls, conf: dict[str, str]) -> LineageProducer | None:
        """A producer configured from Spark conf (and the other sources, which take
        precedence), or None when ``spark.openlineage.transport.type`` is not ours
        (``kafka`` or this producer) or OpenLineage is disabled."""
        transport_type = spark_transport_type(conf)
        if transport_type not in TRANSPORT_TYPES or spark_disabled(conf, os.environ):
            return None
        return cls(load_config(spark_conf=conf))

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

    # --- the hot path ----------------------------------------------------------------

    def emit(self, event: dict) -> None:
        """Queue one event for Kafka. Never blocks on the network, never raises (an
        exception a signal handler raises while it runs goes on, once its event is placed).
        A value that is not an event (:mod:`producer.event_values`) is dropped:
        ``not_an_event``. Safe in a signal handler, as are flush(), close() and stats
        (:mod:`producer.deferred_close`)."""
        # The emit() call in progress per thread (a signal handler's, inside another, points
        # to that one): a close() from a signal handler (same thread) defers, and a handler's
        # emit() goes after the one it interrupted.
        thread = get_ident()
        emitting = self._emitting
        outer = emitting.get(thread)
        call = emitting[thread] = Emit(event, outer)
        try:
            self._emit(call, thread)
        except BaseException:
            # Only a signal handler's exception gets here (SystemExit, KeyboardInterrupt: _emit
            # takes every Exception): the event it cut short is the job's all the same.
            self._rescue(call, thread)
            raise
        finally:
            if outer is None:
                del emitting[thread]
            else:
                emitting[thread] = outer
            if call.held:
                self._release_held(call)
            if self._deferred is not None:
                self._emit_returned(thread, call.depth)

    def _emit(self, call: Emit, thread: int) -> None:
        try:
            with self._count_lock:
                self._emitted += 1
            if self._encoded(call) is not None:
                self._enqueue(call, thread)
        except Exception as err:  # noqa: BLE001 - emit must never raise into the job
            self._error("emit_failed", err)
            self._rescue(call, thread)

    def _encoded(self, call: Emit) -> tuple[bytes | None, bytes] | None:
        """The call's record (key, value), or None when its event is dropped (counted, logged)."""
        event = call.event
        if type(event) is not dict:
            try:
                event = as_event(event)
            except NotAnEvent as err:
                call.settled = True
                self._drop("not_an_event", err)
                return None
        try:
            value = self._encode(event)
            key = self._fixed_key
            if key is None:
                text = message_key(event)
                key = text.encode() if text is not None else None
        except Exception as err:  # noqa: BLE001 - any encoding failure belongs to the event
            call.settled = True
            self._drop("unencodable", err)
            return None
        if len(value) > self._max_value:
            call.settled = True
            self._drop("too_large", f"{len(value)} bytes, over message.max.bytes")
            return None
        call.record = record = (key, value)
        return record

    def _enqueue(self, call: Emit, thread: int) -> None:
        """Hand the call's record to librdkafka or the spill queue (:meth:`_place`); a drop
        is logged outside ``_lock``: other emit() calls must not wait for a log handler."""
        if self._refuses(thread, call.depth):
            # Before _lock: once close() began, emit() calls do not compete with its sender for it.
            call.settled = True
            dropped: str | None = "closed"
        elif call.outer is not None and (holder := self._holder(call)) is not None:
            # A signal handler's emit() inside one of this thread's that has not placed its
            # event yet, or holds _lock: it goes right after that one's (_holder).
            return self._hold(call, holder)
        else:
            if self._forked:
                start_in_forked_child(self)
            with self._lock:
                dropped = self._place(call, thread, call.depth)
                held, call.held = call.held, None   # handlers' emit() calls that interrupted this one
                held_dropped = self._place_held(held)
            self._after_lock(held_dropped)
        if dropped is not None:
            key = call.record[0] if call.record is not None else None
            self._drop(dropped, self._drop_detail(dropped), key)

    def _place(self, call: Emit, thread: int | None, depth: int) -> str | None:
        """Under ``_lock``: the call's record to librdkafka or the spill queue; returns the
        drop reason when neither takes it. An emit() a deferred close interrupted is placed
        as if the producer were open (:mod:`producer.deferred_close`): after the events
        emitted before it, and never dropped as ``closed``; so is a held-back record
        (``thread`` None: accepted before any close())."""
        if self._refuses(thread, depth):
            call.settled = True
            return "closed"
        key, value = call.record
        if not self._spilling and not self._lockless and self._produce(call, key, value):
            if self._closed:
                self._placed_late()
            return None
        if len(self._spill) >= self._max_spill and not self._space.wait_for(
                lambda: len(self._spill) < self._max_spill or self._closed, FULL_WAIT_S):
            call.settled = True
            return "queue_full"
        if self._refuses(thread, depth):
            call.settled = True
            return "closed"
        self._spill.append(call.record)
        call.settled = True
        if self._closed:
            if self._draining and self._taken_back(call.record):
                return "late_for_close"
            self._placed_late()
        return None

    def _produce(self, call: Emit, key: bytes | None, value: bytes) -> bool:
        """Under ``_lock``: the record to librdkafka; False (journal mode begun) if it refused it."""
        # The emit number rides with the record to its delivery report: reclaimed records
        # are journaled in emit order, whatever order librdkafka reports them in
        # (positional: cheaper than keywords). It rides in a cell its delivery report empties:
        # an emit() cut short before its record is known taken (_rescue) empties it first
        # if the report has not come (_abandon), and whichever comes second knows.
        seq = self._direct_sent
        cell = [seq]
        on_delivery = partial(self._on_delivery, cell)
        # Counted before produce(), with nothing called in between (CPython runs a signal
        # handler only at a call or a loop's back edge): a handler right after produce() (a
        # flush, a close) sees the record counted and waits for it.
        call.cell = cell
        self._direct_sent = seq + 1
        try:
            self._producer.produce(self._topic, value, key, -1, on_delivery)
        except BufferError:
            # librdkafka did not take it: uncounted before anything is called (a signal
            # handler may run at a call, and must not find it counted).
            self._direct_sent = seq
            call.cell = None
            reason = "queue_full"
        except KafkaException as err:
            self._direct_sent = seq
            call.cell = None
            reason = f"produce_failed:{err.args[0].name()}"
        # Any other exception (a signal handler's, raised in a produce() written in Python:
        # an instrumented client) leaves the cell set: librdkafka may or may not have the
        # record, and _rescue settles it either way.
        else:
            call.cell = None
            call.settled = True
            return True
        self._begin_journal_mode_locked(reason)
        return False

    # --- flush, close, stats ------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events accepted by emit() and not yet acknowledged by Kafka, journaled ones
        included, and those of the journals dead processes left that the producer took over
        when it started (one whose records the sender has not counted yet: those counted so
        far, and at least 1); not those of a journal it adopted while running (``stats.adopted``)."""
        # In-memory records first: on their way to a journal they are counted in one
        # place or the next, and the journal they go to may be created meanwhile.
        in_memory = self._not_journaled()
        journals = list(self._journals) + ([self._own] if self._own else [])
        return in_memory + sum(j.pending_at_least for j in journals) + self._left_journaled

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait until every event emitted so far is acknowledged by Kafka, or ``timeout_s``
        (default ``close_timeout_s``) passes. Returns the number still pending (they stay
        queued or journaled, and are not lost): at least that many while a journal a dead
        process left is not counted yet (``pending``). In a signal handler that interrupted
        the producer (:mod:`producer.deferred_close`) it waits only for what librdkafka holds."""
        if self._reentered(get_ident()) is not None:
            self._wait(timeout_s, self._librdkafka_settled)
            return self.pending
        # Without a Kafka client (producer.forking) nothing is acknowledged: the journal is the end.
        self._wait(timeout_s, lambda: self.pending == 0 or (not self._can_send and self._not_journaled() == 0))
        return self.pending

    def close(self, timeout_s: float | None = None) -> None:
        """Flush for up to ``timeout_s`` (default ``close_timeout_s``), then journal what is
        left and stop. While Kafka is not taking records (all brokers down, failed
        deliveries, no delivery report for a while), it waits only until every event is in
        the journal, which the next producer on the journal directory resends: closing never
        waits out an outage. A dead process's journal adopted while running is not waited
        for: no batch of it starts once close() began, and it is released with what it has
        not sent (:mod:`producer.replay`). Idempotent; later ``emit()`` calls are dropped
        (reason ``closed``). Safe in a signal handler: where it cannot wait for the sender
        (inside emit(), the counters or logging, on the calling thread) it is deferred
        (:mod:`producer.deferred_close`); anywhere else it never is, and waits for no lock
        another thread holds for longer than it may wait."""
        if self._stopped:
            return
        self._closing = True
        if self._forked and not self._fork_lock._is_owned():
            with self._fork_lock:   # another thread may be starting it: then it is closed as started
                if self._forked:    # a forked child that never emitted: nothing to send, no thread to stop
                    self._closed = self._stopped = True
                    return _LIVE.discard(self)
        # (A signal handler's close() that interrupted the start, on this thread, is deferred below.)
        deferred = self._deferred
        if deferred is not None:   # the budget of the close that was deferred
            deadline = deferred.deadline
        else:
            deadline = time.monotonic() + (self.config.close_timeout_s if timeout_s is None else timeout_s)
        thread = get_ident()
        reason = self._reentered(thread)
        if reason is not None:
            return self._defer_close(reason, deadline, thread)
        self._take_back_if_kafka_is_down(max(0.0, deadline - time.monotonic()))
        self._wait(max(0.0, deadline - time.monotonic()), self._nothing_to_wait_for)
        # Without _lock, which another thread may hold for longer than this close may wait:
        # emit() reads _closed under it, and the sender's last turn waits for the one that
        # read it just before (bounded: _quiesce_emits) before journaling what is left.
        self._close_deadline = deadline
        self._closed = True
        deferral = self._finishing()
        self._stop.set()
        # The last turn's wait for _lock, then a fatal error's reclaim may take two of its
        # waits (answers, then the purge).
        joined = max(LOCK_WAIT_S, deadline - time.monotonic()) + 2 * RECLAIM_TIMEOUT_S + 5
        self._sender.join(joined)
        if self._sender.is_alive():
            self._error("close_incomplete", f"the sender did not stop within {joined:.0f}s: what it still "
                        "holds is lost if the process exits now")
        else:
            # Freed now, in this process: its callbacks hold this object (a cycle), so it would
            # wait for the garbage collector, which may run first in a fork child, where
            # destroying an instance whose threads stayed in the parent crashes or hangs.
            self._producer = None
        self._stopped = True
        _LIVE.discard(self)
        s = self.stats
        log.info("event=closed topic=%s emitted=%d delivered=%d journaled=%d pending=%d errors=%d%s",
                 self._topic, s.emitted, s.delivered, s.journaled, s.pending, s.errors, deferral)

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

    def _nothing_to_wait_for(self) -> bool:
        return self.pending == 0 or (self._kafka_down and self._not_journaled() == 0)

    def _wait(self, timeout_s: float | None, done: Callable[[], bool]) -> None:
        """Until ``done()``, ``timeout_s`` (default ``close_timeout_s``) passes, or the sender stops."""
        timeout_s = self.config.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not done() and self._sender.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with self._progress:
                self._progress.wait(min(0.05, left))

    def __enter__(self) -> LineageProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> ProducerStats:
        with self._count_lock:
            return ProducerStats(
                emitted=self._emitted, delivered=self._delivered, journaled=self._journaled,
                replayed=self._replayed, delivery_failures=self._delivery_failures,
                errors=self._errors, dropped=dict(self._dropped), pending=self.pending,
                mode="journal" if self._spilling else "direct", adopted=self._adopted_sent,
                close_deferred=self._deferred.reason if self._deferred is not None else None,
            )

    # --- errors ------------------------------------------------------------------------

    def drop(self, reason: str, detail: object, key: bytes | None = None) -> None:
        """Count and log an event that will never be sent (for integrations that reject an
        event before it reaches :meth:`emit`)."""
        self._drop(reason, detail, key)



_LIVE: weakref.WeakSet[LineageProducer] = weakref.WeakSet()
#: Every producer built, closed and disabled ones too.
_EVERY: weakref.WeakSet[LineageProducer] = weakref.WeakSet()


def __getattr__(name: str) -> Any:
    # ``from producer.kafka import DisabledProducer`` as before it moved; imported on use,
    # producer.disabled importing this module.
    if name == "DisabledProducer":
        from producer.disabled import DisabledProducer
        return DisabledProducer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@atexit.register
def _close_all_at_exit() -> None:
    for producer in list(_LIVE):
        try:
            close_at_exit(producer)
        except Exception:  # noqa: BLE001 - best effort at exit; each producer logs its own
            log.exception("event=close_at_exit_failed")


os.register_at_fork(after_in_child=partial(reset_in_forked_children, _LIVE, _close_all_at_exit, _EVERY))
