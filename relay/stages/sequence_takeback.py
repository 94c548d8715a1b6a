"""What a :class:`~relay.stages.sequence.RunSequencer` gives back and unlearns when events
are taken back before delivery: the sequencer's part of :mod:`relay.lane_takeback` (and of
a record ``dlq redrive`` writes back, :meth:`relay.lane.CollectorLane.offer_again`). A
mixin of RunSequencer, whose state it uses as declared here.

Guarantees:

* :meth:`SequenceTakeBack.discard` returns every held event it removes, none decided (the
  caller hands them back), terminals waiting out their grace included (their run is then
  unknown again: read again, such a terminal waits for its START again). The remaining
  holds keep the order ``expire`` relies on (oldest hold first).
* :meth:`SequenceTakeBack.rollback` undoes what forwarding the given events taught the
  sequencer: a run whose START is among them is forgotten (what is read again is held
  until its START, and so is its early terminal waiting out its grace, if any), a run whose
  terminal is among them is open again. A copy read again, here or by another replica, is
  then not dropped as ``after_terminal`` because of them (which would commit its offset
  while it reached nothing).
* Runs the given events do not touch are left as they are.
* :meth:`SequenceTakeBack.redriven` readies the sequencer for a record ``dlq redrive
  --to-topic`` wrote back, before it is offered: the operator wants it delivered. A START
  begins its run again and a terminal opens its run again (as :meth:`rollback`); any other
  record of a run the sequencer does not know (forgotten ``finished_ttl_s`` after its
  terminal, or by a restart) finds its run started, and so does a terminal of such a run:
  its START was forwarded long before (it was dead-lettered after the sequencer let it go,
  or the operator sends it without its START all the same). It is then never held for that
  START (to be dead-lettered again as ``hold_timeout``, or sent ``hold_timeout_s`` late),
  nor dropped as ``after_terminal`` because a search further back found its run's START and
  the original it copies. A run held here is released ahead of the record: its held
  non-terminals are forwarded, its earliest held terminal waits out ``terminal_grace_s``
  (until the next ``expire`` at least) behind the record, and a START arriving meanwhile
  is forwarded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from relay.events import LineageEvent

if TYPE_CHECKING:
    from relay.stages.decisions import Decision
    from relay.stages.sequence import RunHold


#: A grace that ends at the next expire (a terminal parked behind the record offered next).
_UNTIL_NEXT_EXPIRE = 1e-9


class SequenceTakeBack:
    """The take-back half of :class:`~relay.stages.sequence.RunSequencer`."""

    _grace: OrderedDict[str, tuple[LineageEvent, float]]
    _holds: OrderedDict[str, RunHold]
    _held_count: int
    _runs: OrderedDict[str, float | None]
    _finished: OrderedDict[str, float]
    _terminal_grace_s: float
    _primed_early: OrderedDict[str, float]

    def _hold_again(self, run_id: str, terminal: LineageEvent, since: float) -> None: ...
    def _start(self, run_id: str) -> None: ...
    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> list[Decision]: ...
    def _release_in_order(self, run_id: str, events: list[LineageEvent], now: float,
                          grace_s: float = 0.0) -> list[Decision]: ...

    def redriven(self, event: LineageEvent, now: float) -> list[Decision]:
        """Ready the sequencer for ``event``, a record ``dlq redrive --to-topic`` wrote back,
        before it is offered (see the module docstring); returns the decisions that became
        due (a hold released ahead of it)."""
        run_id = event.run_id
        if run_id is None:
            return []
        if event.event_type == "START":
            self.rollback([event])
            return []
        if event.is_terminal:
            self.rollback([event])
        if run_id in self._runs:
            return []
        # Its run began before (the record was forwarded, or the operator sends it as is):
        # a terminal the look-back read of it is the original this record copies.
        self._primed_early.pop(run_id, None)
        hold = self._holds.pop(run_id, None)
        self._start(run_id)
        if hold is None:
            return []
        # Held here: its held non-terminals go ahead of the record (offered next), its
        # earliest held terminal waits out terminal_grace_s (until the next expire at least)
        # behind it. Released at once, the terminal ended the run, and the record (and a
        # START still to come, if it had not gone out) was dropped as after_terminal.
        self._held_count -= len(hold.events)
        return self._release_in_order(run_id, hold.events, now, max(self._terminal_grace_s, _UNTIL_NEXT_EXPIRE))

    def discard(self, predicate: Callable[[LineageEvent], bool]) -> list[LineageEvent]:
        """Remove held events matching ``predicate`` without deciding them and return
        them, e.g. on partition revoke, where the new owner will receive them again."""
        removed: list[LineageEvent] = []
        reorder = False
        for run_id, hold in list(self._holds.items()):
            matches = [predicate(event) for event in hold.events]
            if not any(matches):
                continue
            removed += (event for event, hit in zip(hold.events, matches) if hit)
            if all(matches):
                del self._holds[run_id]
                continue
            reorder = reorder or matches[0]
            hold.events = [e for e, hit in zip(hold.events, matches) if not hit]
            hold.arrivals = [t for t, hit in zip(hold.arrivals, matches) if not hit]
        self._held_count -= len(removed)
        for run_id, (terminal, _until) in list(self._grace.items()):
            if predicate(terminal):
                del self._grace[run_id]
                removed.append(terminal)
                # Read again, it must wait for its START again, not find the run open
                # and go ahead of the run's events read again after it.
                self._runs.pop(run_id, None)
                self._finished.pop(run_id, None)
        if reorder:
            # A hold now begins later; keep _holds sorted by hold start for expire().
            self._holds = OrderedDict(sorted(self._holds.items(), key=lambda kv: kv[1].since))
        return removed

    def rollback(self, released: list[LineageEvent]) -> None:
        """Undo what forwarding ``released`` recorded: they were forwarded, then taken back
        before delivery (their partition revoked or lost), and will be offered again when
        it is read again, here or by another replica. A run whose START is among them is
        forgotten (it begins afresh: what is read again is held until its START); a run
        whose terminal is among them is open again. Without this, a partition assigned
        back to this replica would have those events dropped as ``after_terminal`` and
        their offsets committed: lost."""
        for event in released:
            run_id = event.run_id
            if run_id is None or run_id not in self._runs:
                continue
            if event.event_type == "START":
                del self._runs[run_id]
                self._finished.pop(run_id, None)
                waiting = self._grace.pop(run_id, None)
                if waiting is not None:
                    # Its early terminal (from a partition not taken back) must not go out
                    # ahead of the START read again: it waits for it again, held since the
                    # START let it go.
                    terminal, until = waiting
                    self._hold_again(run_id, terminal, until - self._terminal_grace_s)
            elif event.is_terminal and self._runs[run_id] is not None:
                self._runs[run_id] = None
                self._finished.pop(run_id, None)
