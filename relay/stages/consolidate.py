"""Delivery modes for one collector: whole runs (``consolidated``) or fewer RUNNINGs (``coalesce``).

:class:`RunConsolidator` is pure: ``offer(event, now)`` and ``tick(now)`` return actions for
the caller to carry out; time moves only with ``now`` (seconds, never going backwards).

* ``passthrough``: every event is forwarded at once; nothing is held.
* ``consolidated``: a run reaches the collector as its START (when it arrives) and ONE
  terminal carrying the union of all the run said (:meth:`RunMerger.consolidated_event`);
  RUNNING/OTHER are folded in, not sent. The first terminal opens a ``settle_s`` window
  whose later terminals and facets are merged; the first ``tick`` at or after its end
  emits the terminal, never before the run's START decision.
* ``coalesce``: passthrough, except that a run's RUNNINGs merge into one, emitted
  ``coalesce_window_s`` after the first of them or, at the latest, just before the terminal.
  A START after the run's START went out (real or synthesized) is merged like a RUNNING:
  its facets go on, a second START does not. Events held for the START are replayed by
  eventTime once it is decided, by the same rules: after the first terminal, only OTHERs
  go on; held STARTs, RUNNINGs and terminals are dropped (``after_terminal``).

In both holding modes:

* START first: events before their run's START are captured. When the START goes out
  (real or synthesized after ``missing_start_timeout_s``, parent first): see
  :mod:`relay.stages.start_gate`.
* Capture: an event not forwarded as itself gets :class:`Release`; it is in the run's
  :meth:`~RunConsolidator.to_state`, so its ticket may be settled once that is persisted.
  Built events (terminal, merged RUNNING, synthesized START, replayed captures) are new
  LineageEvents without ``ticket``/``source``; ``body`` holds the same JSON, not the same bytes
  (integers beyond 64 bits included, exactly: ``offer`` reads an event holding one again,
  one decode marked ``big_int``; built events are decoded, so they are marked alike).
  A captured event dropped later is a :class:`Drop` of such an event whose ``ticket`` is
  :data:`~relay.stages.run_state.SETTLED` (its own was released by the capture).
* Finished runs keep only their id, in a set bounded by ``max_finished_runs`` and
  ``finished_ttl_s`` (:mod:`relay.stages.known_runs`). A late event of one is dropped
  (``after_terminal``), except an OTHER in coalesce mode (the spec allows OTHER after the
  terminal); it never opens a new run.
* Expiry: opening a run beyond ``max_open_runs`` expires the least recently active one;
  ``tick`` expires runs idle for ``run_ttl_s``. :class:`Expired` comes first (counted in
  ``runs_expired``), then what the run held, so nothing captured is lost: its START if
  none was emitted (the held one, else synthesized unless the policy is ``forward``; the
  parent is no longer waited for); consolidated: the consolidated terminal if one was
  seen, else the merged view as one RUNNING if anything was folded in since the START;
  coalesce: the captured events by eventTime and the pending merged RUNNING. A run expired
  before its terminal stays known as open: later events restart it without another START.

Persistence: :meth:`~RunConsolidator.to_state` covers open runs and closed ones still
remembered (so a restored consolidator still drops a finished run's late events); see
:mod:`relay.stages.run_state` for the saved forms. An open run's state saved in another mode
(the collector's mode changed since) is taken over (:meth:`~RunConsolidator.take_over`): it is
flushed as an expiry flushes a run (``mode_changed``), and the run goes on in this mode.

Not guaranteed: order across runs beyond parent-first; durability (persist ``to_state``
before settling released tickets). A RunEvent without ``eventType`` counts as OTHER.
"""

from __future__ import annotations

import heapq
from typing import Any, Literal

from relay.events import TERMINAL_TYPES, LineageEvent
from relay.stages.json_bytes import dumps, exact
from relay.stages.knobs import check_choice, check_count, check_seconds
from relay.stages.known_runs import KnownRuns
from relay.stages.merge import RunMerger, epoch_micros
from relay.stages.run_state import (  # noqa: F401 - Action and the actions are re-exported
    EMITTED,
    FINISHED,
    SKIPPED,
    WAITING,
    Action,
    Drop,
    Expired,
    Forward,
    Release,
    RunRecord,
    built_event,
    closed_state,
    read_closed_state,
    settled_event,
)
from relay.stages.start_gate import StartGate

Mode = Literal["passthrough", "consolidated", "coalesce"]
MissingStartPolicy = Literal["synthesize", "forward"]

# Reason codes: stable, used as metric labels and in the synthesized START facet
# (with relay.stages.start_gate.MISSING_START_TIMEOUT).
AFTER_TERMINAL = "after_terminal"
RUN_TTL = "run_ttl"
MAX_OPEN_RUNS = "max_open_runs"
MODE_CHANGED = "mode_changed"
# Event types that never reach a collector after their run's terminal (OTHER may).
_NOT_AFTER_TERMINAL = frozenset({"START", "RUNNING", *TERMINAL_TYPES})


class RunConsolidator:
    """Applies one collector's delivery mode; see the module docstring for the contract."""

    def __init__(
        self,
        *,
        mode: Mode,
        settle_s: float = 2.0,
        coalesce_window_s: float = 10.0,
        missing_start_timeout_s: float = 30.0,
        on_missing_start: MissingStartPolicy = "synthesize",
        parent_hold_s: float = 5.0,
        max_open_runs: int = 10_000,
        run_ttl_s: float = 3600.0,
        max_finished_runs: int = 10_000,
        finished_ttl_s: float = 3600.0,
    ) -> None:
        self.mode: Mode = check_choice("mode", mode, ("passthrough", "consolidated", "coalesce"))
        synthesize = check_choice("on_missing_start", on_missing_start, ("synthesize", "forward")) == "synthesize"
        self._settle_s = check_seconds("settle_s", settle_s, zero_ok=True)
        self._window_s = check_seconds("coalesce_window_s", coalesce_window_s)
        self._timeout_s = check_seconds("missing_start_timeout_s", missing_start_timeout_s)
        self._hold_s = check_seconds("parent_hold_s", parent_hold_s, zero_ok=True)
        self._ttl_s = check_seconds("run_ttl_s", run_ttl_s)
        finished_ttl_s = check_seconds("finished_ttl_s", finished_ttl_s)
        self._max_open = check_count("max_open_runs", max_open_runs)
        max_finished_runs = check_count("max_finished_runs", max_finished_runs)
        #: Runs that left the state by ``run_ttl`` or ``max_open_runs``.
        self.runs_expired = 0
        self._known = KnownRuns(max_closed=max_finished_runs, closed_ttl_s=finished_ttl_s)
        self._gate = StartGate(self._known, timeout_s=self._timeout_s, hold_s=self._hold_s, synthesize=synthesize)

    @property
    def starts_synthesized(self) -> int:
        """STARTs made up under ``on_missing_start="synthesize"``."""
        return self._gate.starts_synthesized

    @property
    def open_runs(self) -> int:
        return len(self._known.open)

    @property
    def finished_runs(self) -> int:
        """Run ids remembered as recently finished (or expired)."""
        return len(self._known.closed)

    def finished(self, run_id: str) -> bool:
        """Whether ``run_id`` is remembered as finished (its terminal went out): an event of
        it is dropped, or (an OTHER in coalesce mode) forwarded as itself."""
        recent = self._known.closed.get(run_id)
        return recent is not None and recent[1] == FINISHED

    @property
    def state_bytes(self) -> int:
        """Approximate JSON size of all open runs' state (walks every run: for metrics)."""
        size = 0
        for run in self._known.open.values():
            size += sum(m.size_bytes for m in (run.merged, run.running) if m is not None)
            size += sum(len(dumps(doc)) for doc in (run.start_doc, *(d for _, d in run.held)) if doc)
        return size

    def offer(self, event: LineageEvent, now: float) -> list[Action]:
        """Take one event; return every action that became due (for any run)."""
        run_id = event.run_id
        if self.mode == "passthrough" or run_id is None or event.kind != "run":
            return [Forward(event)]
        out: list[Action] = []
        known = self._known
        known.sort_if_restored()
        runs = known.open
        run = runs.get(run_id)
        if run is not None:
            runs.move_to_end(run_id)
        else:
            recent = known.closed.get(run_id)
            if recent is not None and recent[1] == FINISHED:
                if self.mode == "coalesce" and event.event_type == "OTHER":
                    return [Forward(event)]
                return [Drop(event, AFTER_TERMINAL)]
            while len(runs) >= self._max_open:
                oldest = next(iter(runs.values()))
                out += self._expire(oldest, now, MAX_OPEN_RUNS,
                                    f"more than max_open_runs={self._max_open} open runs; least recently active")
            if recent is not None:  # expired while open: its START is already decided
                known.closed.pop(run_id, None)
            run = RunRecord(run_id, now, recent[1] if recent is not None else WAITING)
            if self.mode == "consolidated":
                run.merged = RunMerger()
            runs[run_id] = run
            if run.start == WAITING:
                known.push(now + self._timeout_s, run_id)
        run.touched = now
        if run.parent is None and event.parent_run_id and event.parent_run_id != run_id:
            run.parent = event.parent_run_id
        if event.big_int and event.doc is not None:
            # Merged and held documents are rebuilt: with their integers beyond 64 bits
            # exact, not the nearest floats of a tree orjson parsed again (the lanes do).
            found = exact(event.body)
            if found is not None:
                event.doc = found
        if self.mode == "consolidated":
            out += self._offer_consolidated(run, event, now)
        else:
            out += self._offer_coalesce(run, event, now)
        return out

    def _offer_consolidated(self, run: RunRecord, event: LineageEvent, now: float) -> list[Action]:
        run.merged.add_event(event)
        if event.event_type == "START" and run.start != EMITTED and run.start_doc is None:
            run.start_doc = event.doc
            if run.start == SKIPPED:  # a late real START still goes before the terminal
                run.start, run.ready_at = WAITING, now
            return self._advance(run, now, arriving=event)
        run.pending += 1
        if event.is_terminal and run.settle_until is None:
            run.settle_until = now + self._settle_s
            self._known.push(run.settle_until, run.run_id)
        return [Release(event)]

    def _offer_coalesce(self, run: RunRecord, event: LineageEvent, now: float) -> list[Action]:
        if run.start == WAITING:
            if event.event_type == "START" and run.start_doc is None:
                run.start_doc = event.doc
                return self._advance(run, now, arriving=event)
            run.held.append([epoch_micros(event.event_time), event.doc])
            return [Release(event)]
        if event.event_type == "START" and run.start == SKIPPED:  # the run went on without one
            run.start = EMITTED
            return [Forward(event)]
        if event.event_type == "RUNNING" or event.event_type == "START":
            # A START after the run's START went out (real or synthesized) would be a second
            # one: only what it says goes on, in the merged RUNNING (as consolidated mode
            # folds it into the terminal).
            self._add_running(run, event.doc, epoch_micros(event.event_time), now)
            return [Release(event)]
        if event.is_terminal:
            out = self._flush_running(run, now)
            out.append(Forward(event))
            return out + self._finish(run, now, FINISHED)
        return [Forward(event)]

    def tick(self, now: float) -> list[Action]:
        """Emit whatever timers have made due, expire idle runs (``run_ttl_s``) and forget
        finished runs older than ``finished_ttl_s``."""
        out: list[Action] = []
        known = self._known
        known.sort_if_restored()
        timers = known.timers
        while timers and timers[0][0] <= now:
            _, run_id = heapq.heappop(timers)
            run = known.open.get(run_id)
            if run is not None:
                out += self._advance(run, now)
        while known.open:
            run = next(iter(known.open.values()))
            if now - run.touched < self._ttl_s:
                break
            out += self._expire(run, now, RUN_TTL, f"no event for run_ttl_s={self._ttl_s:g}s")
        known.forget_old_closed(now)
        return out

    # -- persistence ------------------------------------------------------------------

    def to_state(self, run_id: str) -> dict[str, Any] | None:
        """The run's state as JSON data for ``orjson.dumps`` (serialise it, do not mutate
        it; :meth:`restore` takes it read back from that JSON): an open run's
        whole state, a remembered closed run's outcome, or None when the run is not known
        (never seen, or forgotten by ``max_finished_runs``/``finished_ttl_s``: a persisted
        state can go)."""
        known = self._known
        run = known.open.get(run_id)
        if run is not None:
            return run.to_state()
        closed = known.closed.get(run_id)
        return closed_state(closed[1], closed[0]) if closed is not None else None

    def restore(self, run_id: str, state: dict[str, Any], now: float | None = None) -> None:
        """Reopen a run from :meth:`to_state` output, replacing any state of it. With
        ``now``, its timers shift as if its last event came at ``now`` (for clocks that do
        not survive restarts); a closed run counts as closed at ``now``. ``max_open_runs``
        applies from the next opened run. Raises ValueError for a state this mode and
        version cannot read."""
        if self.mode == "passthrough":
            raise ValueError("passthrough mode keeps no run state to restore")
        closed = read_closed_state(run_id, state)
        if closed is not None:
            self.forget(run_id)
            self._known.remember_closed(run_id, closed[0], closed[1] if now is None else now)
            return
        touched = state.get("touched") if isinstance(state, dict) else None
        shift = 0.0 if now is None or not isinstance(touched, (int, float)) else now - touched
        run = RunRecord.from_state(run_id, state, shift)
        if (run.merged is None) == (self.mode == "consolidated"):
            raise ValueError(f"run state for {run_id} was not written in {self.mode!r} mode")
        self.forget(run_id)
        self._known.reopen(run)
        self._gate.rejoin(run)
        for deadline in run.deadlines(self._timeout_s, self._hold_s):
            self._known.push(deadline, run_id)

    def reads(self, state: Any) -> bool:
        """Whether :meth:`restore` takes ``state`` as it is: a closed run's, or an open run's
        saved in this mode; else it is :meth:`take_over`'s (saved in another mode)."""
        if self.mode == "passthrough":
            return False
        if not isinstance(state, dict) or "closed" in state:
            return True  # restore reads it, or says why it cannot
        return (state.get("merged") is not None) == (self.mode == "consolidated")

    def take_over(self, run_id: str, state: dict[str, Any], now: float) -> list[Action]:
        """A run's state saved while the collector had another mode (:meth:`reads` is False):
        what it holds is flushed as :meth:`tick` flushes an expired run (``mode_changed``):
        its START if none went out (the held one, else synthesized unless the policy is
        ``forward``); consolidated: the consolidated terminal if one was seen, else the merged
        view as one RUNNING if anything was folded in since the START; coalesce: the held
        events by eventTime and the pending merged RUNNING. The run is then remembered as
        finished, or as expired open (its later events go on in this mode without another
        START); passthrough remembers nothing. A closed run's state is restored as it is
        (nothing in passthrough). Raises ValueError for a state no mode can read."""
        if read_closed_state(run_id, state) is not None:
            if self.mode != "passthrough":
                self.restore(run_id, state, now)
            return []
        saved: Mode = "consolidated" if isinstance(state, dict) and state.get("merged") is not None else "coalesce"
        former = RunConsolidator(mode=saved, on_missing_start="synthesize" if self._gate.synthesize else "forward")
        former.restore(run_id, state, now)
        out = former._expire(former._known.open[run_id], now, MODE_CHANGED,
                             f"state saved in {saved} mode, the collector's mode is now {self.mode}")
        self.runs_expired += 1
        outcome = former._known.closed[run_id][1]
        self.forget(run_id)
        if self.mode != "passthrough":
            self._known.remember_closed(run_id, outcome, now)
        return out

    def forget(self, run_id: str) -> dict[str, Any] | None:
        """Drop an open or remembered closed run without emitting anything (e.g. its
        partition moved to another consumer, which restores it); return its state, or None
        if it was not known."""
        known = self._known
        run = known.open.pop(run_id, None)
        if run is None:
            closed = known.closed.pop(run_id, None)
            return closed_state(closed[1], closed[0]) if closed is not None else None
        self._gate.ungate(run)
        return run.to_state()

    # -- the state machine ------------------------------------------------------------

    def _advance(self, run: RunRecord, now: float, arriving: LineageEvent | None = None) -> list[Action]:
        """Do everything that is due for ``run``; safe to call at any time."""
        out: list[Action] = []
        if run.start == WAITING:
            started = self._gate.try_start(run, now, arriving, out)
            if not started:
                return out
            if self.mode == "coalesce":
                out += self._replay_held(run, now)
            out += self._release_children(run.run_id, now)
            if run.run_id not in self._known.open:
                return out
        if run.settle_until is not None and now >= run.settle_until:
            out.append(Forward(built_event(run.merged.consolidated_event(), now)))
            out += self._finish(run, now, FINISHED)
        elif run.running_until is not None and now >= run.running_until:
            out += self._flush_running(run, now)
        return out

    def _release_children(self, parent_id: str, now: float) -> list[Action]:
        """Let the children whose START waited for ``parent_id`` try again (in run id order)."""
        out: list[Action] = []
        for child_id in sorted(self._gate.waiting.pop(parent_id, ())):
            child = self._known.open.get(child_id)
            if child is not None and child.start == WAITING:
                out += self._advance(child, now)
        return out

    def _replay_held(self, run: RunRecord, now: float) -> list[Action]:
        """Coalesce mode, START decided: the held events in eventTime order, as if they had
        come after it: RUNNINGs (and STARTs other than the one decided) go into the merged
        RUNNING, the first terminal finishes the run, and after it only OTHERs go on; the
        rest is dropped (``after_terminal``), as :meth:`offer` drops a finished run's."""
        out: list[Action] = []
        held, run.held = sorted(run.held, key=lambda item: item[0]), []
        finished = False
        for at, doc in held:
            event_type = doc.get("eventType")
            if finished:
                if event_type in _NOT_AFTER_TERMINAL:
                    out.append(Drop(settled_event(doc, now), AFTER_TERMINAL))
                else:
                    out.append(Forward(built_event(doc, now)))
            elif event_type == "RUNNING" or event_type == "START":
                self._add_running(run, doc, at, now)
            elif event_type in TERMINAL_TYPES:
                out += self._flush_running(run, now)
                out.append(Forward(built_event(doc, now)))
                finished = True
            else:
                out.append(Forward(built_event(doc, now)))
        if finished:
            out += self._finish(run, now, FINISHED)
        return out

    def _add_running(self, run: RunRecord, doc: dict[str, Any], at: int, now: float) -> None:
        if run.running is None:
            run.running = RunMerger()
            run.running_until = now + self._window_s
            self._known.push(run.running_until, run.run_id)
        run.running.add(doc, at)

    def _flush_running(self, run: RunRecord, now: float) -> list[Action]:
        if run.running is None:
            return []
        doc = run.running.running_event()
        run.running = run.running_until = None
        return [Forward(built_event(doc, now))]

    def _expire(self, run: RunRecord, now: float, reason: str, detail: str) -> list[Action]:
        """Take ``run`` out of the state now, flushing what it holds (module docstring)."""
        self.runs_expired += 1
        out: list[Action] = [Expired(run.run_id, reason, f"run {run.run_id}: {detail}")]
        if run.start == WAITING:
            gate = self._gate
            if run.start_doc is not None or gate.synthesize:
                out.append(gate.emit_start(run, now, None, reason))
            else:
                gate.skip(run)
        outcome = run.start
        if self.mode == "coalesce":
            out += self._replay_held(run, now)  # finishes the run if it holds a terminal
            if run.run_id not in self._known.open:
                return out
            out += self._flush_running(run, now)
        elif run.merged.has_terminal:
            out.append(Forward(built_event(run.merged.consolidated_event(), now)))
            outcome = FINISHED
        elif run.pending:
            out.append(Forward(built_event(run.merged.running_event(), now)))
        return out + self._finish(run, now, outcome)

    def _finish(self, run: RunRecord, now: float, outcome: str) -> list[Action]:
        """Forget ``run`` but its id and ``outcome``; let children waiting on it go."""
        self._known.open.pop(run.run_id, None)
        self._gate.ungate(run)
        self._known.remember_closed(run.run_id, outcome, now)
        return self._release_children(run.run_id, now)
