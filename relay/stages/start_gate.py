"""START first, parent first: when a run's START goes out, and what it is.

:class:`StartGate` decides this for :class:`~relay.stages.consolidate.RunConsolidator` in
both holding modes (``consolidated`` and ``coalesce``); the consolidator captures a run's
events until the START is decided.

* START first: no START within ``missing_start_timeout_s`` of the run's first event:
  ``on_missing_start="synthesize"`` emits one from the earliest eventTime, run/job facets
  and inputs seen (outcome facets such as ``errorMessage`` left out), marked with
  :data:`SYNTHESIZED_START_FACET`; ``"forward"`` lets the run go on without one (its
  START is then ``skipped``).
* Parent first: a run with a ``parent`` run facet emits its START only after the parent's
  was emitted (or the parent finished or went on without one). An unseen parent is waited
  for ``parent_hold_s``; a seen parent still without START at most ``parent_hold_s +
  missing_start_timeout_s`` (this also breaks parent cycles). :attr:`StartGate.waiting`
  names the children waiting for each parent; whoever decides a parent's START (or ends
  the parent) lets them try again.

Pure: no clock (times are the caller's ``now``), no I/O; timers go on the
:class:`~relay.stages.known_runs.KnownRuns` heap.
"""

from __future__ import annotations

from relay.events import LineageEvent
from relay.stages.known_runs import KnownRuns
from relay.stages.merge import RunMerger
from relay.stages.run_state import EMITTED, SKIPPED, WAITING, Action, Forward, Release, RunRecord, built_event

#: Reason code of a START synthesized because none came in time (stable: in its facet).
MISSING_START_TIMEOUT = "missing_start_timeout"

RELAY_PRODUCER = "https://github.com/lineage-relay/lineage-relay"
#: Custom run facet on a START the relay made up (spec naming: prefix + camelCase).
SYNTHESIZED_START_FACET = "lineageRelay_synthesizedStart"
SYNTHESIZED_START_SCHEMA_URL = (
    f"{RELAY_PRODUCER}/blob/main/spec/facets/SynthesizedStartRunFacet.json#/$defs/SynthesizedStartRunFacet"
)
# Run facets describing an outcome, left out of a synthesized START.
_OUTCOME_RUN_FACETS = frozenset({"errorMessage"})


class StartGate:
    """Decides runs' STARTs; see the module docstring for the contract."""

    def __init__(self, known: KnownRuns, *, timeout_s: float, hold_s: float, synthesize: bool) -> None:
        self._known = known
        self._timeout_s = timeout_s
        self._hold_s = hold_s
        #: ``on_missing_start="synthesize"`` (else ``"forward"``).
        self.synthesize = synthesize
        #: STARTs made up under ``on_missing_start="synthesize"``.
        self.starts_synthesized = 0
        #: Parent id -> children whose START waits for it.
        self.waiting: dict[str, set[str]] = {}

    def try_start(self, run: RunRecord, now: float, arriving: LineageEvent | None, out: list[Action]) -> bool:
        """Emit the run's START (real or synthesized) if it is due and its parent allows;
        return whether the run's START is now decided."""
        if run.start_doc is None:
            due = run.first_seen + self._timeout_s
            if now < due:
                return False
            if not self.synthesize:
                self.skip(run)
                return True
            if run.ready_at is None:
                run.ready_at = due
        elif run.ready_at is None:
            run.ready_at = now
        if not self._parent_allows(run, now):
            if arriving is not None:
                out.append(Release(arriving))
            children = self.waiting.setdefault(run.parent, set())
            if run.run_id not in children:
                children.add(run.run_id)
                for deadline in (run.ready_at + self._hold_s, run.ready_at + self._hold_s + self._timeout_s):
                    if deadline > now:  # a due timer would be popped again in the same tick
                        self._known.push(deadline, run.run_id)
            return False
        out.append(self.emit_start(run, now, arriving, MISSING_START_TIMEOUT))
        return True

    def emit_start(self, run: RunRecord, now: float, arriving: LineageEvent | None, reason: str) -> Forward:
        """Mark the run started and return the Forward of its real or synthesized START
        (``reason`` goes in the synthesized START's facet)."""
        self.ungate(run)
        run.start, run.ready_at = EMITTED, None
        if arriving is not None:
            run.start_doc = None
            return Forward(arriving)
        if run.start_doc is not None:
            doc, run.start_doc = run.start_doc, None
            return Forward(built_event(doc, now))
        self.starts_synthesized += 1
        merged = run.merged
        if merged is None:
            merged = RunMerger()
            for at, doc in run.held:
                merged.add(doc, at)
        marker = {"_producer": RELAY_PRODUCER, "_schemaURL": SYNTHESIZED_START_SCHEMA_URL, "reason": reason}
        doc = merged.start_event(run_facets={SYNTHESIZED_START_FACET: marker}, omit_run_facets=_OUTCOME_RUN_FACETS)
        return Forward(built_event(doc, now))

    def skip(self, run: RunRecord) -> None:
        """The run goes on without a START (``on_missing_start="forward"``)."""
        run.start = SKIPPED
        self.ungate(run)

    def rejoin(self, run: RunRecord) -> None:
        """A restored ``run`` whose START was waiting for its parent waits again."""
        if run.start == WAITING and run.ready_at is not None and run.parent is not None:
            self.waiting.setdefault(run.parent, set()).add(run.run_id)

    def ungate(self, run: RunRecord) -> None:
        """The run no longer waits for its parent (started, skipped, ended or forgotten)."""
        if run.parent is not None:
            children = self.waiting.get(run.parent)
            if children is not None:
                children.discard(run.run_id)
                if not children:
                    del self.waiting[run.parent]

    def _parent_allows(self, run: RunRecord, now: float) -> bool:
        parent_id = run.parent
        known = self._known
        if parent_id is None or parent_id in known.closed:
            return True
        parent = known.open.get(parent_id)
        waited = now - run.ready_at
        if parent is None:
            return waited >= self._hold_s
        return parent.start != WAITING or waited >= self._hold_s + self._timeout_s
