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
  writes still release tickets but send nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from relay.events import LineageEvent
from relay.stages.consolidate import RunConsolidator
from relay.stages.json_bytes import loads
from relay.stages.run_state import built_event, read_closed_state

RECORD_VERSION = 1
_DIGEST_BYTES = 16


class StateWrite:
    """One changelog record to produce; ``value`` None is a tombstone."""

    __slots__ = ("partition", "key", "value", "run_id", "slot", "tickets", "to_send", "final", "seq", "epoch")

    def __init__(self, partition: int, key: bytes, value: bytes | None, run_id: str, slot: _Slot | None,
                 tickets: list, to_send: list[LineageEvent], final: bool, seq: int = 0, epoch: int = 0) -> None:
        self.partition, self.key, self.value, self.run_id = partition, key, value, run_id
        self.slot, self.tickets, self.to_send, self.final = slot, tickets, to_send, final
        self.seq = seq  # the table's count of writes made before it: their order
        self.epoch = epoch  # a forgotten run's tombstone: its partition's revocations when made


#: Digests a run remembers for dedupe: the latest this many events' (a run that streams for
#: days would otherwise grow its state, re-written whole with each change, without bound,
#: and reach the broker's record size limit). Duplicates come close together.
SEEN_MAX = 256


def _hand_over(event: LineageEvent) -> None:
    if event.ticket is not None:
        event.ticket.release()


def _by_seq(write: StateWrite) -> int:
    return write.seq


def _remember(slot: _Slot, digest: bytes) -> None:
    seen = slot.seen + digest
    slot.seen = seen if len(seen) <= SEEN_MAX * _DIGEST_BYTES else seen[-SEEN_MAX * _DIGEST_BYTES:]


class _Slot:
    """What the table keeps per run beside the consolidator's own state. The queues are
    ``()`` while empty (most runs, most of the time: a list per run adds up)."""

    __slots__ = ("partition", "seen", "outbox", "unsent", "waiters", "writing", "carried")

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
        self._seq = 0

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

    def delivered(self, event: LineageEvent) -> None:
        """``event`` reached the collector, or the dead-letter topic: out of the outbox."""
        self._leaving.pop(id(event), None)
        slot = self._slots.get(event.run_id)
        if slot is not None and event in slot.outbox:
            slot.outbox = [e for e in slot.outbox if e is not event] or ()
            (self._dirty if slot.unsent else self._delivered)[event.run_id] = None

    def _send(self, event: LineageEvent) -> None:
        after = None
        if event.event_type == "START" and event.parent_run_id is not None:
            parent = self._slots.get(event.parent_run_id)
            if parent is not None:
                leaving = self._leaving
                after = next((e for e in parent.outbox if e.event_type == "START" and id(e) not in leaving), None)
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
            if state is None and not outbox:
                value = None
            else:
                record: dict[str, Any] = {"v": RECORD_VERSION, "state": state}
                if not closed:
                    record["seen"] = slot.seen.hex()
                if outbox:
                    record["outbox"] = [orjson.Fragment(event.body) for event in outbox]
                value = orjson.dumps(record)
            unsent = slot.unsent
            ready = next((i for i, event in enumerate(unsent) if event.is_terminal and event is not outbox[0]),
                         len(unsent))
            self._seq += 1
            writes.append(StateWrite(slot.partition, self.key(run_id), value, run_id, slot, slot.waiters,
                                     unsent[:ready], closed and not outbox, self._seq))
            slot.waiters, slot.unsent = (), unsent[ready:] or ()
            slot.writing = [*slot.writing, self._seq]
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

    def written(self, write: StateWrite, ok: bool) -> None:
        """The broker acknowledged ``write`` (``ok``) or it failed (it is made again).

        A run's record holds all its state and its whole outbox, so a later write of the
        run holds what an earlier one did. When a write fails while a later one is in
        flight, its tickets and events ride on that one (``carried``): sent as soon as the
        later write is acknowledged, they would otherwise go out after its events (a
        RUNNING before its START); if the later write fails too, all of them are made again,
        in order."""
        slot = write.slot
        if slot is None:  # a tombstone
            if not ok and self._revoked.get(write.partition, 0) == write.epoch:
                # Not after a revocation: the partition's new owner may have written the run since.
                self._closed[write.run_id] = write.partition
                self._closed.move_to_end(write.run_id, last=False)
            return
        slot.writing = [seq for seq in slot.writing if seq != write.seq] or ()
        current = self._slots.get(write.run_id) is slot
        if not ok:
            if current:
                carried = sorted([*slot.carried, write], key=_by_seq)
                if any(seq > write.seq for seq in slot.writing):
                    slot.carried = carried
                    return
                slot.carried = ()
                slot.waiters = [*(t for w in carried for t in w.tickets), *slot.waiters]
                slot.unsent = [*(e for w in carried for e in w.to_send), *slot.unsent]
                self._dirty[write.run_id] = None
            return
        # Not current: the run was revoked (or reopened) meanwhile. What the write holds is
        # durable all the same, in the run's record, whose new owner sends its outbox: the
        # events are handed over (settled here: one read from a partition still assigned
        # here would otherwise hold its commits for good).
        send = self._send if current else _hand_over
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
        if write.final and not slot.writing and not slot.outbox and write.run_id not in self._dirty \
                and write.run_id not in self._delivered:
            del self._slots[write.run_id]
            if write.value is not None:
                self._closed[write.run_id] = slot.partition

    # -- rebalancing -----------------------------------------------------------------------

    def revoke(self, partitions: set[int]) -> tuple[set[str], list[LineageEvent]]:
        """Forget the runs of ``partitions`` (here and in the consolidator); return their ids
        and their undelivered output (which other runs may have been told to wait for)."""
        for partition in partitions:
            self._revoked[partition] = self._revoked.get(partition, 0) + 1
        gone = {run_id for run_id, slot in self._slots.items() if slot.partition in partitions}
        gone.update(run_id for run_id, partition in self._closed.items() if partition in partitions)
        abandoned: list[LineageEvent] = []
        for run_id in gone:
            slot = self._slots.pop(run_id, None)
            if slot is not None:
                abandoned += slot.outbox
                for event in slot.outbox:
                    self._leaving.pop(id(event), None)
            self._closed.pop(run_id, None)
            self._dirty.pop(run_id, None)
            self._delivered.pop(run_id, None)
            self._consolidator.forget(run_id)
        return gone, abandoned

    def restore(self, run_id: str, partition: int, value: bytes, now: float) -> None:
        """Take back a run from its changelog record; its outbox is sent again.
        Raises ValueError for a record this version cannot read."""
        try:
            record = loads(value)  # its events' integers beyond 64 bits exact, not floats
        except orjson.JSONDecodeError as err:
            raise ValueError(f"run state for {run_id} is not JSON: {err}") from err
        if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
            raise ValueError(f"run state for {run_id} is not a version {RECORD_VERSION} record")
        state = record.get("state")
        if state is not None:
            self._consolidator.restore(run_id, state, now)
        outbox = [built_event(doc, now) for doc in record.get("outbox") or ()]
        if outbox or (state is not None and read_closed_state(run_id, state) is None):
            slot = self._slots[run_id] = _Slot(partition, bytes.fromhex(record.get("seen") or ""))
            slot.outbox, slot.unsent = outbox or (), list(outbox) or ()
            self._closed.pop(run_id, None)
            if outbox:
                self._dirty[run_id] = None  # re-sent after the next write, by the same rules
        elif state is not None:
            self._closed[run_id] = partition
