"""What a :class:`~relay.state.table.RunStateTable` keeps per run beside the consolidator's
own state (:class:`RunSlot`), the changelog writes it hands out (:class:`StateWrite`), and
the revoked runs it keeps aside until their deliveries are done (:class:`Departure`).
Pure bookkeeping: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.events import LineageEvent
from relay.state.records import DIGEST_BYTES, OUTBOX_LEFT_OUT, WHOLE, OutboxMark

#: Digests a run remembers for dedupe: the latest this many events' (a run that streams for
#: days would otherwise grow its state, re-written whole with each change, without bound,
#: and reach the broker's record size limit). Duplicates come close together.
SEEN_MAX = 256


class StateWrite:
    """One changelog record to produce; ``value`` None is a tombstone."""

    __slots__ = ("partition", "key", "value", "run_id", "slot", "tickets", "to_send", "final", "seq", "epoch",
                 "reduced")

    def __init__(self, partition: int, key: bytes, value: bytes | None, run_id: str, slot: RunSlot | None,
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


def by_seq(write: StateWrite) -> int:
    return write.seq


def settle_written(slot: RunSlot, write: StateWrite, send: Callable[[LineageEvent], None]) -> None:
    """Release the tickets of acknowledged ``write`` and ``send`` its events, after those
    of the failed writes before it that it carried (see :meth:`RunStateTable.written`)."""
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


class RunSlot:
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


def remember(slot: RunSlot, digest: bytes) -> None:
    seen = slot.seen + digest
    slot.seen = seen if len(seen) <= SEEN_MAX * DIGEST_BYTES else seen[-SEEN_MAX * DIGEST_BYTES:]


def has_seen(slot: RunSlot, digest: bytes) -> bool:
    """Whether ``slot``'s run remembers an event with ``digest``: found where a digest
    starts in ``seen``, not across two of them."""
    seen = slot.seen
    at = seen.find(digest)
    while at != -1:
        if at % DIGEST_BYTES == 0:
            return True
        at = seen.find(digest, at + 1)
    return False


def fill_marks(slot: RunSlot, event: LineageEvent) -> bool:
    """Put ``event`` (read again, with its source) in the place of its mark in ``slot``'s
    outbox, and drop the marks of its topic and partition below its offset (see
    :meth:`RunStateTable.refill`); whether any mark was replaced or dropped."""
    src = event.source
    swap: dict[int, LineageEvent | None] = {}
    for item in slot.outbox:
        if type(item) is OutboxMark and item.topic == src.topic and item.partition == src.partition:
            if item.offset == src.offset and item.digest == event.digest:
                swap[id(item)] = event
            elif item.offset < src.offset:
                swap[id(item)] = None
    if not swap:
        return False
    slot.outbox = [e for e in (swap.get(id(e), e) for e in slot.outbox) if e is not None] or ()
    slot.unsent = [e for e in (swap.get(id(e), e) for e in slot.unsent) if e is not None] or ()
    return True


def mark_left_out(slot: RunSlot) -> None:
    """Note the events of ``slot``'s outbox that a record written with the outbox left out
    marks (read from the run's partition, their tickets held): see :func:`keep_marked_ticket`."""
    partition, marked = slot.partition, slot.marked
    slot.marked = [*marked, *(e for e in slot.outbox if type(e) is not OutboxMark and e.ticket is not None
                              and e.source is not None and e.source.partition == partition
                              and not any(m is e for m in marked))] or ()


def keep_marked_ticket(slot: RunSlot, event: LineageEvent) -> bool:
    """Whether delivered ``event`` is one a record of ``slot``'s run marks: its ticket then
    waits for the run's next acknowledged write (see :meth:`RunStateTable.delivered`)."""
    if not slot.marked or not any(e is event for e in slot.marked):
        return False
    slot.marked = [e for e in slot.marked if e is not event] or ()
    slot.waiters = [*slot.waiters, event.ticket]
    return True


def hand_over(left_out: int | None, event: LineageEvent | OutboxMark) -> None:
    """Settle ``event``, which a revoked run's record holds (its new owner sends it); not
    one the record marks (read from the run's partition ``left_out``, its outbox left out):
    that partition's commits stop below it, and its new owner reads it again."""
    if type(event) is OutboxMark or event.ticket is None:
        return
    src = event.source
    if left_out is None or src is None or src.partition != left_out:
        event.ticket.release()


class Departure:
    """A revoked run with output under way or changes not written: its state when it was
    revoked, its slot (whose outbox deliveries still empty), whether to write it again."""

    __slots__ = ("slot", "state", "changed")

    def __init__(self, slot: RunSlot, state: dict[str, Any] | None, changed: bool) -> None:
        self.slot, self.state, self.changed = slot, state, changed
