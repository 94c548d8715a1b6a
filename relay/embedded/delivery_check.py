"""What the demo's collector received, checked against what was sent: the demo says the
relay worked only when this finds nothing missing.

Pure: plain events in, a :class:`DeliveryReport` out. An event is matched by its run,
type, time and job (the relay may rewrite a body, never those); exact duplicates among
the sent events count once (the relay's dedupe holds them back by design).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

TERMINAL = frozenset({"COMPLETE", "FAIL", "ABORT"})
#: Runs named in a problem's line, at most.
SHOWN = 5


@dataclass(frozen=True)
class DeliveryReport:
    #: Distinct events sent (exact duplicates counted once).
    unique_sent: int
    #: Of those, how many the collector did not receive.
    missing: int
    #: Events the relay did not forward for a named reason (dropped, dead-lettered).
    not_forwarded: int
    #: Runs whose START was sent but did not arrive first.
    start_not_first: tuple[str, ...]
    #: Runs whose terminal event was sent that did not get exactly one: (run id, how many arrived).
    terminal_count_wrong: tuple[tuple[str, int], ...]
    #: Runs whose START or terminal event never arrived while every missing event is
    #: accounted for (``not_forwarded``): the relay dropped or dead-lettered it for a reason.
    excused: tuple[str, ...] = ()

    @property
    def unaccounted(self) -> int:
        """Missing events no named reason covers."""
        return max(0, self.missing - self.not_forwarded)

    @property
    def ok(self) -> bool:
        return not (self.unaccounted or self.start_not_first or self.terminal_count_wrong)

    def problems(self) -> list[str]:
        """One line per problem found (none when :attr:`ok`)."""
        lines = []
        if self.unaccounted:
            lines.append(f"{self.unaccounted} of {self.unique_sent} unique events sent never reached the collector "
                         f"({self.missing} missing, {self.not_forwarded} of them accounted for as dropped or "
                         "dead-lettered)")
        if self.start_not_first:
            lines.append(f"{len(self.start_not_first)} runs without their START first: "
                         f"{_some([f'run …{run[-8:]}' for run in self.start_not_first])}")
        if self.terminal_count_wrong:
            shown = [f"run …{run[-8:]} ({n} arrived)" for run, n in self.terminal_count_wrong]
            lines.append(f"{len(shown)} runs without exactly one terminal event: {_some(shown)}")
        return lines

    def verdict(self) -> str:
        """The line that says the check passed (when :attr:`ok`), naming the runs :attr:`excused`
        rather than claiming every run whole."""
        line = (f"every one of the {self.unique_sent} unique events sent reached the collector"
                + (f" or was accounted for ({self.missing} dropped or dead-lettered)" if self.missing else "")
                + "; every run's START came first and exactly one terminal event arrived")
        if self.excused:
            line += (f", except {len(self.excused)} runs whose START or terminal event was dropped or "
                     f"dead-lettered: {_some([f'run …{run[-8:]}' for run in self.excused])}")
        return line

    def notes(self) -> list[str]:
        """What :attr:`ok` let pass: the runs :attr:`excused`."""
        if not self.excused:
            return []
        return [f"{len(self.excused)} runs without their START or terminal event, accounted for as dropped or "
                f"dead-lettered: {_some([f'run …{run[-8:]}' for run in self.excused])}"]


def _some(items: list[str]) -> str:
    """The first :data:`SHOWN` of ``items`` (UUIDv7 run ids share their leading digits: the tail tells them apart)."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def _key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    job = event.get("job") or {}
    return ((event.get("run") or {}).get("runId"), event.get("eventType"), event.get("eventTime"),
            job.get("namespace"), job.get("name"))


def check_delivery(sent: Iterable[Mapping[str, Any]], received: Iterable[Mapping[str, Any]], *,
                   not_forwarded: int = 0) -> DeliveryReport:
    """``received`` in the order the collector took it; ``not_forwarded``: events the relay
    counted as dropped or dead-lettered (their reasons are its metrics'). A run whose START
    (or terminal event) never arrived is excused (:attr:`DeliveryReport.excused`) when
    ``not_forwarded`` covers every missing event: a count names no event, so the excuse
    holds only while none is unaccounted for. One that arrived out of order, or more than
    once, is never excused."""
    unique = {orjson.dumps(e, option=orjson.OPT_SORT_KEYS): e for e in sent}.values()
    expected = Counter(_key(e) for e in unique)
    arrived: list[tuple[Any, ...]] = [_key(e) for e in received]
    missing = sum((expected - Counter(arrived)).values())
    by_run: dict[Any, list[str]] = {}
    for run_id, event_type, *_ in arrived:
        by_run.setdefault(run_id, []).append(event_type)
    sent_types: dict[Any, set[str]] = {}
    for run_id, event_type, *_ in expected:
        if run_id is not None:
            sent_types.setdefault(run_id, set()).add(event_type)
    accounted = missing <= not_forwarded
    start_not_first, terminals, excused = [], [], []
    for run_id, types in sent_types.items():
        got = by_run.get(run_id, [])
        start_wrong = "START" in types and (not got or got[0] != "START")
        n = sum(t in TERMINAL for t in got)
        terminal_wrong = bool(types & TERMINAL) and n != 1
        # Only what never arrived is excused, and only in a run with nothing else wrong: a
        # terminal event that arrived twice names the run a problem, its missing START too.
        excusable = accounted and (not start_wrong or "START" not in got) and (not terminal_wrong or n == 0)
        if (start_wrong or terminal_wrong) and excusable:
            excused.append(str(run_id))
            continue
        if start_wrong:
            start_not_first.append(str(run_id))
        if terminal_wrong:
            terminals.append((str(run_id), n))
    return DeliveryReport(len(unique), missing, not_forwarded, tuple(start_not_first), tuple(terminals),
                          tuple(excused))
