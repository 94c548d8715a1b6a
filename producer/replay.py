"""Sending journals to Kafka: a mixin of :class:`producer.sender.Sender` (its thread only).

A journal is sent one batch at a time: the next batch is read only once every record of
the last one is acknowledged (then its position is committed) or the batch failed (then it
is read again after a backoff): order is kept, a failed batch may be sent twice.

Which journal, per sender turn:

* In journal mode, :meth:`_advance_replay`: the journals dead processes left that the
  producer took over at construction (their events go before its own, and ``pending``,
  ``flush()`` and ``close()`` count them), then its own journal; when all are sent and
  nothing is queued, back to direct sending. Construction only locks and opens those
  journals (a large one does not slow the job's start); their recovery scans (counting
  their records) run here, on the sender thread, oldest first, each before it is sent
  (:meth:`_scan_taken_over`): the oldest is sent as soon as it is counted, the next ones
  counted in the turns between its batches, so a short-lived process still sends some.
  A turn scans for about :data:`_SCAN_TURN_S` (the deadline is checked within a slice,
  every few dozen records), polling librdkafka between slices; the producer's own events
  are persisted between turns. The scan runs as fast as the disk allows while the job's
  threads are idle, and shares the GIL with them otherwise (a turn then lasts longer: each
  read may wait for the GIL). Until a journal is counted, ``pending`` counts it as the
  records found so far, at least 1 (:attr:`Journal.pending_at_least`), so ``flush()``
  and ``close()`` wait for it; one that the sender's last turn releases before it is
  counted stays on disk, whole (no cursor moved), for the next process (logged:
  ``event=taken_over_journal_released pending=not_counted``).
* In direct mode, :meth:`_advance_adoption`: a dead process's journal adopted while the
  producer runs (:func:`producer.orphans.adopt_next`, looked for every
  ``journal_adopt_interval_s``), so a journal left by a killed child does not wait for
  the next process. It is adopted only while Kafka takes records (no outage reported since
  the last acknowledgement; no batch of it starts while one is) and the producer's own
  backlog is sent (direct mode: its journal empty, nothing queued for it), and never once
  close() began. One at a time:
  finished (removed) or released before the next, so it holds its ``LOCK`` and at most
  one segment open; once one is sent the next is looked for at once, the interval
  applying after a look that finds none. Its recovery scan (counting its records, which
  takes seconds for a full one) runs a bounded slice per sender turn
  (:data:`_RECOVERY_SLICE`), so the sender keeps serving librdkafka meanwhile.
* An adopted journal must never push the producer's own events into journal mode, which
  a full librdkafka queue (``queue_max_events``) would: its batches are small
  (:data:`_ADOPTED_BATCH`, :data:`_ADOPTED_BYTES`, and a tenth of the queue), one is in
  flight at a time, and one starts only while the producer's own records and it fill at
  most half the queue (so with ``queue_max_events`` under 2, no journal is adopted while
  running: none is opened nor locked). The producer's own events, which emit() gives librdkafka directly, wait
  behind at most one such batch; in journal mode (an outage) the adopted journal waits,
  held. Its events are counted apart (``stats.adopted``), not in ``pending``: ``flush()``
  and ``close()`` wait for the producer's own events only. No batch of it starts once
  close() began, and the sender's last turn releases it: what it has not sent stays there
  for the next adopter, and a batch sent but not acknowledged by then is sent again by
  that adopter (at-least-once). A forked child closes its copies of the journal's
  descriptors and adopts on its own (:mod:`producer.forking`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer

from producer.deferred_close import LOCK_SLICE_S
from producer.delivery import refused_for_good
from producer.errors import JournalError
from producer.journal import Journal, Record
from producer.journal_dir import Destination
from producer.orphans import adopt_next, give_up

if TYPE_CHECKING:
    from producer.config import ProducerConfig

log = logging.getLogger("producer.kafka")

_REPLAY_BATCH = 2000
_REPLAY_BYTES = 4 << 20
#: A dead process's journal adopted while running goes in smaller batches: the producer's
#: own events may queue behind one.
_ADOPTED_BATCH = 500
_ADOPTED_BYTES = 1 << 20
#: An adopted journal's recovery scan per sender turn (records, bytes): a few milliseconds.
_RECOVERY_SLICE = (2000, 1 << 20)
#: The journals taken over at construction: their scans per sender turn, for about this
#: long (a slice checks the clock every few dozen records); the turn then persists the
#: producer's own events and polls librdkafka. Longer only while the job's threads hold the GIL.
_SCAN_TURN_S = 0.05
_BACKOFF_S = (0.2, 5.0)
#: How long the sender's thread may wait on a metadata request asking whether Kafka is back,
#: once per ``journal_adopt_interval_s``, only while it is reported down and nothing of this
#: producer's is in flight (no delivery report will ever say so then).
_PROBE_TIMEOUT_S = 0.5


class Replay:
    """Journal replay and adoption while running; see the module docstring."""

    config: ProducerConfig
    _topic: str
    _producer: Producer
    _journals: list[Journal]
    _own: Journal | None
    _lock: threading.RLock
    _stop: threading.Event
    _max_spill: int
    _spilling: bool
    _closing: bool
    _kafka_down: bool
    _spill: object
    _returned: list
    _replayed: int
    _delivered: int
    _can_send: bool
    # The Sender's, LineageProducer's and DeliveryReports' (see producer.sender):
    _kafka_client_back: Callable[[], bool]
    _direct_outstanding: Callable[[], int]
    _reset_stall: Callable[[], None]
    _kafka_up: Callable[[], None]
    _error: Callable[..., None]
    _repeated_error: Callable[..., None]
    _repeat_ended: Callable[..., bool]
    _drop: Callable[..., None]
    _poll: Callable[[float], None]
    _on_replay_delivery: Callable[[int, Any, Any], None]

    def _init_replay(self) -> None:
        self._replay: tuple[Journal, tuple[int, int], int] | None = None
        self._replay_outstanding = 0
        self._replay_failed = False
        self._replay_rejected = 0
        # The batch in flight's records dropped, by place: (journal, batch start, {place: record}).
        self._replay_dropped: tuple[Journal, tuple[int, int], dict[int, Record]] | None = None
        self._retry_at = 0.0
        self._backoff = _BACKOFF_S[0]
        self._adopted: Journal | None = None
        self._adopted_had = 0      # the adopted journal's records when its recovery scan ended
        self._adopted_sent = 0     # events delivered from journals adopted while running
        self._next_look_at = time.monotonic() + self.config.journal_adopt_interval_s
        self._next_probe_at = self._next_look_at
        self._adoption_failed = False   # the journal directory could not be listed (logged once)

    def _destination(self) -> Destination:
        return Destination(self._topic, self.config.bootstrap_servers)

    def _settle_replay(self) -> bool:
        """Conclude the batch in flight once all its answers are in. True when a new batch
        may go now; False while one is in flight, or just failed (backoff)."""
        if self._replay is None:
            return True
        if self._replay_outstanding > 0:
            return False
        journal, pos, count = self._replay
        self._replay = None
        if self._replay_failed:
            self._replay_failed = False
            journal.rewind()
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_S[1])
            return False
        # Counted before the commit drops them from ``pending``: a flush() that returns sees them.
        # The commit drops them whether or not it reaches the disk, so they are counted once.
        sent = count - self._replay_rejected
        if journal is self._adopted:
            self._adopted_sent += sent
        else:
            self._replayed += sent
            self._delivered += sent
        try:
            journal.commit(pos, count)
        except OSError as err:   # delivered all the same; a crash before the next commit resends them
            self._repeated_error("journal_commit_failed", err, journal=journal.path)
        else:
            self._repeat_ended("journal_commit_failed", "journal_commits_recovered")
        self._replay_dropped = None
        self._backoff = _BACKOFF_S[0]
        self._reset_stall()
        return True

    def _advance_replay(self) -> None:
        """Journal mode: the next batch of the journals counted as this producer's."""
        ready = self._settle_replay()
        self._scan_taken_over()   # while a batch is in flight too: the next journal is counted meanwhile
        if not ready:
            return
        if time.monotonic() < self._retry_at or not (self._can_send or self._kafka_client_back()):
            return
        # The oldest goes as soon as it is counted (the others are counted between its batches).
        while self._journals and self._journals[0].recovered and self._journals[0].pending == 0:
            # A journal this producer made frees its share of journal_max_bytes (Sender._append_counted).
            self._journals.pop(0).close()
        if self._journals and not self._journals[0].recovered:
            return
        journal = self._journals[0] if self._journals else self._own
        if journal is None or journal.pending == 0:
            if not self._lock.acquire(timeout=LOCK_SLICE_S):   # an emit() holds it: the next turn
                return
            try:
                if not self._spill and not self._returned and self._direct_outstanding() == 0:
                    self._spilling = False
                    log.info("event=direct_mode topic=%s", self._topic)
            finally:
                self._lock.release()
            return
        # A batch must fit librdkafka's queue, or produce() would refuse part of it.
        self._send_batch(journal, min(_REPLAY_BATCH, self._max_spill), _REPLAY_BYTES)

    def _scan_taken_over(self) -> None:
        """Count the records of the journals taken over at construction, oldest first, in
        slices for up to :data:`_SCAN_TURN_S` (:meth:`_advance_replay` sends the oldest once it
        is counted). Not in the sender's last turn: what is not counted stays on disk, whole.
        A journal that cannot be read, or fails in any other way, is given up (left on disk,
        whole, logged once)."""
        deadline = time.monotonic() + _SCAN_TURN_S
        for journal in list(self._journals):
            while not journal.recovered:
                if self._stop.is_set() or time.monotonic() >= deadline:
                    return
                try:
                    done = journal.recover_some(*_RECOVERY_SLICE, deadline=deadline)
                except Exception as err:   # whatever it is, the producer's own events must not wait for ever
                    self._journals = [j for j in self._journals if j is not journal]
                    give_up(journal, err)
                    break
                self._count_corrupt(journal)
                self._poll(0)   # librdkafka's callbacks keep flowing while a large journal is counted
                if done and journal.pending:
                    log.info("journal=%s event=adopted pending=%d", journal.path, journal.pending)

    def _advance_adoption(self) -> None:
        """Direct mode: one step of a dead process's journal -- a slice of its recovery scan,
        or its next batch -- adopting one if it is time."""
        if not self._settle_replay() or self._stopping():
            return
        journal = self._adopted
        if journal is not None and not journal.recovered and not self._recover_slice(journal):
            return
        now = time.monotonic()
        if journal is not None and journal.pending == 0:
            self._release_adopted("adopted_journal_sent" if self._adopted_had else None)
            if not journal.path.exists():
                # The next one at once: the interval is for looks that find none. Not when it
                # could not be removed (still there, its LOCK free): it would be taken again.
                self._next_look_at = now
            journal = None
        # Idle while Kafka is reported down, with or without an adopted journal waiting for
        # its next batch: no delivery report will say Kafka is back (an outage reported
        # between two batches, or a blip as librdkafka leaves the bootstrap connection).
        if now >= self._next_probe_at and self._idle_while_down():
            self._next_probe_at = now + self.config.journal_adopt_interval_s
            self._probe_kafka()
        if journal is None:
            if now >= self._next_look_at and self._may_adopt():
                self._next_look_at = now + self.config.journal_adopt_interval_s
                self._adopted = self._adopt_next()   # its recovery scan from the next turn on
            return
        if not self._adopted_batch_may_start(now):
            return
        if self._stopping():   # close() may have begun while this turn read the journal
            return
        try:
            self._send_batch(journal, self._adopted_batch(), _ADOPTED_BYTES)
        except (OSError, JournalError) as err:
            self._adopted = None
            give_up(journal, err)

    def _stopping(self) -> bool:
        return self._closing or self._stop.is_set()

    def _adopted_batch(self) -> int:
        """An adopted journal's batch: small, and a tenth of the queue."""
        return min(_ADOPTED_BATCH, max(1, self._max_spill // 10))

    def _adopted_batch_may_start(self, now: float) -> bool:
        """Whether the adopted journal's next batch may start (none in flight): its backoff
        is over, Kafka is not reported down, and the producer's own records and it fill at
        most half the queue."""
        return now >= self._retry_at and not self._kafka_down \
            and self._direct_outstanding() + self._adopted_batch() <= self._max_spill // 2

    def _adopted_step_due(self) -> bool:
        """Whether the sender's next turn has work on the adopted journal (so it polls
        librdkafka briefly): its recovery scan goes on, it is all sent (to be released), or
        its next batch may start. Never once close() began: no batch starts then."""
        journal = self._adopted
        if journal is None or self._replay is not None or self._stopping():
            return False
        if not journal.recovered or journal.pending == 0:
            return True
        return self._adopted_batch_may_start(time.monotonic())

    def _recover_slice(self, journal: Journal) -> bool:
        """One slice of the adopted journal's recovery scan; True once it is complete."""
        try:
            done = journal.recover_some(*_RECOVERY_SLICE)
        except Exception as err:   # whatever it is, given up: not tried again every turn
            self._adopted = None
            give_up(journal, err)
            return False
        self._count_corrupt(journal)
        if not done:
            return False
        self._adopted_had = journal.pending
        if journal.pending:
            log.info("journal=%s event=adopted pending=%d", journal.path, journal.pending)
        return True

    def _idle_while_down(self) -> bool:
        """Kafka is reported down and nothing of this producer's is in flight or journaled:
        no delivery report will come to say it is back (a process whose forked children do
        the emitting never sends anything itself, or the outage was reported while an adopted
        journal waited for its next batch), so adoption would wait for ever."""
        return self._kafka_down and self._can_send and not self._spilling and self._direct_outstanding() == 0

    def _probe_kafka(self) -> None:
        """One metadata request for the topic, bounded by :data:`_PROBE_TIMEOUT_S`: answered,
        Kafka is taken as back (as an acknowledgement would say)."""
        try:
            self._producer.list_topics(self._topic, timeout=_PROBE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - still down (timed out, transport error): the next interval
            return
        self._kafka_up()

    def _may_adopt(self) -> bool:
        """Kafka takes records, this producer's own backlog is sent, and its queue
        (``queue_max_events``) is large enough for an adopted batch to ever start."""
        own_pending = self._own.pending if self._own is not None else 0
        if self._adopted_batch() > self._max_spill // 2:   # no batch of it could ever start
            return False
        return self._can_send and not self._spilling and not self._kafka_down and not self._journals \
            and own_pending == 0

    def _adopt_next(self) -> Journal | None:
        try:
            return adopt_next(self.config.journal_path, max_bytes=self.config.journal_max_bytes,
                              segment_bytes=self._segment_bytes(), destination=self._destination())
        except OSError as err:
            if not self._adoption_failed:
                self._adoption_failed = True
                self._error("journal_unreadable", err, path=str(self.config.journal_path))
            return None

    def _segment_bytes(self) -> int:
        return max(64 * 1024, min(64 << 20, self.config.journal_max_bytes // 4))

    def _send_batch(self, journal: Journal, max_records: int, max_bytes: int) -> None:
        start = journal.read_position
        records, pos = journal.read(max_records, max_bytes)
        self._count_corrupt(journal)
        if not records and journal.pending == 0:
            journal.commit(pos, 0)   # all that was left was corrupt (bit rot since it was opened): skipped
            return
        if not records:
            self._error("journal_inconsistent", f"{journal} has pending records but none readable")
            journal.pending = 0
            return
        self._replay = (journal, pos, len(records))
        self._replay_failed = False
        self._replay_rejected = 0
        self._replay_outstanding = len(records)
        dropped = self._batch_dropped(journal, start)
        for i, record in enumerate(records):
            key, value = record
            if dropped.get(i) == record:
                # Dropped (counted) when this batch was sent before: not sent, nor counted, again.
                self._replay_outstanding -= 1
                self._replay_rejected += 1
                continue
            try:
                self._producer.produce(self._topic, value, key, on_delivery=partial(self._on_replay_delivery, i))
            except KafkaException as err:
                if refused_for_good(err.args[0].code()):
                    # The record itself (its size): refused for ever. Dropped; the others go on.
                    self._replay_outstanding -= 1
                    self._replay_rejected += 1
                    dropped[i] = record
                    self._drop("too_large", f"librdkafka refused a journaled record: {err.args[0].str()}",
                               key=key if key is None or len(key) <= 100 else key[:100] + b"...")
                    continue
                # Not queued for now: the batch fails as a whole and is read again after a backoff.
                self._replay_outstanding -= len(records) - i
                self._replay_failed = True
                break
            except BufferError:
                self._replay_outstanding -= len(records) - i
                self._replay_failed = True
                break

    def _batch_dropped(self, journal: Journal, start: tuple[int, int]) -> dict[int, Record]:
        """The records of the batch starting at ``start`` in ``journal`` dropped (and counted)
        when it was sent before, by their place in it: a failed batch is read and sent again,
        and a record refused for good must not be sent, nor counted, again."""
        known = self._replay_dropped
        if known is None or known[0] is not journal or known[1] != start:
            known = self._replay_dropped = (journal, start, {})
        return known[2]

    def _count_corrupt(self, journal: Journal) -> None:
        """Count the corrupt regions ``journal`` skipped since the last look, as dropped:
        reason ``journal_corrupt``, one per region (how many records a region held is not
        known; its bytes are in the journal's ERROR line, ``event=journal_corrupt``)."""
        regions = journal.take_corrupt_regions()
        if regions:
            self._drop("journal_corrupt", f"{regions} corrupt region(s) of {journal.path} skipped "
                       f"({journal.corrupt_bytes} bytes in all), their records lost", n=regions)

    def _release_adopted(self, event: str | None = "adopted_journal_released") -> None:
        """The adopted journal goes back to the directory, what it has not sent still in it
        (after :meth:`_settle_replay`, or a rewind): the sender's last turn, or (removed) once
        it is all sent. ``event``: what is logged (None: nothing, for an empty one)."""
        journal, self._adopted = self._adopted, None
        if journal is None:
            return
        if event is not None:
            log.info("journal=%s event=%s topic=%s pending=%s", journal.path, event, self._topic,
                     journal.pending if journal.recovered else "not_counted")
        try:
            journal.close()
        except OSError as err:
            self._error("journal_close_failed", err)
