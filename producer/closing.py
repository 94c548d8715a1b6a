"""flush(), close() and the close at interpreter exit: a mixin of :class:`producer.LineageProducer`.

Guarantees:

* ``flush(timeout_s)`` waits until every event emitted so far is acknowledged by Kafka,
  ``timeout_s`` (default ``close_timeout_s``) passes, or the sender stops, and returns
  how many are still ``pending`` (queued or journaled: not lost).
* ``settle(timeout_s)`` waits until every event emitted so far is acknowledged or in the
  journal on disk, taking records back from librdkafka into the journal while Kafka is
  reported down, without closing; it returns how many are neither (0: an ``os._exit``
  right after it loses nothing). See :meth:`Closing.settle`.
* ``close(timeout_s)`` flushes within ``timeout_s`` (default ``close_timeout_s``), then
  stops the sender, whose last turn journals whatever Kafka has not acknowledged
  (:meth:`producer.sender.Sender._shutdown`), and logs ``event=closed`` with the final
  counts. While Kafka is not taking records it waits only until every event is in the
  journal. It never waits for a lock another thread holds (the sender's last turn does,
  bounded: :meth:`producer.sender.Sender._quiesce_emits`), and waits for the sender to stop
  for what is left of its budget plus the reclaim's bound (:data:`producer.replacement.RECLAIM_TIMEOUT_S`,
  twice) and 5 s. Idempotent; ``emit()`` calls after it are dropped (``closed``). Where
  it cannot wait for the sender (a signal handler inside emit(), the counters or logging)
  it is deferred (:mod:`producer.deferred_close`).
* At interpreter exit every producer not closed yet is closed (the same bounds;
  :func:`producer.forking.close_at_exit`: shorter in a forked child), one at a time; a
  failure is logged (``close_at_exit_failed``), never raised.
* A close() that gave up on a sender still running (a journal write or a log handler that
  blocks, a broken librdkafka instance: ERROR ``close_incomplete``) gets one more chance
  at a normal exit (:func:`_finish_unfinished_at_exit`, after the closes above): that
  sender is joined once more, up to its producer's ``close_timeout_s`` counted from then
  (all of them at once: the exit waits at most the longest), and the outcome is logged:
  ``close_finished_at_exit`` with the final counts (as ``closed``) if it stopped -- what
  it held is journaled or delivered -- else ERROR ``lost_at_exit`` with ``not_journaled``,
  the events lost as the process exits (at most that many: the sender may be writing some),
  and ``pending``. A forked child never joins a parent's sender (:mod:`producer.forking`).

Not guaranteed: the events such a sender holds when that last wait ends, or when the
process ends without running exit handlers (``os._exit``, a signal's default action,
SIGKILL), are lost.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from threading import get_ident
from typing import TYPE_CHECKING, Callable

from producer.forking import close_at_exit
from producer.replacement import RECLAIM_TIMEOUT_S
from producer.sender import LOCK_WAIT_S

if TYPE_CHECKING:
    from producer.config import ProducerConfig
    from producer.deferred_close import DeferredClose
    from producer.journal import Journal
    from producer.kafka import LineageProducer
    from producer.stats import ProducerStats

log = logging.getLogger("producer.kafka")


class Closing:
    """LineageProducer's flush(), close() and context manager; see the module docstring."""

    config: ProducerConfig
    _topic: str
    _producer: object
    _journals: list[Journal]
    _own: Journal | None
    _aside: Journal | None
    _left_journaled: int
    _kafka_down: bool
    _closing: bool
    _closed: bool
    _stopped: bool
    _forked: bool
    _fork_lock: threading.RLock
    _deferred: DeferredClose | None
    _close_deadline: float
    _sender: threading.Thread
    _stop: threading.Event
    _progress: threading.Condition
    _can_send: bool
    stats: ProducerStats
    # The Sender's, DeferredClosing's and InstanceReplacement's:
    _not_journaled: Callable[[], int]
    _librdkafka_settled: Callable[[], bool]
    _reentered: Callable[[int], str | None]
    _defer_close: Callable[[str, float, int], None]
    _finishing: Callable[[], str]
    _take_back_if_kafka_is_down: Callable[..., None]
    _spilling: bool
    _want_journal: str | None
    _direct_outstanding: Callable[[], int]
    _error: Callable[..., None]

    @property
    def pending(self) -> int:
        """Events accepted by emit() and not yet acknowledged by Kafka, journaled ones
        included, and those of the journals dead processes left that the producer took over
        when it started (one whose records the sender has not counted yet: those counted so
        far, and at least 1); not those of a journal it adopted while running (``stats.adopted``)."""
        # In-memory records first: on their way to a journal they are counted in one
        # place or the next, and the journal they go to may be created meanwhile.
        in_memory = self._not_journaled()
        journals = [*self._journals, *(j for j in (self._own, self._aside) if j is not None)]
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

    def settle(self, timeout_s: float | None = None) -> int:
        """Wait until every event emitted so far is acknowledged by Kafka or written to the
        journal (fsync-ed), for at most ``timeout_s`` (default ``close_timeout_s``); returns how
        many are still neither (in librdkafka, or queued for the journal). The producer stays
        open: unlike close(), nothing is stopped, and the journal is resent by this producer
        once Kafka takes records again.

        While Kafka is reported down (all brokers down, a failed delivery, a stall) and records
        still sit in librdkafka, Kafka gets up to :data:`producer.replacement._DOWN_GRACE_S`
        (at most half of ``timeout_s``) to answer anything, then they are taken back into the
        journal, as close() does (journal mode, logged ``reason=settling_while_kafka_down``):
        settling never waits out an outage. Records librdkafka holds while Kafka is merely slow
        (not reported down) are waited for, not taken back: at the bound they are counted in
        the result.

        Once it returned 0, every event emitted before the call is on Kafka or on disk: a
        process that ends then without exit handlers (``os._exit``, as Airflow's forked
        listener does; SIGKILL) loses none of them (journaled ones are sent by the next
        producer on the journal directory, :mod:`producer.orphans`). A result above 0 means
        that many would be lost by such an exit (they are still sent or journaled if the
        process lives or exits normally). Never raises for Kafka's sake, never closes. In a
        signal handler that interrupted the producer (:mod:`producer.deferred_close`) it
        waits only for what librdkafka holds, as flush() does.

        Not guaranteed: that it returns before the bound while other threads keep emitting.
        It waits until nothing is outstanding at the moment it looks, as librdkafka's own
        flush does, so under a sustained stream of other threads' events it may wait out
        ``timeout_s`` and count theirs. Events dropped with a named reason (``journal_full``,
        ``closed``, ...) are counted in ``stats.dropped``, not in the result."""
        budget = self.config.close_timeout_s if timeout_s is None else max(0.0, timeout_s)
        deadline = time.monotonic() + budget
        if self._reentered(get_ident()) is not None:
            self._wait(budget, self._librdkafka_settled)
            return self._not_journaled()
        while True:
            left = deadline - time.monotonic()
            # At most half the budget for Kafka's answer: the rest is the take-back's.
            self._take_back_if_kafka_is_down(min(left, budget) / 2, "settling_while_kafka_down")
            self._wait(max(0.0, deadline - time.monotonic()), self._settled_or_take_back_due)
            if self._not_journaled() == 0 or deadline - time.monotonic() <= 0 or not self._sender.is_alive():
                return self._not_journaled()

    def _settled_or_take_back_due(self) -> bool:
        """settle()'s wait: nothing outside Kafka and the journal, or Kafka went down with
        records in librdkafka (then taken back: :meth:`settle`)."""
        return self._not_journaled() == 0 or (self._kafka_down and not self._spilling and self._want_journal is None
                                              and self._direct_outstanding() > 0)

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
            _UNFINISHED.add(self)
            self._error("close_incomplete", f"the sender did not stop within {joined:.0f}s: what it still "
                        "holds is lost if the process exits before it stops (a normal exit waits up to "
                        "close_timeout_s more for it)")
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

    def _finish_at_exit(self, since: float) -> None:
        """At exit, a close() that gave up on the sender (close_incomplete): wait for it until
        ``close_timeout_s`` after ``since``, then log what became of what it held."""
        sender = self._sender
        sender.join(max(0.0, since + self.config.close_timeout_s - time.monotonic()))
        waited = time.monotonic() - since
        if sender.is_alive():
            s = self.stats
            log.error("event=lost_at_exit topic=%s not_journaled=%d pending=%d emitted=%d delivered=%d journaled=%d "
                      "errors=%d waited_s=%.1f detail=the sender of a close that could not finish did not stop at "
                      "exit either: the events it has not journaled are lost", self._topic, self._not_journaled(),
                      s.pending, s.emitted, s.delivered, s.journaled, s.errors, waited)
            return
        self._producer = None   # as close() does once the sender stopped
        s = self.stats
        log.info("event=close_finished_at_exit topic=%s emitted=%d delivered=%d journaled=%d pending=%d errors=%d "
                 "waited_s=%.1f", self._topic, s.emitted, s.delivered, s.journaled, s.pending, s.errors, waited)


_LIVE: weakref.WeakSet[LineageProducer] = weakref.WeakSet()
#: Producers whose close() gave up on a sender still running (close_incomplete), until exit
#: gives each one more wait. Held strongly: one whose sender stops before exit still reports
#: its final counts then. In a forked child they are the parent's (producer.forking).
_UNFINISHED: set[LineageProducer] = set()


@atexit.register
def _close_all_at_exit() -> None:
    for producer in list(_LIVE):
        try:
            close_at_exit(producer)
        except Exception:  # noqa: BLE001 - best effort at exit; each producer logs its own
            log.exception("event=close_at_exit_failed")
    _finish_unfinished_at_exit()


def _finish_unfinished_at_exit() -> None:
    """Each close that could not finish (``_UNFINISHED``, the closes just made at exit
    included) gets its ``close_timeout_s`` from now, once: never raises."""
    since = time.monotonic()
    while _UNFINISHED:
        producer = _UNFINISHED.pop()
        try:
            producer._finish_at_exit(since)
        except Exception:  # noqa: BLE001 - best effort at exit; each producer logs its own
            log.exception("event=close_at_exit_failed")
