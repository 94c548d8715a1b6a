"""What the relay would have sent one collector for a finite set of events, as chains.

The operator commands (``replay``, ``dlq redrive``) hold a whole range of events; these
functions turn it into *chains* (one per run, one per event without a run) by running it
through the same per-run stage the relay runs for that collector, not a copy of its rules:

* :func:`plan`: the relay's :class:`~relay.stages.sequence.RunSequencer` (``passthrough``
  collectors with ``pipeline.ordering.enabled``).
* :func:`plan_for`: the collector's delivery mode: :func:`plan`, or for ``consolidated`` and
  ``coalesce`` the relay's :class:`~relay.stages.consolidate.RunConsolidator` (START plus
  one merged terminal per run; RUNNINGs merged).

The events are offered in source order (topic, partition, offset) with one clock reading
for all of them, as when the relay reads the range as a backlog, all at once: windows the
relay counts in seconds (``terminal_grace_s``, ``settle_s``, ``coalesce_window_s``) take in
the whole range; then the clock is moved past every timer, so nothing is left held. A run
without a START in the range (cut by its start) is not held back for ever: passthrough,
its events follow in run order as with ``on_hold_timeout: forward`` (a range boundary is
no reason to dead-letter); consolidated/coalesce, the collector's ``missing_start``
policy applies, as in the relay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.config import CollectorConfig, OrderingConfig
from relay.events import LineageEvent
from relay.stages.consolidate import RunConsolidator
from relay.stages.decisions import AFTER_TERMINAL, Drop, Forward
from relay.stages.sequence import RunSequencer

__all__ = ["AFTER_TERMINAL", "Plan", "plan", "plan_for"]

#: The one clock reading at which the whole range is offered.
_NOW = 0.0
#: Beyond every timer the stages set (their knobs are bounded well below this).
_LATER = 1e12


def _position(event: LineageEvent) -> tuple[str, int, int]:
    src = event.source
    return (src.topic, src.partition, src.offset) if src is not None else ("", -1, -1)


@dataclass
class Plan:
    chains: list[list[LineageEvent]]
    #: Events left out, with the reason (``after_terminal``).
    dropped: list[tuple[LineageEvent, str]] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(len(chain) for chain in self.chains)


class _Chains:
    """Forwarded events grouped into chains, in the order they were forwarded."""

    def __init__(self) -> None:
        self.chains: list[list[LineageEvent]] = []
        self.dropped: list[tuple[LineageEvent, str]] = []
        self._runs: dict[str, list[LineageEvent]] = {}

    def forward(self, event: LineageEvent) -> None:
        if event.run_id is None:
            self.chains.append([event])
            return
        chain = self._runs.get(event.run_id)
        if chain is None:
            chain = self._runs[event.run_id] = []
            self.chains.append(chain)
        chain.append(event)

    def take(self, decisions: Iterable[object]) -> None:
        for decision in decisions:
            kind = type(decision)
            if kind is Forward:  # the sequencer's and the consolidator's (the same classes)
                self.forward(decision.event)
            elif kind is Drop:
                self.dropped.append((decision.event, decision.reason))
            # Release (captured: folded or sent later as a built event) and
            # Expired (the range ended with the run open) carry nothing to send.


def plan(events: Iterable[LineageEvent], *, ordered: bool = True,
         ordering: OrderingConfig | None = None) -> Plan:
    """Group ``events`` into chains as the relay's sequencer would forward them.

    With ``ordered`` (the relay's ``pipeline.ordering.enabled``), each run goes through a
    :class:`RunSequencer` with ``ordering``'s ``terminal_grace_s`` and
    ``forward_other_after_terminal``. Its rule, as the relay applies it: events before the
    run's START wait for it, then follow it (non-terminal by ``eventTime``, then the
    earliest terminal, which with a grace also comes after the run's events read while it
    waits; a later-timed terminal is dropped); once the START is forwarded, events go in
    source order and the run's first terminal in source order ends it: every later event
    of the run is dropped (``after_terminal``) but OTHER (when forwarded after terminal).
    Without ``ordered`` nothing is dropped and a run's chain keeps source order.
    Events without a run each make their own chain. Dedupe is the caller's business.
    """
    ordering = ordering if ordering is not None else OrderingConfig()
    source = sorted(events, key=_position)
    out = _Chains()
    if not ordered:
        for event in source:
            out.forward(event)
        return Plan(out.chains)
    bound = len(source) + 1  # nothing forgotten, nothing released for memory
    sequencer = RunSequencer(hold_timeout_s=_LATER / 2, on_hold_timeout="forward", max_held_events=bound,
                             max_tracked_runs=bound, finished_ttl_s=_LATER / 2,
                             terminal_grace_s=ordering.terminal_grace_s,
                             forward_other_after_terminal=ordering.forward_other_after_terminal)
    for event in source:
        out.take(sequencer.offer(event, _NOW))
    out.take(sequencer.expire(_LATER))  # early terminals' grace, then runs never started
    return Plan(out.chains, out.dropped)


def plan_for(events: Iterable[LineageEvent], collector: CollectorConfig, *, ordered: bool = True,
             ordering: OrderingConfig | None = None) -> Plan:
    """:func:`plan` by the collector's delivery mode: ``passthrough`` is :func:`plan`;
    ``consolidated`` and ``coalesce`` go through a :class:`RunConsolidator` with the
    collector's ``consolidation`` settings (the relay's pipeline ordering does not apply
    to them there either). Built events (the merged terminal, a merged RUNNING, a
    synthesized START) have no ``source``. RunEvents need their ``doc``."""
    if collector.mode == "passthrough":
        return plan(events, ordered=ordered, ordering=ordering)
    k = collector.consolidation
    consolidator = RunConsolidator(
        mode=collector.mode, settle_s=k.settle_s, coalesce_window_s=k.coalesce_window_s,
        missing_start_timeout_s=k.missing_start.timeout_s, on_missing_start=k.missing_start.policy,
        parent_hold_s=k.parent_hold_s, max_open_runs=k.max_open_runs, run_ttl_s=k.run_ttl_s,
        max_finished_runs=k.max_finished_runs, finished_ttl_s=k.finished_ttl_s)
    out = _Chains()
    for event in sorted(events, key=_position):
        out.take(consolidator.offer(event, _NOW))
    # Past every timer: STARTs decided (parent or not), settled terminals and merged
    # RUNNINGs emitted; a run still open (cut by the range's end) expires, flushing what
    # it holds. Emitting can set a timer (a merged RUNNING's window): tick until none is open.
    later = _LATER
    for _ in range(8):
        out.take(consolidator.tick(later))
        if not consolidator.open_runs:
            break
        later *= 2
    return Plan(out.chains, out.dropped)
