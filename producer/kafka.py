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
``unencodable`` (JSON cannot carry a value), ``too_large`` (key and value together over
``message.max.bytes`` less 512 bytes of record overhead, a key over the 65,534 bytes a journal
record holds, or a record librdkafka's ``produce()`` refuses for its size, directly or from a journal),
``rejected_by_broker`` (a record Kafka will never accept), ``journal_full``,
``journal_write_failed``, ``journal_corrupt`` (a corrupt region of an on-disk journal skipped:
one per region, the number of its records unknown; the records after it are kept),
``queue_full`` (above), ``closed`` (emit after close),
``lost_in_fatal_producer`` (records a broken librdkafka instance never gave back within
5 s), ``late_for_close`` (an event a thread placed holding the producer's lock past a
close's budget, once the sender had journaled without the lock). A forked child gets a
fresh producer of its own (:mod:`producer.forking`).

This module is the caller-facing half: construction, emit() and stats. flush(), close()
and the close at exit are :mod:`producer.closing`; the librdkafka instance (or none, in a
forked child) is :mod:`producer.kafka_client`; the background thread (journal mode,
replay) is :mod:`producer.sender`, its reclaim and instance replacement
:mod:`producer.replacement`; the placement of emit() calls a signal handler interrupts,
or makes, is :mod:`producer.held_emits`.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from functools import partial
from threading import get_ident
from typing import Any

from confluent_kafka import KafkaException

from producer import log_gate  # noqa: F401 - the producer's loggers and fork() (producer.log_gate)
from producer.closing import _LIVE, _UNFINISHED, Closing, _close_all_at_exit
from producer.codec import encoder
from producer.config import ProducerConfig, load_config, with_overrides
from producer.delivery import refused_for_good
from producer.event_values import NotAnEvent, as_event
from producer.forking import (
    freeze_inherited_in_child,
    pause_gc_for_fork,
    register_in_multiprocessing_child,
    reset_in_forked_children,
    resume_gc_after_fork,
    start_in_forked_child,
)
from producer.held_emits import FULL_WAIT_S, Emit, HeldEmits
from producer.journal import MAX_KEY_BYTES
from producer.journal_dir import check_journal_dir
from producer.kafka_client import KafkaClient
from producer.keys import message_key
from producer.sender import Sender
from producer.sources import TRANSPORT_TYPES, disabled, spark_disabled, spark_transport_type
from producer.stats import ProducerStats

log = logging.getLogger(__name__)


class LineageProducer(HeldEmits, KafkaClient, Closing, Sender):
    """Sends OpenLineage events (dicts) to one Kafka topic; see the module docstring.

    ``LineageProducer()`` reads every configuration source (:func:`load_config`);
    ``LineageProducer(config)`` uses the given config; keyword ``overrides`` (ProducerConfig
    field names) take precedence over either. Configuration mistakes, including unknown
    librdkafka properties, raise :class:`producer.errors.ConfigError` here. While
    ``OPENLINEAGE_DISABLED=true`` (the OpenLineage clients' switch) it builds a
    :class:`producer.disabled.DisabledProducer` instead (a subclass's constructor too: an
    instance of both): no configuration source is read, nothing is sent.
    """

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
        # Key and value together, with headroom for the record overhead librdkafka adds.
        self._max_record = int(props.get("message.max.bytes", 1_000_000)) - 512
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
        key_bytes = len(key) if key is not None else 0
        if key_bytes + len(value) > self._max_record:
            call.settled = True
            self._drop("too_large", f"{key_bytes + len(value)} bytes (key {key_bytes}, value {len(value)}), over "
                       f"message.max.bytes less 512 bytes of overhead ({self._max_record})", _shown(key))
            return None
        if key_bytes > MAX_KEY_BYTES:
            call.settled = True
            self._drop("too_large", f"a key of {key_bytes} bytes, over the {MAX_KEY_BYTES} bytes a journal record "
                       "holds", _shown(key))
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
        elif (holder := self._holder(call)) is not None:
            # A signal handler's emit() inside one of this thread's that has not placed its
            # event yet, or while this thread holds _lock (an emit() holding it, or placing
            # the records held for one that already returned: _release_held): it goes right
            # after that one's (_holder).
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
            self._drop(dropped, self._drop_detail(dropped, call), key)

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
        if not self._spilling and not self._lockless:
            taken = self._produce(call, key, value)
            if taken is True:
                if self._closed:
                    self._placed_late()
                return None
            if taken:   # librdkafka refuses the record itself: it never will take it
                return taken
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

    def _produce(self, call: Emit, key: bytes | None, value: bytes) -> bool | str:
        """Under ``_lock``: the record to librdkafka; False (journal mode begun) if it refused
        it for now; the drop reason (``too_large``) if it refused the record itself (its size:
        librdkafka's own check, which the size check in :meth:`_encoded` should have made first):
        journaled, it would be refused for ever."""
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
            if refused_for_good(err.args[0].code()):
                call.settled = True
                call.detail = f"librdkafka refused the record: {err.args[0].str()}"
                return "too_large"
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

    # --- stats, drops ------------------------------------------------------------------

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

    def drop(self, reason: str, detail: object, key: bytes | None = None) -> None:
        """Count and log an event that will never be sent (for integrations that reject an
        event before it reaches :meth:`emit`)."""
        self._drop(reason, detail, key)


def _shown(key: bytes | None) -> bytes | None:
    """A key as a drop's log line shows it: its first 100 bytes."""
    return key if key is None or len(key) <= 100 else key[:100] + b"..."


#: Every producer built, closed and disabled ones too.
_EVERY: weakref.WeakSet[LineageProducer] = weakref.WeakSet()


def __getattr__(name: str) -> Any:
    # ``from producer.kafka import DisabledProducer`` as before it moved; imported on use,
    # producer.disabled importing this module.
    if name == "DisabledProducer":
        from producer.disabled import DisabledProducer
        return DisabledProducer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Before the reset below: the child's collector must not free anything it inherited
# (producer.forking), during the hooks that follow or after them.
os.register_at_fork(before=partial(pause_gc_for_fork, _EVERY), after_in_parent=resume_gc_after_fork,
                    after_in_child=freeze_inherited_in_child)
os.register_at_fork(after_in_child=partial(reset_in_forked_children, _LIVE, _close_all_at_exit, _EVERY,
                                           _UNFINISHED))
