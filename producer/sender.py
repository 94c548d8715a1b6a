"""The producer's background thread: journal mode, reclaim, replay (used by ``kafka.py``).

:class:`Sender` is the half of :class:`producer.LineageProducer` that runs on its own
thread (``lineage-producer[<topic>]``). It alone polls librdkafka (so every delivery and
error callback runs here), owns the journals, and decides when to leave journal mode.

State machine, per loop (``_step``):

1. poll librdkafka (serves delivery reports and errors);
2. entering journal mode (all brokers down, a failed delivery, a full queue, a fatal
   error, or records outstanding with no delivery report for 5 s -- doubling to 60 s):
   *reclaim* -- purge librdkafka and collect every record it held, in emit order, ahead
   of anything emitted since; after a fatal error or a stall, await the answers to
   requests already sent (bounded) first, then build a new librdkafka producer;
   a batch the broker refused for its size also rebuilds it, with half the batch size
   (librdkafka does not split a batch: a record fitting on its own must not be lost
   with the batch it shared; one refused while it was alone is dropped, counted);
3. *persist*: append reclaimed records, then the spill queue, to the journal (fsync);
4. in journal mode, *replay*: send the oldest journal's next batch and wait for all of
   it to be acknowledged before committing and sending the next (a failed batch is
   re-read after a backoff: order is kept, duplicates are possible). When every journal
   is empty and nothing is queued, go back to direct sending. (Without a Kafka client,
   :class:`producer.forking.NoKafka`, no replay: the journal keeps everything.)
5. in direct mode, *adoption*: now and then, a journal a dead process left is adopted
   and sent, one small batch at a time, behind the producer's own events.

Step 2's reclaim and replacement, and stall detection, are :mod:`producer.replacement`;
steps 4 and 5 are :mod:`producer.replay`.

Locks: ``_lock`` (mode switch and spill queue; emit() holds it around ``produce()``, so
callbacks never take it, they set flags this loop acts on; they are in
:mod:`producer.delivery_reports`) and ``_count_lock`` (counters both threads write;
nothing is called while it is held). Both are re-entrant: a signal handler calling the
producer runs on a thread that may hold them (:mod:`producer.deferred_close`). This thread
never waits long for ``_lock`` in a turn (another thread may hold it while a signal handler
runs): a turn that cannot have it within :data:`LOCK_SLICE_S` leaves that step to the
next; the last turn waits for it up to the close's budget, then goes on without it
(:meth:`Sender._quiesce_emits`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Producer

from producer.deferred_close import LOCK_SLICE_S, DeferredClosing
from producer.delivery_reports import DeliveryReports
from producer.journal import AppendFailed, Journal, Record
from producer.journal_dir import JournalNames
from producer.librdkafka_log import LibrdkafkaLog
from producer.replacement import InstanceReplacement
from producer.replay import Replay

if TYPE_CHECKING:
    from producer.config import ProducerConfig

log = logging.getLogger("producer.kafka")

_IDLE_POLL_S = 0.1
_BUSY_POLL_S = 0.005
#: The sender's last turn waits for ``_lock`` for what is left of the close's budget, at
#: least this long: other emits hold it for microseconds, the sender for a queue swap.
LOCK_WAIT_S = 0.5
#: A repeating error's incident (a full disk failing every journal write, every commit) ends
#: only once a write or commit goes through this long after its last failure: a cause that
#: comes and goes (a disk at the edge of full) is one incident, one ``*_recovered`` line.
INCIDENT_QUIET_S = 60.0
#: The clock incidents are timed on (the sender's, as everywhere here).
_now = time.monotonic


def journal_mode_level(reason: str, told: str | None) -> int:
    """The level of an ``event=journal_mode`` line for ``reason``, ``told`` being the reason
    last logged since Kafka last took a record (None: none since). INFO for one outage's
    repeats: the same reason, or ``stalled`` after any (a client rebuilt during the outage
    that took nothing either, as librdkafka before 2.16 may report it after
    ``all_brokers_down``); else WARNING, so that news (closing while Kafka is down, a fatal
    error, a full queue) is seen."""
    repeat = reason == told or (told is not None and reason == "stalled")
    return logging.INFO if repeat else logging.WARNING


class Sender(InstanceReplacement, DeliveryReports, Replay, DeferredClosing):
    """Background half of LineageProducer; see the module docstring."""

    config: ProducerConfig
    _topic: str
    _producer: Producer
    _journals: list[Journal]
    _closing: bool    # LineageProducer's: close() began
    _can_send: bool   # LineageProducer's: False without a Kafka client (producer.forking.NoKafka)

    def _init_sender(self, max_spill: int) -> None:
        self._max_spill = max_spill
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)  # the spill queue has room again
        self._count_lock = threading.RLock()
        self._spill: deque[Record] = deque()
        self._spilling = False
        self._closed = False
        self._emitted = self._delivered = self._journaled = self._replayed = 0
        self._delivery_failures = self._errors = 0
        self._repeats: dict[str, int] = {}   # errors that repeat while their cause lasts (_repeated_error)
        self._last_failed: dict[str, float] = {}   # when each of them last happened (_now)
        # Records a journal write failure lost in the current incident: what rate-limits their
        # log lines, so that each incident (a disk full again, days later) logs its first ones.
        # journal_full is no failure that recovers: its lines keep the plain drop rate limit.
        self._incident_drops: dict[str, int] = {}
        self._dropped: dict[str, int] = {}
        # Direct records in librdkafka = sent - done. Single writer each (emit() under
        # _lock; this thread), so no lock. len(producer) also counts queued error events.
        self._direct_sent = 0
        self._direct_done = 0
        # Records an interrupted emit() placed again before their delivery report came
        # (_abandon): counted done at once (written under _lock), their report ignored.
        self._direct_abandoned = 0
        # Taken back from librdkafka: (emit number, key, value). librdkafka may report a
        # partition's queued records before its in-flight (older) ones -- a fatal error
        # purges the queue at once, a purge reports in-flight requests before records
        # waiting for a retry -- so _persist sorts them by emit number.
        self._returned: list[tuple[int, bytes | None, bytes]] = []
        self._in_transit = 0                # popped from _spill, not yet in the journal
        # Kafka took nothing lately (all brokers down, a failed delivery or replay, a
        # stall); the next acknowledgement clears it. While it is set, close() does not
        # wait for records already in the journal: they wait for the next process.
        self._kafka_down = False
        # Until Kafka takes records again, repeats log quietly: librdkafka's lines, journal mode's reason.
        self._rdkafka_log, self._journal_mode_told = LibrdkafkaLog(), None
        self._journal_note: str | None = None   # journal mode's reason, not logged yet (_tell_journal_mode)
        self._need_reclaim = False
        self._want_journal: str | None = None
        self._shutdown_failure: Exception | None = None   # logged by _shutdown itself
        self._fatal: KafkaError | None = None
        self._stalled = False
        # librdkafka's batch.size now (None: as configured) and the record size that made
        # the broker refuse a batch (a rebuild halves it); see _shrinks_batch.
        self._batch_bytes: int | None = None
        self._refused_batch: int | None = None
        self._reset_stall()                   # self._stall_s (producer.replacement)
        self._quiet_since = time.monotonic()  # last time nothing awaited a delivery report
        self._last_report_at = 0.0            # last delivery report of any kind
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._own: Journal | None = None
        # The names of the journals this producer makes: one writer's, which adopters take in order.
        self._journal_names = JournalNames()
        self._aside: Journal | None = None     # the spill queue's during a reclaim's wait (_persist_aside)
        # The journals this producer made (its own, the aside one, and its former own ones
        # waiting in _journals): together within journal_max_bytes (_append_counted).
        self._made_here: weakref.WeakSet[Journal] = weakref.WeakSet()
        self._left_journaled = 0            # pending records in journals closed at shutdown
        self._close_deadline = 0.0          # close()'s: how long the last turn may wait for _lock
        self._lockless = False              # the last turn goes on without _lock (_quiesce_emits)
        self._draining = False              # ... and is emptying the spill queue (HeldEmits._taken_back)
        self._init_replay()
        self._init_deferred_close()

    def _new_producer(self, props: dict[str, str] | None = None) -> Producer:
        raise NotImplementedError

    def _kafka_client_back(self) -> bool:
        raise NotImplementedError

    def _begin_journal_mode_locked(self, reason: str) -> None:
        """Under ``_lock``: journal mode begins. Its log line is written once the lock is
        released (:meth:`_tell_journal_mode`): a thread interrupted inside a log handler by a
        signal handler that calls emit() would otherwise wait for itself."""
        if not self._spilling:
            self._spilling = True
            self._need_reclaim = True
            self._journal_note = reason

    def _tell_journal_mode(self) -> None:
        """Log the journal mode begun under ``_lock`` (not holding it), at
        :func:`journal_mode_level`."""
        reason, self._journal_note = self._journal_note, None
        if reason is not None:
            log.log(journal_mode_level(reason, self._journal_mode_told),
                    "event=journal_mode topic=%s reason=%s", self._topic, reason)
            self._journal_mode_told = reason

    # --- the sender thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if stopping:
                self._quiesce_emits()
            try:
                if not self._lockless:
                    self._step()
            except Exception as err:  # noqa: BLE001 - the sender must keep going
                self._error("sender_failed", err)
                if not stopping:
                    self._stop.wait(0.5)
            if self._journal_note is not None:
                self._tell_journal_mode()
            if stopping:   # the last turn, even after a failed step
                try:
                    self._shutdown()
                except Exception as err:  # noqa: BLE001 - logged; the thread ends all the same
                    if err is not self._shutdown_failure:
                        self._error("sender_failed", err)
                return
            # Never waits: the thread waiting on it may hold its lock where a signal handler
            # interrupted it (waiters wake every 50 ms anyway: LineageProducer._wait).
            if self._progress.acquire(blocking=False):
                try:
                    self._progress.notify_all()
                finally:
                    self._progress.release()

    def _quiesce_emits(self) -> None:
        """The last turn begins: close() set ``_closed`` without ``_lock``, so an emit() that
        read it just before may still be placing its record; every later one is refused.
        Once ``_lock`` is free that one is done. Held for longer than what is left of the
        close's budget (at least :data:`LOCK_WAIT_S`) -- a thread inside emit() that a long
        signal handler interrupted, or one stuck in a log handler -- the last turn goes on
        without it (logged): it journals what it holds, the spill queue included."""
        waited = max(LOCK_WAIT_S, self._close_deadline - time.monotonic())
        if self._lock.acquire(timeout=waited):
            try:
                self._space.notify_all()   # emit() calls waiting for room: refused now
            finally:
                self._lock.release()
            return
        self._lockless = True
        log.warning("event=close_without_lock topic=%s waited_s=%.1f detail=another thread held the producer's "
                    "lock all that time: what is not sent is journaled without it", self._topic, waited)

    def _poll(self, timeout: float) -> None:
        try:
            self._producer.poll(timeout)
        except KafkaException as err:
            self._fatal = err.args[0]

    def _step(self) -> None:
        if self._spilling:
            busy = bool(self._spill) or self._replay is None or not all(j.recovered for j in self._journals)
        else:
            busy = self._adopted_step_due()
        self._poll(_BUSY_POLL_S if busy else _IDLE_POLL_S)
        self._check_stall()
        replace = self._fatal is not None or self._stalled or self._refused_batch is not None
        if replace and self._want_journal is None:
            self._want_journal = ("fatal_error" if self._fatal is not None else "stalled" if self._stalled
                                  else "batch_too_large")
        if self._want_journal is not None:
            # Before reclaiming, so nothing new goes into the instance being emptied.
            if not self._lock.acquire(timeout=LOCK_SLICE_S):
                return   # an emit() holds it: the next turn
            try:
                self._begin_journal_mode_locked(self._want_journal)
            finally:
                self._lock.release()
            self._want_journal = None
            self._tell_journal_mode()
        if self._need_reclaim or replace:
            self._reclaim(settle_in_flight=replace)
        if replace:
            self._rebuild()
        self._persist()
        if self._spilling:
            self._advance_replay()
        else:
            self._advance_adoption()

    def _direct_outstanding(self) -> int:
        return self._direct_sent - self._direct_done - self._direct_abandoned

    def _abandon(self, cell: list[int]) -> bool:
        """Under ``_lock``: an interrupted emit() (:mod:`producer.deferred_close`) gives up the
        direct record whose delivery-report ``cell`` it holds, to place it again: True, and
        its report, if librdkafka has it, will be ignored; False if that report came already
        (the record is counted done, and delivered or taken back). The cell's one pop (atomic)
        decides between this and the report, whichever thread is first."""
        try:
            cell.pop()
        except IndexError:
            return False
        self._direct_abandoned += 1
        return True

    def _not_journaled(self) -> int:
        """Records accepted and neither acknowledged nor in a journal: in librdkafka, taken
        back from it, or queued for the journal. Safe to read from any thread: a record
        reaches its next place before it leaves the one read first."""
        return (self._direct_outstanding() + len(self._returned) + len(self._spill) + len(self._held_back)
                + self._in_transit)

    def _journal(self) -> Journal:
        if self._own is None:
            self._own = Journal.create(self.config.journal_path, max_bytes=self.config.journal_max_bytes,
                                       segment_bytes=self._segment_bytes(), destination=self._destination(),
                                       names=self._journal_names)
            self._made_here.add(self._own)
            log.info("event=journal_created path=%s", self._own.path)
        return self._own

    def _persist(self, final: bool = False) -> None:
        """Move ``_returned``, then the spill queue and any held-back records, in that order,
        into the journal. Left to the next turn if ``_lock`` stays busy; the last turn
        (``final``) waits for it as long as :meth:`_quiesce_emits` did, then goes without."""
        if final and self._lockless:
            # From here on a record appended to the spill queue is taken by the drain below
            # or taken back by its emit() (HeldEmits._taken_back): never left behind.
            self._draining = True
        if not self._returned and not self._spill and not self._held_back:
            return
        # Sorted outside the lock emit() takes: only this thread adds to _returned.
        returned = [(key, value) for _, key, value in sorted(self._returned, key=_emit_number)]
        wait_s = max(LOCK_WAIT_S, self._close_deadline - time.monotonic()) if final else LOCK_SLICE_S
        if not self._lockless and self._lock.acquire(timeout=wait_s):
            try:
                if self._need_reclaim and not final:
                    # An emit() began journal mode after this turn's reclaim check: what
                    # librdkafka holds is older than the spill queue and goes first (next turn).
                    return
                batch = returned + list(self._spill) + list(self._held_back)
                self._in_transit = len(batch)      # before the queues empty: see _not_journaled
                self._returned = []
                self._spill.clear()
                self._held_back.clear()
                self._space.notify_all()
            finally:
                self._lock.release()
        elif final:
            # Another thread holds _lock for good: popped one at a time (a deque's pops and
            # appends are atomic), so a record appended meanwhile is taken here or taken
            # back by its emit() (_draining, above).
            self._in_transit = len(returned) + len(self._spill) + len(self._held_back)
            self._returned = []
            batch = returned + _drain(self._spill) + _drain(self._held_back)
        else:
            return
        self._append_counted(self._journal, batch)

    def _append_counted(self, journal: Callable[[], Journal], batch: list[Record]) -> None:
        """Append ``batch`` (counted in ``_in_transit``) to the journal ``journal()`` returns
        (made on first use), every record counted: journaled, or dropped."""
        # What the journal took (counted journaled), and how many fitted under journal_max_bytes:
        # the rest are dropped, journal_full; those between, journal_write_failed.
        written, fitted = 0, len(batch)
        try:
            target = journal()
            # One budget for every journal this producer made, checked at each append.
            target.max_bytes = max(0, self.config.journal_max_bytes - self._made_here_bytes(target))
            written = fitted = target.append(batch)
        except AppendFailed as err:
            written, fitted = err.written, err.fitted
            self._repeated_error("journal_write_failed", err.cause)
        except Exception as err:  # noqa: BLE001 - whatever it is, the batch is counted (a journal not made, ...)
            self._repeated_error("journal_write_failed", err)
        finally:
            # Even on an exception that gets past the above: every record of the batch is
            # counted, journaled or dropped, and none stays in transit (flush() would wait for it).
            self._journaled += written
            self._in_transit = 0
            for reason, lost in (("journal_write_failed", fitted - written), ("journal_full", len(batch) - fitted)):
                if lost > 0:
                    count = limit = self._count_drop(reason, lost)
                    if reason == "journal_write_failed":
                        limit = self._incident_drops[reason] = self._incident_drops.get(reason, 0) + lost
                    if _should_log(limit, lost):   # as _drop: a full disk fails every batch
                        log.error("event=dropped reason=%s topic=%s count=%d dropped_now=%d journal=%s "
                                  "journal_max_bytes=%d", reason, self._topic, count, lost,
                                  self.config.journal_path, self.config.journal_max_bytes)
            if written and written == fitted and self._repeat_ended(
                    "journal_write_failed", "journal_writes_recovered",
                    **{f"dropped_{reason}": n for reason, n in self._incident_drops.items()}):
                self._incident_drops.clear()

    def _repeated_error(self, what: str, detail: object, **fields: object) -> None:
        """Count an error that repeats while its cause lasts (a full disk fails every journal
        append, every commit: many a second) and log it as drops are logged: the first ten of
        ``what``, then every thousandth (``repeats``: how many since its cause last ended,
        :meth:`_repeat_ended`)."""
        with self._count_lock:
            self._errors += 1
            repeats = self._repeats[what] = self._repeats.get(what, 0) + 1
            self._last_failed[what] = _now()
        if _should_log(repeats):
            extra = "".join(f" {k}={v}" for k, v in fields.items())
            log.error("event=%s topic=%s detail=%s repeats=%d%s", what, self._topic, detail, repeats, extra)

    def _repeat_ended(self, what: str, event: str, **dropped: int) -> bool:
        """A write, a commit, went through: the incident of ``what`` (see :meth:`_repeated_error`)
        is over if its last failure is ``INCIDENT_QUIET_S`` old. Then it is logged once (WARNING
        ``event=<event>``, with how many failed, and ``dropped``), the rate limit starts again
        (a later incident logs its first lines), and True is returned; else nothing changes (no
        incident, or its cause may still be there: a disk at the edge of full)."""
        with self._count_lock:
            repeats = self._repeats.get(what, 0)
            if not repeats or _now() - self._last_failed.get(what, 0.0) < INCIDENT_QUIET_S:
                return False
            del self._repeats[what]
            self._last_failed.pop(what, None)
        extra = "".join(f" {k}={v}" for k, v in dropped.items())
        log.warning("event=%s topic=%s failures=%d%s", event, self._topic, repeats, extra)
        return True

    def _made_here_bytes(self, besides: Journal) -> int:
        """Bytes on disk of the journals this producer made that it still holds (its own, the
        aside one, its former own ones in ``_journals``), ``besides`` excepted; not those a dead
        process left. Sender thread only (it alone changes these)."""
        return sum(j.size_bytes for j in (*self._journals, self._own, self._aside)
                   if j is not None and j is not besides and j in self._made_here)

    def _persist_aside(self) -> None:
        """During a reclaim's wait for librdkafka's answers (up to ``RECLAIM_TIMEOUT_S`` per
        purge: :mod:`producer.replacement`), while the spill queue fills: it goes to a journal
        of its own, made now, so that emit() waits for the disk, never for the network. The
        records librdkafka gives back are older and go to the current journal, which is then
        sent first (:meth:`_end_aside`). Not in the last turn: emit() calls are refused then."""
        if (not self._spilling or self._stop.is_set() or self._lockless
                or len(self._spill) * 2 < max(1, self._max_spill)):
            return
        if not self._lock.acquire(timeout=LOCK_SLICE_S):
            return
        try:
            batch = list(self._spill) + list(self._held_back)
            self._in_transit = len(batch)      # before the queues empty: see _not_journaled
            self._spill.clear()
            self._held_back.clear()
            self._space.notify_all()
        finally:
            self._lock.release()
        self._append_counted(self._aside_journal, batch)

    def _aside_journal(self) -> Journal:
        if self._aside is None:
            # Made after the current journal (made now if need be), with the same writer in its
            # name: the processes that take them over keep their order too, one writer's
            # journals being taken in the order it made them, the next only once the one
            # before is sent or released (producer.orphans). Their cap is shared, checked at
            # each append (_append_counted).
            self._journal()
            self._aside = Journal.create(self.config.journal_path, max_bytes=self.config.journal_max_bytes,
                                         segment_bytes=self._segment_bytes(), destination=self._destination(),
                                         names=self._journal_names)
            self._made_here.add(self._aside)
            log.info("event=journal_created path=%s reason=reclaim_wait", self._aside.path)
        return self._aside

    def _end_aside(self) -> None:
        """The reclaim is over: what librdkafka gave back goes to the current journal, which
        is then sent before the one the spill queue went to meanwhile (:meth:`_persist_aside`),
        which becomes the producer's own journal.

        Both journals share one ``journal_max_bytes`` with the producer's other journals
        (:meth:`_append_counted`): the records given back are appended with what the aside
        journal left of it. Those that do not fit are dropped (``journal_full``, counted and
        logged), although older than the aside journal's: records on disk are never evicted for
        older ones, as everywhere else a full journal drops what comes to it."""
        aside = self._aside
        if aside is None:
            return
        try:
            if self._returned:
                batch = [(key, value) for _, key, value in sorted(self._returned, key=_emit_number)]
                self._in_transit = len(batch)   # before _returned empties: see _not_journaled
                self._returned = []
                self._append_counted(self._journal, batch)
        finally:
            # Sent before it, as the journals taken over at construction are (producer.replay).
            if self._own is not None:
                self._journals.append(self._own)
            self._own, self._aside = aside, None

    def _shutdown(self) -> None:
        """Last act of the sender: journal whatever Kafka has not acknowledged."""
        try:
            if self._direct_outstanding() or self._replay_outstanding:
                self._reclaim()
            if not self._settle_replay() and self._replay is not None:   # answers still missing
                self._replay[0].rewind()
                self._replay = None
        except Exception as err:
            # Logged now: a failure in the finally below would replace it.
            self._shutdown_failure = err
            self._error("sender_failed", err)
            raise
        finally:
            # Whatever failed above, every journal is released: a LOCK held on would keep it
            # from the next process for as long as this one lives.
            try:
                self._release_adopted()
                self._persist(final=True)
            finally:
                if self._aside is not None:   # a reclaim that failed before its end
                    self._end_aside()
                for journal in [*self._journals, *([self._own] if self._own else [])]:
                    self._left_journaled += journal.pending_at_least   # one not counted yet stays whole
                    if not journal.recovered:
                        log.info("journal=%s event=taken_over_journal_released topic=%s pending=not_counted",
                                 journal.path, self._topic)
                    try:
                        journal.close()
                    except OSError as err:
                        self._error("journal_close_failed", err)
                self._journals, self._own = [], None

    def _count_drop(self, reason: str, n: int = 1) -> int:
        with self._count_lock:
            count = self._dropped[reason] = self._dropped.get(reason, 0) + n
            self._errors += n
        return count

    def _drop(self, reason: str, detail: object, key: bytes | None = None, n: int = 1) -> None:
        """Count ``n`` events dropped for ``reason`` and log it (rate-limited). Never call it
        holding ``_lock``: a log handler may be slow, and emit() must not wait for it."""
        count = self._count_drop(reason, n)
        if _should_log(count, n):
            log.error("event=dropped reason=%s topic=%s key=%s count=%d dropped_now=%d detail=%s",
                      reason, self._topic, key, count, n, detail)

    def _error(self, what: str, detail: object, **fields: object) -> None:
        with self._count_lock:
            self._errors += 1
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        log.error("event=%s topic=%s detail=%s %s", what, self._topic, detail, extra)


def _emit_number(returned: tuple[int, bytes | None, bytes]) -> int:
    return returned[0]


def _drain(queue: deque[Record]) -> list[Record]:
    records = []
    while True:
        try:
            records.append(queue.popleft())
        except IndexError:
            return records


def _should_log(count: int, n: int = 1) -> bool:
    # First ten of a kind, then every thousandth: a flood must not flood the log. ``n``
    # drops at once log if they reach the first ten or cross a thousand.
    return count - n < 10 or count // 1000 > (count - n) // 1000
