"""What the per-run ordering stages decide about an event, for the caller to carry out.

:class:`~relay.stages.sequence.RunSequencer` returns :data:`Decision` values;
:class:`~relay.stages.run_route.RunRouter` and the run consolidator
(:mod:`relay.stages.run_state`) return the same :class:`Forward` and :class:`Drop`, so a
caller tells them apart once, by class. Plain frozen data, built per event: no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from relay.events import LineageEvent

# Decision reason codes: stable, used as the dead-letter header and a metric label.
AFTER_TERMINAL = "after_terminal"
HOLD_TIMEOUT = "hold_timeout"
HOLD_OVERFLOW = "hold_overflow"


@dataclass(frozen=True, slots=True)
class Forward:
    """Send ``event`` to the collector now (``event.ticket is None`` when the run
    consolidator built it)."""

    event: LineageEvent


@dataclass(frozen=True, slots=True)
class Drop:
    """Do not send ``event``; it is accounted for under ``reason`` (``after_terminal``)."""

    event: LineageEvent
    reason: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Send ``event`` to the dead-letter topic with ``reason`` (``hold_timeout`` or
    ``hold_overflow``) and the human ``detail``."""

    event: LineageEvent
    reason: str
    detail: str


Decision: TypeAlias = Forward | Drop | DeadLetter
