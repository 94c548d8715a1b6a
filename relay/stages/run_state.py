"""What :class:`~relay.stages.consolidate.RunConsolidator` returns and what it keeps per run.

* The actions ``offer``/``tick`` return: :class:`Forward`, :class:`Release`, :class:`Drop`,
  :class:`Expired`.
* :class:`RunRecord`: one open run, and its save/restore as JSON data
  (:meth:`RunRecord.to_state` / :meth:`RunRecord.from_state`).
* :func:`built_event`: a LineageEvent for a document built from valid events.
* A closed run (finished, or expired while open) is remembered by its id and outcome
  only; :func:`closed_state` / :func:`read_closed_state` save and read that.

Saved states carry ``"v": STATE_VERSION``; a state of another version is refused with
ValueError, never half-read. Times in a state are the writer's ``now`` seconds; whoever
restores shifts them into its own clock. Pure data: no I/O, no clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import orjson

from relay.events import EVENT_TYPES, LineageEvent, Rejection
from relay.logs import log_event

# The same two actions as the sequencer's (one class each, so callers match them once).
from relay.stages.decisions import Drop, Forward  # noqa: F401 - re-exported
from relay.stages.decode import decode_record
from relay.stages.event_checks import content_digest, find_parent_run_id
from relay.stages.json_bytes import dumps, has_big_int
from relay.stages.merge import RunMerger
from relay.stages.merge import state_without_facets as merged_without_facets

log = logging.getLogger("relay.state")

STATE_VERSION = 1

# Where a run stands with its START.
WAITING, EMITTED, SKIPPED = "waiting", "emitted", "skipped"
#: Outcome of a run in the recently-closed set; else EMITTED/SKIPPED (expired while open).
FINISHED = "finished"
_OUTCOMES = (EMITTED, SKIPPED, FINISHED)
_TIME_SLOTS = frozenset({"first_seen", "touched", "ready_at", "settle_until", "running_until"})


@dataclass(frozen=True, slots=True)
class Release:
    """``event`` is captured in its run's state; settle its ticket once that is persisted."""

    event: LineageEvent


@dataclass(frozen=True, slots=True)
class Expired:
    """Run ``run_id`` left early (``run_ttl``/``max_open_runs``); the actions after it flush it."""

    run_id: str
    reason: str
    detail: str


Action: TypeAlias = Forward | Release | Drop | Expired


class RunRecord:
    """One open run. Times are the caller's ``now`` seconds; everything is JSON data."""

    __slots__ = ("run_id", "parent", "first_seen", "touched", "start", "start_doc", "ready_at",
                 "merged", "pending", "settle_until", "held", "running", "running_until")

    def __init__(self, run_id: str, now: float, start: str) -> None:
        self.run_id = run_id
        self.parent: str | None = None
        self.first_seen = now
        self.touched = now
        self.start = start
        self.start_doc: dict[str, Any] | None = None  # a real START waiting for its parent
        self.ready_at: float | None = None  # when a START became ready to emit
        self.merged: RunMerger | None = None  # consolidated: the whole run
        self.pending = 0  # events folded into ``merged`` and not yet emitted in any form
        self.settle_until: float | None = None
        self.held: list[list[Any]] = []  # coalesce, before the START decision: [micros, doc]
        self.running: RunMerger | None = None  # coalesce: RUNNINGs not yet emitted
        self.running_until: float | None = None

    def to_state(self) -> dict[str, Any]:
        """JSON data for ``orjson.dumps`` only (restore what went through JSON): event
        documents are embedded as ``orjson.Fragment``, written by :func:`dumps`. orjson
        writes at most 254 levels, and decode accepts events nested up to ``MAX_DEPTH``
        (which leaves room for the levels the record adds when it is read back); written by
        orjson, a deep event made every write of the record raise (and the relay stop,
        again after each restart). The JSON is the same as that of the documents
        themselves, so records written before read alike."""
        state = {slot: getattr(self, slot) for slot in self.__slots__}
        for slot in ("merged", "running"):
            state[slot] = state[slot].to_state() if state[slot] is not None else None
        if self.start_doc is not None:
            state["start_doc"] = orjson.Fragment(dumps(self.start_doc))
        state["held"] = [[at, orjson.Fragment(dumps(doc))] for at, doc in self.held]
        return {"v": STATE_VERSION, **state}

    @classmethod
    def from_state(cls, run_id: str, state: dict[str, Any], shift: float) -> RunRecord:
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"run state for {run_id} is not a version {STATE_VERSION} run state")
        run = cls(run_id, 0.0, WAITING)
        try:
            for slot in cls.__slots__[1:]:
                value = state[slot]
                if slot in ("merged", "running") and value is not None:
                    value = RunMerger.from_state(value)
                elif slot in _TIME_SLOTS and value is not None:
                    value = float(value) + shift
                setattr(run, slot, value)
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed run state for {run_id}: {err!r}") from err
        if run.start not in (WAITING, EMITTED, SKIPPED):
            raise ValueError(f"malformed run state for {run_id}: start={run.start!r}")
        return run

    def deadlines(self, timeout_s: float, hold_s: float) -> list[float]:
        times = [self.settle_until, self.running_until]
        if self.start == WAITING:
            times.append(self.first_seen + timeout_s)
            if self.ready_at is not None:
                times += [self.ready_at + hold_s, self.ready_at + hold_s + timeout_s]
        return [t for t in times if t is not None]


def state_without_facets(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A :meth:`RunRecord.to_state` output whose merged views (consolidated: the whole run;
    coalesce: the RUNNINGs not yet emitted) keep no facets (see
    :func:`relay.stages.merge.state_without_facets`); a closed run's state, or None, as it is.
    Where the run stands (its START, its timers, the events it holds) is kept."""
    if state is None or "closed" in state:
        return state
    return {**state, **{slot: merged_without_facets(state[slot])
                        for slot in ("merged", "running") if state.get(slot) is not None}}


def doc_without_facets(doc: dict[str, Any]) -> dict[str, Any]:
    """An event document a run built (a merged view, a synthesized START, a held event
    replayed) without its facets, as :func:`state_without_facets` keeps a merged view: its
    datasets by name, its run's ``parent`` facet kept (where the run belongs). What a run's
    record keeps of the events it has still to send when the whole outbox is too large."""
    out = dict(doc)
    run, job = doc.get("run"), doc.get("job")
    if isinstance(run, dict):
        facets = run.get("facets")
        parent = facets.get("parent") if isinstance(facets, dict) else None
        out["run"] = {**run, "facets": {"parent": parent} if parent is not None else {}}
    if isinstance(job, dict) and "facets" in job:
        out["job"] = {**job, "facets": {}}
    for side in ("inputs", "outputs"):
        datasets = doc.get(side)
        if isinstance(datasets, list):
            out[side] = [{k: v for k, v in d.items() if k not in _DATASET_FACETS} if isinstance(d, dict) else d
                         for d in datasets]
    return out


_DATASET_FACETS = frozenset({"facets", "inputFacets", "outputFacets"})


def closed_state(outcome: str, at: float) -> dict[str, Any]:
    """The saved form of a closed run: how it ended (``finished``, or expired open with its
    START ``emitted``/``skipped``) and when, in the writer's clock."""
    return {"v": STATE_VERSION, "closed": outcome, "at": at}


def read_closed_state(run_id: str, state: Any) -> tuple[str, float] | None:
    """``(outcome, at)`` of a :func:`closed_state`; None for an open run's state."""
    if not isinstance(state, dict) or "closed" not in state:
        return None
    if state.get("v") != STATE_VERSION or state["closed"] not in _OUTCOMES \
            or not isinstance(state.get("at"), (int, float)):
        raise ValueError(f"malformed closed-run state for {run_id}: {state!r}")
    return state["closed"], float(state["at"])


class _Settled:
    """The ticket of a built event standing for captured ones: nothing left to release."""

    __slots__ = ()

    def release(self) -> None:
        pass


#: Ticket of a :func:`settled_event`.
SETTLED = _Settled()


def settled_event(doc: dict[str, Any], now: float) -> LineageEvent:
    """:func:`built_event` for a captured event that is dropped after all (a :class:`Drop`
    carries it): its offset ticket was settled when the capture was persisted, so its
    ``ticket`` is :data:`SETTLED`, which a caller releases as any other."""
    event = built_event(doc, now)
    event.ticket = SETTLED
    return event


def built_event(doc: dict[str, Any], now: float) -> LineageEvent:
    """A LineageEvent (no ``ticket``, no ``source``) for a document built from valid events,
    or kept in run state, consumed at ``now``."""
    body = dumps(doc)
    event = decode_record(body, max_bytes=1 << 62)
    if not isinstance(event, LineageEvent):
        event = _as_kept(doc, body, event)
    event.consumed_at = now
    return event


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _as_kept(doc: dict[str, Any], body: bytes, why: Rejection) -> LineageEvent:
    """A document of run state that decode refuses: one an earlier version took (an
    ``eventTime`` with a space for ``T``, a dataset without a name...), restored from the
    state topic. It is sent as it is, for the collector to judge (a refusal dead-letters
    it), rather than raise at each restore or replay and stop the relay at every start."""
    log_event(log, logging.WARNING, "run_state_event_not_valid", reason=why.reason, detail=why.detail[:300])
    run, job = doc.get("run"), doc.get("job")
    run = run if isinstance(run, dict) else {}
    job = job if isinstance(job, dict) else {}
    run_id = run.get("runId")
    try:
        event_time = datetime.fromisoformat(str(doc.get("eventTime")).replace("Z", "+00:00"))
        if event_time.tzinfo is None:
            event_time = event_time.replace(tzinfo=UTC)
    except ValueError:
        event_time = _EPOCH
    event_type = doc.get("eventType")
    facets = run.get("facets")
    event = LineageEvent("run" if run else "dataset" if "dataset" in doc else "job", doc, body,
                         content_digest(dumps(doc, orjson.OPT_SORT_KEYS)), event_time,
                         run_id.lower() if isinstance(run_id, str) else None,
                         event_type if event_type in EVENT_TYPES else None, _text(job.get("namespace")),
                         _text(job.get("name")), find_parent_run_id(facets if isinstance(facets, dict) else None))
    event.big_int = has_big_int(body)  # as decode would mark it (a rare path: a scan is fine)
    return event


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
