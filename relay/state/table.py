"""One collector's durable run state: which changelog records to write, and what an
acknowledgement settles. Pure bookkeeping beside a :class:`RunConsolidator`: no I/O, no clock.

Contract (see :mod:`relay.state` for the design):

* :meth:`RunStateTable.forwarded` events are handed to ``submit`` only after a write of
  their run that contains them is acknowledged (:meth:`written`), in the order forwarded.
* :meth:`captured` events' tickets are released when a write of their run made after the
  capture is acknowledged.
* A run's record is written only from :meth:`take_writes`; a run changed since its last
  write is "dirty". A delivery that nothing waits for (no event of the run is waiting for a
  write) makes it dirty only for the next ``take_writes(include_deliveries=True)`` (the
  commit's): until then a restore would re-send the delivered event, a duplicate, and the
  relay writes half as often. A closed run whose outbox is delivered is written once more (its outcome,
  so that a restored consolidator still drops its late events) and tombstoned once the
  consolidator forgets it.
* A terminal event is handed over only once an acknowledged write shows nothing before it
  in its run's outbox: if it was delivered, no restore can re-send a START or RUNNING
  before it (the outbox is re-sent by the same rule after a restore).
* A child run's START is submitted to wait for its parent's START when that one is still
  in the parent's outbox and the dispatcher still holds it (parent first, across runs
  delivered concurrently). One the dispatcher is done with but not yet :meth:`delivered`
  (:meth:`leaving`: on its way to the dead-letter topic) is waited for by nobody: the
  dispatcher opened its gate already, and a gate made after that would never open.
* :meth:`revoke` forgets the runs of partitions that moved away; acknowledgements of their
  writes still release tickets but send nothing. A revoked run with output under way is
  kept aside until :meth:`departed`: what is delivered meanwhile (while the revocation
  waits for its deliveries) is written once more by :meth:`take_departing_writes`, so that
  the new owner does not send it again.
* A record the broker refuses as too large (:meth:`written` with ``too_large``) is made
  again reduced, its outbox's events read from the input topic left out last, each marked
  in its place (see :mod:`relay.state.records` for the record format). A marked event's
  ticket is settled only once it is delivered (or dead-lettered) and a record of its run
  made after that (without the mark) is acknowledged, so its offset is not committed while
  the topic's record may still hold the mark: after a crash its copy read again takes the
  mark's place in the restored outbox (:meth:`refill`); a mark of which a later event of the
  run and partition is read again was delivered (its offset committed), and is dropped. One
  refused even so is kept in memory only (settled as if written). No record ever lists as
  unsent an event that a later record showed delivered.

What the table keeps per run, and the writes it hands out: :mod:`relay.state.slots`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

from relay.events import LineageEvent
from relay.stages.consolidate import RunConsolidator
from relay.stages.run_state import Drop, Forward, read_closed_state
from relay.state.records import FACETS_LEFT_OUT, OUTBOX_LEFT_OUT, OutboxMark, decode_record, encode_record
from relay.state.slots import (
    Departure,
    RunSlot,
    StateWrite,
    by_seq,
    fill_marks,
    hand_over,
    has_seen,
    keep_marked_ticket,
    mark_left_out,
    remember,
    settle_written,
)


class RunStateTable:
    def __init__(self, collector: str, consolidator: RunConsolidator,
                 submit: Callable[[LineageEvent, LineageEvent | None], None]) -> None:
        """``submit(event, after)`` hands ``event`` to delivery, behind ``after`` if not None."""
        self.collector = collector
        self._consolidator = consolidator
        self._submit = submit
        self._prefix = f"{collector}/".encode()
        self._slots: dict[str, RunSlot] = {}
        self._dirty: dict[str, None] = {}  # an ordered set
        self._delivered: dict[str, None] = {}  # dirty only by deliveries nothing waits for
        # Closed runs written with their outcome, slot gone; tombstoned once the
        # consolidator forgets them (finished_ttl_s, max_finished_runs): oldest first.
        self._closed: OrderedDict[str, int] = OrderedDict()
        # id -> event: in an outbox, out of the dispatcher (see leaving); the event is kept
        # so that its id is not reused while it is here.
        self._leaving: dict[int, LineageEvent] = {}
        self._revoked: dict[int, int] = {}  # partition -> how many times it was revoked
        self._departing: dict[str, Departure] = {}  # revoked runs, until departed()
        self._marked: set[str] = set()  # runs whose outbox holds marks (see refill)
        self._seq = 0

    @property
    def mode(self) -> str:
        """The collector's delivery mode (passthrough: a table of runs saved in a former mode)."""
        return self._consolidator.mode

    @property
    def runs(self) -> int:
        """Runs with state beyond the consolidator's (open, or closed with output pending)."""
        return len(self._slots)

    def key(self, run_id: str) -> bytes:
        return self._prefix + run_id.encode()

    # -- what the lane reports -----------------------------------------------------------

    def is_duplicate(self, event: LineageEvent) -> bool:
        """Whether the run already accepted an event with this content."""
        slot = self._slots.get(event.run_id)
        return slot is not None and has_seen(slot, event.digest)

    def refill(self, event: LineageEvent) -> bool:
        """Whether ``event`` is the copy, read again, of an event its run's restored record
        left out (a mark): it takes the mark's place in the outbox (to be sent in order) and
        the caller holds its ticket until it is delivered; it is not offered to the
        consolidator (the run's state holds it already).

        An event of the run drops the run's marks of its partition below its offset: their
        events were delivered (their offsets committed, or they would have been read again
        before it). Only the run's own: another run's event may come first (held for its
        routing), and a mark dropped too early would lose its event."""
        run_id, src = event.run_id, event.source
        if run_id not in self._marked or src is None:
            return False
        slot = self._slots.get(run_id)
        if slot is None:
            self._marked.discard(run_id)
            return False
        if not fill_marks(slot, event):
            return False
        if not any(type(e) is OutboxMark for e in slot.outbox):
            self._marked.discard(run_id)
        self._dirty[run_id] = None
        if event not in slot.outbox:
            return False
        remember(slot, event.digest)
        slot.marked = [*slot.marked, event]  # the restored record marks it still
        return True

    def captured(self, event: LineageEvent) -> None:
        """``event`` (with its ticket) is now part of its run's state."""
        slot = self._slot(event)
        remember(slot, event.digest)
        slot.waiters = [*slot.waiters, event.ticket]
        self._dirty[event.run_id] = None

    def forwarded(self, event: LineageEvent) -> None:
        """``event`` must reach the collector: it is sent once a write holding it is durable."""
        slot = self._slot(event)
        if slot is None:  # a built event of a run this table never saw: nothing to persist it with
            self._send(event)
            return
        if event.ticket is not None:
            remember(slot, event.digest)
        slot.outbox = [*slot.outbox, event]
        slot.unsent = [*slot.unsent, event]
        self._dirty[event.run_id] = None

    def touched(self, run_id: str) -> None:
        """The consolidator changed ``run_id``'s state without forwarding or capturing."""
        if run_id in self._slots:
            self._dirty[run_id] = None

    def leaving(self, event: LineageEvent) -> None:
        """The dispatcher is done with ``event`` although it has not reached the collector:
        it goes to the dead-letter topic. It stays in the outbox until :meth:`delivered`
        (the dead letter is acknowledged), but no child START is made to wait for it."""
        slot = self._slots.get(event.run_id)
        if slot is not None and event in slot.outbox:
            self._leaving[id(event)] = event

    def delivered(self, event: LineageEvent) -> bool:
        """``event`` reached the collector, or the dead-letter topic: out of the outbox.

        True when the table keeps its ticket (the caller must not release it): a record of
        its run marks it (written, or being written, with the outbox left out), and a
        restore of that record would wait at the mark for the event read again; its offset
        is therefore committed only once a later record of the run, made after the
        delivery (without the mark), is acknowledged: the ticket goes with that write."""
        self._leaving.pop(id(event), None)
        slot = self._slots.get(event.run_id)
        if slot is not None and event in slot.outbox:
            slot.outbox = [e for e in slot.outbox if e is not event] or ()
            (self._dirty if slot.unsent else self._delivered)[event.run_id] = None
            return keep_marked_ticket(slot, event)
        if self._departing:
            departure = self._departing.get(event.run_id)
            if departure is not None and event in departure.slot.outbox:  # delivered while its run leaves
                departure.slot.outbox = [e for e in departure.slot.outbox if e is not event] or ()
                departure.changed = True
                return keep_marked_ticket(departure.slot, event)
        return False

    def _send(self, event: LineageEvent) -> None:
        after = None
        if event.event_type == "START" and event.parent_run_id is not None:
            parent = self._slots.get(event.parent_run_id)
            if parent is not None:
                leaving = self._leaving
                after = next((e for e in parent.outbox if e.event_type == "START" and id(e) not in leaving
                              and type(e) is not OutboxMark), None)
        self._submit(event, after)

    def _slot(self, event: LineageEvent) -> RunSlot | None:
        slot = self._slots.get(event.run_id)
        if slot is None and event.source is not None:
            slot = self._slots[event.run_id] = RunSlot(event.source.partition)
        return slot

    # -- writing ---------------------------------------------------------------------------

    def take_writes(self, include_deliveries: bool = False) -> list[StateWrite]:
        """Records for every dirty run and every forgotten closed run, in that order."""
        writes: list[StateWrite] = []
        consolidator = self._consolidator
        if include_deliveries:
            self._dirty.update(self._delivered)
            self._delivered.clear()
        for run_id in self._dirty:
            self._delivered.pop(run_id, None)
            slot = self._slots.get(run_id)
            if slot is None:
                continue
            state = consolidator.to_state(run_id)
            closed = state is None or "closed" in state
            outbox = slot.outbox
            unsent = slot.unsent
            ready = next((i for i, event in enumerate(unsent)
                          if type(event) is OutboxMark or event.is_terminal and event is not outbox[0]), len(unsent))
            writes.append(self._write(run_id, slot, state, unsent[:ready], closed and not outbox))
            slot.unsent = unsent[ready:] or ()
        self._dirty.clear()
        closed_runs = self._closed
        while closed_runs:
            run_id, partition = next(iter(closed_runs.items()))
            if run_id not in self._slots:  # not reopened
                state = consolidator.to_state(run_id)
                if state is not None and "closed" in state:
                    break  # still remembered; the ones behind it closed later
                if state is None:
                    writes.append(StateWrite(partition, self.key(run_id), None, run_id, None, [], [], True,
                                             self._revoked.get(partition, 0)))
            del closed_runs[run_id]
        return writes

    def _write(self, run_id: str, slot: RunSlot, state: dict[str, Any] | None, to_send: list[LineageEvent],
               final: bool) -> StateWrite:
        """The record of ``run_id`` in ``state``, with ``slot``'s waiting tickets (taken)."""
        value = encode_record(state, slot.seen, slot.outbox, slot.reduced, slot.partition)
        if slot.outbox and slot.reduced == OUTBOX_LEFT_OUT:
            mark_left_out(slot)
        self._seq += 1
        write = StateWrite(slot.partition, self.key(run_id), value, run_id, slot, slot.waiters, to_send, final,
                           self._seq, reduced=slot.reduced)
        slot.waiters = ()
        slot.writing = [*slot.writing, self._seq]
        return write

    def written(self, write: StateWrite, ok: bool, too_large: bool = False) -> None:
        """The broker acknowledged ``write`` (``ok``) or it failed (it is made again).

        A run's record holds all its state and its whole outbox, so a later write of the
        run holds what an earlier one did. When a write fails while a later one is in
        flight, its tickets and events ride on that one (``carried``): sent as soon as the
        later write is acknowledged, they would otherwise go out after its events (a
        RUNNING before its START); if the later write fails too, all of them are made again,
        in order.

        ``too_large``: the broker refused it for its size. It is made again, and the run's
        records from then on leave out its merged facets; if that is refused too, the next
        one leaves out the outbox as well (see :mod:`relay.state.records`), then the run's
        record is whole again but for its facets. One refused even so is settled as if
        written: kept in memory only. Never settled while refused: the record on the topic
        (an older one) could list as unsent an event delivered since, which a restore would
        send again (a START after the terminal)."""
        slot = write.slot
        if too_large:
            ok = not write.reducible
            if not ok:
                slot.reduced = max(slot.reduced, write.reduced + 1)
        if slot is None:  # a tombstone
            if not ok and self._revoked.get(write.partition, 0) == write.epoch:
                # Not after a revocation: the partition's new owner may have written the run since.
                self._closed[write.run_id] = write.partition
                self._closed.move_to_end(write.run_id, last=False)
            return
        slot.writing = [seq for seq in slot.writing if seq != write.seq] or ()
        current = self._slots.get(write.run_id) is slot
        if not ok:
            # Made again: by the next take_writes, or (the run revoked since, its deliveries
            # waited for) by the revocation's next take_departing_writes.
            departure = None if current else self._departing.get(write.run_id)
            if current or (departure is not None and departure.slot is slot):
                carried = sorted([*slot.carried, write], key=by_seq)
                if any(seq > write.seq for seq in slot.writing):
                    slot.carried = carried
                    return
                slot.carried = ()
                slot.waiters = [*(t for w in carried for t in w.tickets), *slot.waiters]
                slot.unsent = [*(e for w in carried for e in w.to_send), *slot.unsent]
                if departure is not None:
                    departure.changed = True
                else:
                    self._dirty[write.run_id] = None
            return
        # Not current: the run was revoked (or reopened) meanwhile. What the write holds is
        # durable all the same, in the run's record, whose new owner sends its outbox: the
        # events are handed over (settled here: one read from a partition still assigned
        # here would otherwise hold its commits for good).
        send = self._send if current else partial(
            hand_over, slot.partition if write.reduced == OUTBOX_LEFT_OUT else None)
        settle_written(slot, write, send)
        if not current:
            return
        if write.reduced == OUTBOX_LEFT_OUT:
            # Written but for its outbox: the run's next record holds its outbox again.
            slot.reduced = min(slot.reduced, FACETS_LEFT_OUT)
        if write.final and not slot.writing and not slot.outbox and write.run_id not in self._dirty \
                and write.run_id not in self._delivered:
            del self._slots[write.run_id]
            if write.value is not None:
                self._closed[write.run_id] = slot.partition

    # -- rebalancing -----------------------------------------------------------------------

    def revoke(self, partitions: set[int]) -> tuple[set[str], list[LineageEvent]]:
        """Forget the runs of ``partitions`` (here and in the consolidator); return their ids
        and their undelivered output (which other runs may have been told to wait for).

        Those with output under way, or changed since their last write, are kept aside
        (their state as it is now) until :meth:`departed`: :meth:`take_departing_writes`
        writes them again once the revocation has waited for their deliveries."""
        self.departed(partitions)  # left over by a revocation that did not finish (cancelled)
        for partition in partitions:
            self._revoked[partition] = self._revoked.get(partition, 0) + 1
        gone = {run_id for run_id, slot in self._slots.items() if slot.partition in partitions}
        gone.update(run_id for run_id, partition in self._closed.items() if partition in partitions)
        abandoned: list[LineageEvent] = []
        for run_id in gone:
            slot = self._slots.pop(run_id, None)
            dirty = run_id in self._dirty or run_id in self._delivered
            self._dirty.pop(run_id, None)
            self._delivered.pop(run_id, None)
            state = self._consolidator.forget(run_id)
            self._marked.discard(run_id)
            if slot is not None:
                abandoned += [event for event in slot.outbox if type(event) is not OutboxMark]
                for event in slot.outbox:
                    self._leaving.pop(id(event), None)
                if slot.outbox or dirty:
                    self._departing[run_id] = Departure(slot, state, dirty)
            self._closed.pop(run_id, None)
        return gone, abandoned

    def take_departing_writes(self, partitions: set[int]) -> list[StateWrite]:
        """Records for the revoked runs of ``partitions`` changed since they were revoked (or
        not written since they last changed): their state then, their outbox now (without
        what was delivered meanwhile). Their acknowledgements release tickets, send nothing."""
        writes = []
        for run_id, departure in self._departing.items():
            slot = departure.slot
            if departure.changed and slot.partition in partitions:
                departure.changed = False
                writes.append(self._write(run_id, slot, departure.state, slot.unsent, False))
                slot.unsent = ()
        return writes

    def departed(self, partitions: set[int]) -> None:
        """Forget the revoked runs of ``partitions`` kept aside (written or not)."""
        for run_id in [r for r, d in self._departing.items() if d.slot.partition in partitions]:
            del self._departing[run_id]

    def restore(self, run_id: str, partition: int, value: bytes, now: float) -> bool:
        """Take back a run from its changelog record; its outbox is sent again.

        An open run's state saved in another mode (the collector's mode changed since, to
        passthrough too) is taken over (:meth:`RunConsolidator.take_over`): its outbox is
        sent, then what the state held, flushed; the run goes on in the new mode, and its
        record is written again in that mode (a tombstone in passthrough). Returns whether it
        was. Raises ValueError for a record this version cannot read."""
        state, outbox, seen = decode_record(run_id, value, now)
        is_open = state is not None and read_closed_state(run_id, state) is None
        taken_over = False
        if state is not None:
            consolidator = self._consolidator
            if consolidator.reads(state):
                consolidator.restore(run_id, state, now)
            else:
                taken_over, is_open = is_open, False
                for action in consolidator.take_over(run_id, state, now):
                    if type(action) is Forward:
                        outbox.append(action.event)  # built: no ticket
                    elif type(action) is Drop:
                        action.event.ticket.release()  # SETTLED: nothing to release
        self._departing.pop(run_id, None)
        if any(type(e) is OutboxMark for e in outbox):
            self._marked.add(run_id)
        else:
            self._marked.discard(run_id)
        if outbox or is_open or taken_over:
            slot = self._slots[run_id] = RunSlot(partition, bytes.fromhex(seen or ""))
            slot.outbox, slot.unsent = outbox or (), list(outbox) or ()
            self._closed.pop(run_id, None)
            if outbox or taken_over:
                self._dirty[run_id] = None  # re-sent after the next write, by the same rules
        elif state is not None:
            self._closed[run_id] = partition
        return taken_over

    @property
    def holds_output(self) -> bool:
        """Whether any run (here, or revoked and kept aside) has state or output."""
        return bool(self._slots or self._departing)

    @property
    def has_marks(self) -> bool:
        """Whether a restored outbox waits at a mark (see :meth:`refill`)."""
        return bool(self._marked)
