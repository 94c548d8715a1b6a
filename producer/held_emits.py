"""emit() calls that a signal handler interrupts (used by :mod:`producer.kafka`).

A signal handler runs on the main thread between two calls of whatever it interrupted,
possibly an ``emit()`` of the producer (:mod:`producer.deferred_close`). Each ``emit()`` is
an :class:`Emit`, which knows the call it interrupted on its thread (``outer``). This mixin
of :class:`producer.LineageProducer` keeps every event in emit order around them:

* A handler's ``emit()`` that interrupted one which has not placed its event yet (encoding
  it, waiting for room in the spill queue, starting a forked child's producer) is *held* in
  that call's list and placed right after its event; one that interrupted a call holding
  ``_lock`` (re-entrant: taking it would put the record ahead, or mix up the bookkeeping)
  waits in the producer's held-back queue, placed as the lock is left (:meth:`HeldEmits._holder`).
* An ``emit()`` cut short by an exception (a handler's ``sys.exit()``, ``KeyboardInterrupt``,
  or a failure) still places its event (:meth:`HeldEmits._rescue`).
* A record placed once the sender's last turn journals without ``_lock`` (a thread held it
  past the close's budget) is journaled or counted dropped, ``late_for_close``, never left in
  memory (:meth:`HeldEmits._taken_back`).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from producer.forking import start_in_forked_child
from producer.journal import Record

#: How long emit() waits for the journal writer when the spill queue is full (disk, not network).
FULL_WAIT_S = 1.0


class Emit:
    """One emit() call: its event, its record once encoded, the delivery-report cell of its
    emit number while produce() may not have taken the record yet, and whether it is
    settled (placed or dropped): what :meth:`HeldEmits._rescue` needs when an
    exception cuts it short."""

    __slots__ = ("event", "record", "cell", "settled", "outer", "depth", "held", "detail")

    def __init__(self, event: object, outer: Emit | None = None) -> None:
        self.event = event
        self.record: tuple[bytes | None, bytes] | None = None
        self.cell: list[int] | None = None
        self.settled = False
        # The emit() call this one interrupted on its thread (a signal handler's), and how
        # deep in them it runs; the records of handlers' emit() calls waiting for this one.
        self.outer = outer
        self.depth = 1 if outer is None else outer.depth + 1
        self.held: list[tuple[bytes | None, bytes]] | None = None
        self.detail: str | None = None   # why its record was refused, when that says more than the reason


class HeldEmits:
    """LineageProducer's placement of interrupted and interrupting emit() calls; see the module docstring."""

    _lock: threading.RLock
    _spill: deque[Record]
    _held_back: deque[Record]
    _max_spill: int
    _forked: bool
    _journal_note: str | None
    _place: Callable[[Emit, int | None, int], str | None]
    _encoded: Callable[[Emit], Record | None]
    _abandon: Callable[[list[int]], bool]
    _tell_journal_mode: Callable[[], None]
    _drop: Callable[..., None]
    _error: Callable[..., None]

    def _drop_detail(self, reason: str, call: Emit | None = None) -> str:
        if call is not None and call.detail is not None:
            return call.detail
        if reason == "closed":
            return "emit after close()"
        if reason == "too_large":
            return "librdkafka refused the record (its size)"
        if reason == "late_for_close":
            return ("placed after close() journaled without the producer's lock (this thread held it past the "
                    "close's budget: a long signal handler?)")
        return self._queue_full_detail()

    def _holder(self, call: Emit) -> Any:
        """Where the record of ``call`` (a signal handler's emit(), or the records held for it)
        must wait so as not to jump ahead of an emit() it interrupted on this thread: the
        held list of the nearest such call that has not placed (or dropped) its event -- it
        places them right after its own -- else the held-back queue while this thread holds
        ``_lock`` (an RLock: taking it again would put the record ahead of the one being
        placed, or mix up its bookkeeping), else None: it can be placed now."""
        outer = call.outer
        while outer is not None:
            if not outer.settled:
                if outer.held is None:
                    outer.held = []
                return outer.held
            outer = outer.outer
        if self._lock._is_owned():  # type: ignore[attr-defined]
            return self._held_back
        return None

    @staticmethod
    def _hold(call: Emit, holder: Any) -> None:
        """``call``'s record, then those held for it, wait in ``holder`` (:meth:`_holder`)."""
        holder.append(call.record)
        call.settled = True   # a handler's emit() from here on holds its record after this one's
        if call.held:
            held, call.held = call.held, None
            holder.extend(held)

    def _release_held(self, call: Emit) -> None:
        """``call`` is done (its event placed, dropped, or its exception on its way): the
        records held for it go next (:meth:`_holder`)."""
        held, call.held = call.held, None
        holder = self._holder(call)
        if holder is not None:
            holder.extend(held)
            return
        try:
            with self._lock:
                dropped = self._place_held(held)
            self._after_lock(dropped)
        except Exception as err:  # noqa: BLE001 - emit must never raise into the job
            self._error("emit_failed", err)

    def _after_lock(self, held_dropped: dict[str, int]) -> None:
        """After an emit's ``_lock``: what must not be logged holding it (the held records
        dropped, by reason). First the records a signal handler held back once the lock's
        last :meth:`_place_held` was over (its emit() ran before the lock was released): they
        are placed now, before this call returns -- left in the held-back queue, they would
        go after the next emit()'s event, or to the journal while in direct mode."""
        while self._held_back and not self._lock._is_owned():  # type: ignore[attr-defined]
            if self._forked:
                start_in_forked_child(self)
            with self._lock:
                more = self._place_held(None)
            for reason, n in more.items():
                held_dropped[reason] = held_dropped.get(reason, 0) + n
        if self._journal_note is not None:
            self._tell_journal_mode()
        for reason, n in held_dropped.items():
            self._drop(reason, self._drop_detail(reason), n=n)

    def _queue_full_detail(self) -> str:
        return f"the journal writer is {FULL_WAIT_S}s behind ({self._max_spill} events queued)"

    def _taken_back(self, record: tuple[bytes | None, bytes]) -> bool:
        """A record appended to the spill queue after the sender's last turn began draining
        it without ``_lock`` (:meth:`Sender._quiesce_emits`): True if it is taken back here
        (the drain had finished: it would stay in memory, never journaled), False if the
        drain took it. The queue's remove and the drain's pops are atomic: one of them has it."""
        try:
            self._spill.remove(record)
        except ValueError:
            return False
        return True

    def _place_held(self, held: list[Record] | None) -> dict[str, int]:
        """Under ``_lock``, right after a call's own record: the records held for that call
        (``held``), then those held back while the lock was owned, in order; returns how many
        were dropped, by reason. They were accepted before any close(): never refused as ``closed``."""
        dropped: dict[str, int] = {}
        for record in held or ():
            self._place_one(record, dropped)
        while self._held_back:
            self._place_one(self._held_back.popleft(), dropped)
        return dropped

    def _place_one(self, record: Record, dropped: dict[str, int]) -> None:
        call = Emit(None)
        call.record = record
        reason = self._place(call, None, 0)
        if reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1

    def _rescue(self, call: Emit, thread: int) -> None:
        """An emit() cut short by an exception (a signal handler's, or a failure): its event
        is placed now, after those emitted before it. A record it had handed to librdkafka
        with no sign of produce() having returned is settled by its delivery report if that
        came already (delivered, or taken back for the journal); else it is placed again
        and may be sent twice (at-least-once): its first copy's report is ignored (_abandon)."""
        if call.settled:
            return
        try:
            if call.record is None and self._encoded(call) is None:
                return
            holder = self._holder(call)
            if holder is None and self._forked:   # cut short before its producer started in this child
                start_in_forked_child(self)
            with self._lock:
                cell, call.cell = call.cell, None
                dropped = None
                if cell is not None and not self._abandon(cell):
                    call.settled = True   # its report came: librdkafka had it, and it is accounted for
                elif holder is not None:
                    self._hold(call, holder)
                else:
                    dropped = self._place(call, thread, call.depth)
                held_dropped = self._place_held(None) if holder is None else {}
            self._after_lock(held_dropped)
            if dropped is not None:
                self._drop(dropped, self._drop_detail(dropped, call), call.record[0])
        except Exception as err:  # noqa: BLE001 - emit must never raise into the job
            self._error("emit_failed", err)
