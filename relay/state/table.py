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
  again reduced: the run's records leave out its merged facets, and if that is still too
  large, the events of its outbox read from the input topic (sent as themselves) too, and
  the facets of those it built. A left-out event is marked in its place (its digest and
  source offset); its ticket is settled only once it is delivered (or dead-lettered) and a
  record of its run made after that (without the mark) is acknowledged, so its offset is
  not committed while the topic's record may still hold the mark: after a crash its copy
  read again takes the mark's place in the restored outbox (:meth:`refill`) and is sent in
  order; a mark of which a later event of the run and partition is read again was delivered
  (its offset committed), and is dropped. One refused even so is kept in memory only (settled as
  if written). No record ever lists as unsent an event that a later record showed delivered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from relay.events import LineageEvent
from relay.stages.consolidate import RunConsolidator
from relay.stages.json_bytes import dumps, loads
from relay.stages.run_state import (
    Drop,
    Forward,
    built_event,
    doc_without_facets,
    read_closed_state,
    state_without_facets,
)

RECORD_VERSION = 1
_DIGEST_BYTES = 16
#: How much of a run its records leave out (see :meth:`RunStateTable.written`).
WHOLE, FACETS_LEFT_OUT, OUTBOX_LEFT_OUT = 0, 1, 2


class StateWrite:
    """One changelog record to produce; ``value`` None is a tombstone."""

    __slots__ = ("partition", "key", "value", "run_id", "slot", "tickets", "to_send", "final", "seq", "epoch",
                 "reduced")

    def __init__(self, partition: int, key: bytes, value: bytes | None, run_id: str, slot: _Slot | None,
                 tickets: list, to_send: list[LineageEvent], final: bool, seq: int = 0, epoch: int = 0,
                 reduced: int = WHOLE) -> None:
        self.partition, self.key, self.value, self.run_id = partition, key, value, run_id
        self.slot, self.tickets, self.to_send, self.final = slot, tickets, to_send, final
        self.seq = seq  # the table's count of writes made before it: their order
        self.epoch = epoch  # a forgotten run's tombstone: its partition's revocations when made
        self.reduced = reduced  # what the record leaves out of the run

    @property
    def reducible(self) -> bool:
        """Whether a smaller record of the run can be made, should the broker refuse this one
        as too large."""
        return self.slot is not None and self.reduced < OUTBOX_LEFT_OUT


#: Digests a run remembers for dedupe: the latest this many events' (a run that streams for
#: days would otherwise grow its state, re-written whole with each change, without bound,
#: and reach the broker's record size limit). Duplicates come close together.
SEEN_MAX = 256


def _hand_over(left_out: int | None, event: LineageEvent | _Mark) -> None:
    """Settle ``event``, which a revoked run's record holds (its new owner sends it); not
    one the record marks (read from the run's partition ``left_out``, its outbox left out):
    that partition's commits stop below it, and its new owner reads it again."""
    if type(event) is _Mark or event.ticket is None:
        return
    src = event.source
    if left_out is None or src is None or src.partition != left_out:
        event.ticket.release()


def _by_seq(write: StateWrite) -> int:
    return write.seq


def _keep_marked_ticket(slot: _Slot, event: LineageEvent) -> bool:
    """Whether delivered ``event`` is one a record of ``slot``'s run marks: its ticket then
    waits for the run's next acknowledged write (see :meth:`RunStateTable.delivered`)."""
    if not slot.marked or not any(e is event for e in slot.marked):
        return False
    slot.marked = [e for e in slot.marked if e is not event] or ()
    slot.waiters = [*slot.waiters, event.ticket]
    return True


def _remember(slot: _Slot, digest: bytes) -> None:
    seen = slot.seen + digest
    slot.seen = seen if len(seen) <= SEEN_MAX * _DIGEST_BYTES else seen[-SEEN_MAX * _DIGEST_BYTES:]


class _Slot:
    """What the table keeps per run beside the consolidator's own state. The queues are
    ``()`` while empty (most runs, most of the time: a list per run adds up)."""

    __slots__ = ("partition", "seen", "outbox", "unsent", "waiters", "writing", "carried", "reduced", "marked")

    def __init__(self, partition: int, seen: bytes = b"") -> None:
        self.partition = partition
        self.seen = seen  # digests of events accepted into the run, concatenated
        self.outbox: list[LineageEvent] | tuple = ()  # forwarded, not yet delivered: written with the state
        self.unsent: list[LineageEvent] | tuple = ()  # in the outbox, no acknowledged write holds them yet
        self.waiters: list | tuple = ()  # tickets of captured events, for the next acknowledged write
        self.writing: list[int] | tuple = ()  # ``seq`` of the writes in flight
        # Failed writes whose tickets and events a later write in flight also holds: they
        # settle and go out, first, when it is acknowledged (see written()).
        self.carried: list[StateWrite] | tuple = ()
        self.reduced = WHOLE  # what its records leave out, since one was refused as too large
        # Outbox events a record written (or being written) marks instead of holding: the
        # topic's record may still show them unsent; see delivered().
        self.marked: list[LineageEvent] | tuple = ()


class _Mark:
    """In a restored outbox, the place of an event its record left out (read from the input
    topic, sent as itself): its copy read again takes it (see :meth:`RunStateTable.refill`).
    Never sent; the outbox waits at it."""

    __slots__ = ("digest", "topic", "partition", "offset")
    event_type = None
    is_terminal = False

    def __init__(self, digest: bytes, topic: str, partition: int, offset: int) -> None:
        self.digest, self.topic, self.partition, self.offset = digest, topic, partition, offset

    def to_json(self) -> list:
        return [self.digest.hex(), self.topic, self.partition, self.offset]


class _Departure:
    """A revoked run with output under way or changes not written: its state when it was
    revoked, its slot (whose outbox deliveries still empty), whether to write it again."""

    __slots__ = ("slot", "state", "changed")

    def __init__(self, slot: _Slot, state: dict[str, Any] | None, changed: bool) -> None:
        self.slot, self.state, self.changed = slot, state, changed


class RunStateTable:
    def __init__(self, collector: str, consolidator: RunConsolidator,
                 submit: Callable[[LineageEvent, LineageEvent | None], None]) -> None:
        """``submit(event, after)`` hands ``event`` to delivery, behind ``after`` if not None."""
        self.collector = collector
        self._consolidator = consolidator
        self._submit = submit
        self._prefix = f"{collector}/".encode()
        self._slots: dict[str, _Slot] = {}
        self._dirty: dict[str, None] = {}  # an ordered set
        self._delivered: dict[str, None] = {}  # dirty only by deliveries nothing waits for
        # Closed runs written with their outcome, slot gone; tombstoned once the
        # consolidator forgets them (finished_ttl_s, max_finished_runs): oldest first.
        self._closed: OrderedDict[str, int] = OrderedDict()
        # id -> event: in an outbox, out of the dispatcher (see leaving); the event is kept
        # so that its id is not reused while it is here.
        self._leaving: dict[int, LineageEvent] = {}
        self._revoked: dict[int, int] = {}  # partition -> how many times it was revoked
        self._departing: dict[str, _Departure] = {}  # revoked runs, until departed()
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
        if slot is None:
            return False
        seen, digest = slot.seen, event.digest
        at = seen.find(digest)
        while at != -1:
            if at % _DIGEST_BYTES == 0:
                return True
            at = seen.find(digest, at + 1)
        return False

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
        swap: dict[int, LineageEvent | None] = {}
        for item in slot.outbox:
            if type(item) is _Mark and item.topic == src.topic and item.partition == src.partition:
                if item.offset == src.offset and item.digest == event.digest:
                    swap[id(item)] = event
                elif item.offset < src.offset:
                    swap[id(item)] = None
        if not swap:
            return False
        slot.outbox = [e for e in (swap.get(id(e), e) for e in slot.outbox) if e is not None] or ()
        slot.unsent = [e for e in (swap.get(id(e), e) for e in slot.unsent) if e is not None] or ()
        if not any(type(e) is _Mark for e in slot.outbox):
            self._marked.discard(run_id)
        self._dirty[run_id] = None
        if event not in slot.outbox:
            return False
        _remember(slot, event.digest)
        slot.marked = [*slot.marked, event]  # the restored record marks it still
        return True

    def captured(self, event: LineageEvent) -> None:
        """``event`` (with its ticket) is now part of its run's state."""
        slot = self._slot(event)
        _remember(slot, event.digest)
        slot.waiters = [*slot.waiters, event.ticket]
        self._dirty[event.run_id] = None

    def forwarded(self, event: LineageEvent) -> None:
        """``event`` must reach the collector: it is sent once a write holding it is durable."""
        slot = self._slot(event)
        if slot is None:  # a built event of a run this table never saw: nothing to persist it with
            self._send(event)
            return
        if event.ticket is not None:
            _remember(slot, event.digest)
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
            return _keep_marked_ticket(slot, event)
        if self._departing:
            departure = self._departing.get(event.run_id)
            if departure is not None and event in departure.slot.outbox:  # delivered while its run leaves
                departure.slot.outbox = [e for e in departure.slot.outbox if e is not event] or ()
                departure.changed = True
                return _keep_marked_ticket(departure.slot, event)
        return False

    def _send(self, event: LineageEvent) -> None:
        after = None
        if event.event_type == "START" and event.parent_run_id is not None:
            parent = self._slots.get(event.parent_run_id)
            if parent is not None:
                leaving = self._leaving
                after = next((e for e in parent.outbox if e.event_type == "START" and id(e) not in leaving
                              and type(e) is not _Mark), None)
        self._submit(event, after)

    def _slot(self, event: LineageEvent) -> _Slot | None:
        slot = self._slots.get(event.run_id)
        if slot is None and event.source is not None:
            slot = self._slots[event.run_id] = _Slot(event.source.partition)
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
                          if type(event) is _Mark or event.is_terminal and event is not outbox[0]), len(unsent))
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

    def _write(self, run_id: str, slot: _Slot, state: dict[str, Any] | None, to_send: list[LineageEvent],
               final: bool) -> StateWrite:
        """The record of ``run_id`` in ``state``, with ``slot``'s waiting tickets (taken)."""
        outbox = slot.outbox
        if state is None and not outbox:
            value = None
        else:
            reduced = slot.reduced
            record: dict[str, Any] = {"v": RECORD_VERSION,
                                      "state": state_without_facets(state) if reduced else state}
            if state is not None and "closed" not in state:
                record["seen"] = slot.seen.hex()
            if outbox:
                left_out = slot.partition if reduced == OUTBOX_LEFT_OUT else None
                record["outbox"] = [_outbox_entry(event, left_out) for event in outbox]
            value = orjson.dumps(record)
        if outbox and slot.reduced == OUTBOX_LEFT_OUT:
            partition, marked = slot.partition, slot.marked
            slot.marked = [*marked, *(e for e in outbox if type(e) is not _Mark and e.ticket is not None
                                      and e.source is not None and e.source.partition == partition
                                      and not any(m is e for m in marked))] or ()
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
        records from then on leave out its merged facets (a restore builds its events
        without the facets merged before); if that is refused too, the next one leaves out
        the outbox as well (see :func:`_outbox_entry`: marks, and built events without
        their facets; then the run's record is whole again but for its facets). One
        refused even so is settled as if written: kept in memory only. Never settled while
        refused: the record on the topic (an older one) could list as unsent an event
        delivered since, which a restore would send again (a START after the terminal)."""
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
                carried = sorted([*slot.carried, write], key=_by_seq)
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
            _hand_over, slot.partition if write.reduced == OUTBOX_LEFT_OUT else None)
        if slot.carried:
            held = [w for w in slot.carried if w.seq < write.seq]
            slot.carried = [w for w in slot.carried if w.seq > write.seq] or ()
            for earlier in held:
                for ticket in earlier.tickets:
                    ticket.release()
                for event in earlier.to_send:
                    send(event)
        for ticket in write.tickets:
            ticket.release()
        for event in write.to_send:
            send(event)
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
                abandoned += [event for event in slot.outbox if type(event) is not _Mark]
                for event in slot.outbox:
                    self._leaving.pop(id(event), None)
                if slot.outbox or dirty:
                    self._departing[run_id] = _Departure(slot, state, dirty)
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
        try:
            record = loads(value)  # its events' integers beyond 64 bits exact, not floats
        except orjson.JSONDecodeError as err:
            raise ValueError(f"run state for {run_id} is not JSON: {err}") from err
        if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
            raise ValueError(f"run state for {run_id} is not a version {RECORD_VERSION} record")
        state = record.get("state")
        outbox = [built_event(entry, now) if isinstance(entry, dict) else _read_mark(run_id, entry)
                  for entry in record.get("outbox") or ()]
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
        if any(type(e) is _Mark for e in outbox):
            self._marked.add(run_id)
        else:
            self._marked.discard(run_id)
        if outbox or is_open or taken_over:
            slot = self._slots[run_id] = _Slot(partition, bytes.fromhex(record.get("seen") or ""))
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


def _outbox_entry(event: LineageEvent | _Mark, left_out: int | None) -> Any:
    """How a record holds an outbox event: whole, unless the outbox is left out (its run's
    partition ``left_out``): then an event read from that partition is a mark (its copy is
    read again after a crash, its offset not committed before it is delivered), one the run
    built is kept without its facets. One read from another partition is kept whole: that
    partition may stay here, and a revocation settles it (its new owner sends it)."""
    if type(event) is _Mark:
        return event.to_json()
    if left_out is None:
        return orjson.Fragment(event.body)
    src = event.source
    if src is None or event.ticket is None:
        return orjson.Fragment(dumps(doc_without_facets(loads(event.body))))
    if src.partition != left_out:
        return orjson.Fragment(event.body)
    return [event.digest.hex(), src.topic, src.partition, src.offset]


def _read_mark(run_id: str, entry: Any) -> _Mark:
    try:
        digest, topic, partition, offset = entry
        return _Mark(bytes.fromhex(digest), topic, int(partition), int(offset))
    except (TypeError, ValueError) as err:
        raise ValueError(f"malformed outbox entry in run state for {run_id}: {entry!r}") from err
