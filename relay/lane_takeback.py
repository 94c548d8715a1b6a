"""What a :class:`~relay.lane.CollectorLane` gives back when partitions are revoked or lost.

The new owner of a partition reads again from its committed offset, so whatever this lane
holds of the partition's events and has not settled (queued, held, under way, being
dead-lettered) is taken back, and what forwarding them taught the lane's stages (their
digests, their runs' START or terminal) is undone: a copy read again, here or by another
replica, must be neither a duplicate nor after its run's terminal, or its offset would be
committed while the event reached nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from relay.events import LineageEvent
from relay.source.offsets import Partition

if TYPE_CHECKING:
    from relay.dispatch import RunOrderedDispatcher
    from relay.stages.dedupe import Deduper
    from relay.stages.run_route import RunRouter
    from relay.stages.sequence import RunSequencer
    from relay.state.table import RunStateTable


class PartitionTakeBack:
    """The lane's revoke/abort half (a mixin of :class:`~relay.lane.CollectorLane`, whose
    state it uses as declared here)."""

    table: RunStateTable | None
    former: RunStateTable | None
    _dispatcher: RunOrderedDispatcher
    _sequencer: RunSequencer | None
    _run_router: RunRouter | None
    _deduper: Deduper | None
    _moved_runs: set[str]
    _moved_former: set[str]
    _dead_lettering: dict[int, LineageEvent]

    def revoke(self, partitions: set[Partition]) -> int:
        """Drop queued and held events of revoked partitions (the new owner re-reads them),
        forget their runs' state (the new owner restores it), their digests and what the
        sequencer learnt from forwarding them, and the same for their dead letters not
        written yet, so that a re-read here is neither taken for a duplicate nor dropped as
        after the run's terminal."""
        forgotten: set[str] = set()
        former_gone: set[str] = set()
        if self.table is not None:
            forgotten, abandoned = self.table.revoke({p for _, p in partitions})
            for event in abandoned:
                self._dispatcher.forget_gate(event)
            self._forget(abandoned)  # an OTHER after its run's terminal went through the deduper
        former = self.former
        if former is not None:
            # Runs of a former mode (passthrough lanes): only their own output is taken back,
            # not the live events of those runs (the sequencer's, which are not in any state).
            # Their built events (no source) still under way are theirs too: waited for by
            # sending() and stopped by abort(), as a current-mode run's (see _moved).
            former_gone, abandoned = former.revoke({p for _, p in partitions})
            taken = {id(event) for event in abandoned}
            for event in abandoned:
                self._dispatcher.forget_gate(event)
            if taken:
                self._dispatcher.remove_where(lambda event: id(event) in taken)
        self._moved_runs = forgotten
        self._moved_former = former_gone
        owned_by_revoked = self._moved(partitions)
        dropped = self._dispatcher.remove_where(owned_by_revoked)
        if self._sequencer is not None:
            self._sequencer.rollback(dropped)   # forwarded, not delivered: offered again later
            dropped += self._sequencer.discard(owned_by_revoked)
        self._forget(dropped)
        self._take_back_dead_letters(owned_by_revoked)
        self._hand_over(dropped, partitions)
        undecided = 0
        if self._run_router is not None:
            # Held before any stage (nothing to forget); by partition only: they are in no
            # run state, so a moved run's held events stay held here.
            undecided = len(self._run_router.discard(
                lambda e: e.source is not None and (e.source.topic, e.source.partition) in partitions))
        return len(dropped) + undecided

    def _take_back_dead_letters(self, owned_by_revoked: Callable[[LineageEvent], bool]) -> None:
        """Dead letters of revoked partitions not written yet: those partitions' commits
        stop below them, so they are read again (maybe here), and what sending them on
        taught the sequencer and the deduper must not make that copy an after-terminal drop
        or a duplicate, whose offset would then be committed while the dead letter may never
        land. The write goes on (a second dead letter at worst)."""
        leaving = [event for event in self._dead_lettering.values() if owned_by_revoked(event)]
        for event in leaving:
            del self._dead_lettering[id(event)]
        if self._sequencer is not None:
            self._sequencer.rollback(leaving)
        self._forget(leaving)

    def _hand_over(self, events: list[LineageEvent], partitions: set[Partition]) -> None:
        """Events of moved runs read from a partition still assigned here: their run's
        state, whose outbox holds them (they were sent only once it was written), went with
        its own partition, whose new owner sends them. Nobody re-reads them, so their offsets
        are settled here, or that partition's commits would stop at them for good."""
        if not self._moved_runs:
            return
        for event in events:
            src = event.source
            if src is not None and event.ticket is not None and (src.topic, src.partition) not in partitions:
                event.ticket.release()

    def _moved(self, partitions: set[Partition]) -> Callable[[LineageEvent], bool]:
        """Whether an event belongs to ``partitions``, or to a run whose state the last
        :meth:`revoke` gave up (consolidated events built from run state have no source), or
        built (no source) from a former mode's run state the last :meth:`revoke` gave up (a
        passthrough lane's live events of such a run are in no state: they stay)."""
        moved_runs = self._moved_runs
        moved_former = self._moved_former

        def moved(event: LineageEvent) -> bool:
            src = event.source
            if src is None:
                return event.run_id in moved_runs or event.run_id in moved_former
            return (src.topic, src.partition) in partitions or event.run_id in moved_runs
        return moved

    def _forget(self, events: list[LineageEvent]) -> None:
        """Taken back before delivery: their digests are no longer "seen"."""
        if self._deduper is not None:
            for event in events:
                self._deduper.forget(event.digest)

    def sending(self, partitions: set[Partition]) -> int:
        """Events of ``partitions`` being delivered (handed to the collector, no verdict yet)."""
        return self._dispatcher.sending_where(self._moved(partitions))

    def abort(self, partitions: set[Partition]) -> int:
        """Stop delivering (no more retries) the events of ``partitions`` under way, after
        :meth:`revoke`: another member sends them again, and a retry of ours landing after
        its later events of the same run would break the run's order. Taken back like the
        queued ones (see :meth:`revoke`); returns how many."""
        moved = self._moved(partitions)
        aborted = self._dispatcher.abort_where(moved)
        if self._sequencer is not None:
            self._sequencer.rollback(aborted)
        self._forget(aborted)
        self._take_back_dead_letters(moved)  # refused by the collector while revoke waited
        self._hand_over(aborted, partitions)
        return len(aborted)
