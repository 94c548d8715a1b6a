"""Routing by run, for a collector whose route rules name ``dataset_namespace``.

A run's events do not all name its datasets: a Spark START often names no output, its
COMPLETE does. Judged event by event, a rule "runs that write to ``s3://warehouse*``"
routed the COMPLETE without its START, which the ordering then held for a START that never
came (dead-lettered or late). :class:`RunRouter` makes ``dataset_namespace`` a property of
the run instead (see :meth:`relay.stages.route.Router.learn`): once any event of a run
names a matching dataset, the rule's ``dataset_namespace`` matches every event of the run;
the rule's other fields (``event_types``...) still apply to each event.

* An event that an include rule would route once its run names a matching dataset
  (:data:`~relay.stages.route.UNDECIDED`) is held, with its run's other such events, until
  the run is decided: when an event of the run names a matching dataset, the held events
  are routed first, in arrival order, then that event. So the START goes before the
  COMPLETE, and the ordering stage after routing sees the run in order.
* The run's terminal event (COMPLETE/FAIL/ABORT) ends its hold: what is still undecided is
  dropped as ``not_routed`` (the terminal too, if it is). So is a hold older than
  ``hold_timeout_s`` (counted from its first held event), or the oldest hold when more than
  ``max_held_events`` events are held. A run whose hold ended is not held again: its later
  events go by what the run named so far, and by their own datasets. A run that names a
  matching dataset only after that (a job longer than ``hold_timeout_s`` whose START named
  none) is routed from then on, without its START: the ordering then treats it as a run
  whose START it never saw (``on_hold_timeout``).
* Exclude rules with a ``dataset_namespace`` are judged the same way, without holding: once
  an event of a run names a matching dataset, the run's later events (and those still held)
  are excluded; its earlier events already went.
* Events without a run (DatasetEvent, JobEvent) are routed on their own, as before.

Memory is bounded: at most ``max_held_events`` held events and ``max_tracked_runs`` runs
remembered (least recently touched forgotten first; a forgotten run's held events are
dropped); a run is forgotten ``finished_ttl_s`` after its terminal event. A run whose hold
ended otherwise (timeout, overflow) may still be running, and is routed by what it named
(from then on): it is remembered like any open run, until its terminal or until
``max_tracked_runs`` pushes it out. Only runs that named a dataset some rule wants, or
that hold events, are remembered. Pure and synchronous like
:class:`~relay.stages.sequence.RunSequencer`: ``now`` is passed in and decisions returned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from relay.events import LineageEvent
from relay.stages.decisions import Decision, Drop, Forward
from relay.stages.route import NOT_ROUTED, UNDECIDED, Router

#: What :meth:`RunRouter.offer` answers for an event it holds.
HELD = "held"


class _Run:
    """What one run named so far, and its events waiting for that to route them."""

    __slots__ = ("touched", "held", "since", "ended")

    def __init__(self) -> None:
        #: Router.learn's bits for the run's events so far.
        self.touched = 0
        self.held: list[LineageEvent] = []
        #: When the current hold began (its first held event).
        self.since = 0.0
        #: The hold ended (terminal, timeout, overflow): nothing of the run is held again.
        self.ended = False


class RunRouter:
    """See the module docstring. Contract of :meth:`offer`/:meth:`expire`: every event
    held is decided exactly once, by a later ``offer``/``expire`` call (as
    :class:`~relay.stages.decisions.Forward`: routed, for the stages after routing to take
    on; or :class:`~relay.stages.decisions.Drop` with ``not_routed``), unless
    :meth:`discard` removes it first. One run's hold never delays another run's events."""

    def __init__(self, router: Router, *, hold_timeout_s: float, max_held_events: int, max_tracked_runs: int,
                 finished_ttl_s: float) -> None:
        self._router = router
        self._hold_timeout_s = hold_timeout_s
        self._max_held_events = max_held_events
        self._max_tracked_runs = max_tracked_runs
        self._finished_ttl_s = finished_ttl_s
        #: Runs remembered, least recently touched first.
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        #: Runs holding events, by when their hold began (oldest first).
        self._holds: OrderedDict[str, _Run] = OrderedDict()
        self._held_count = 0
        #: Runs that ended (their terminal event), in that order, for the finished_ttl_s sweep.
        self._ended: OrderedDict[str, float] = OrderedDict()

    @property
    def held_count(self) -> int:
        """Events held, across all runs."""
        return self._held_count

    @property
    def tracked_runs(self) -> int:
        return len(self._runs)

    def offer(self, event: LineageEvent, now: float) -> tuple[str | None, list[Decision]]:
        """Route ``event``: ``(verdict, due)``. ``due``: decisions about events held before
        (in order; carry them out first). ``verdict``: None when ``event`` is routed (after
        ``due``), :data:`HELD` when it is held (it may then be in ``due`` already, dropped
        by the overflow), else the reason it is not routed."""
        run_id = event.run_id
        router = self._router
        if run_id is None:
            return router.accepts(event), []
        runs = self._runs
        run = runs.get(run_id)
        touched = router.learn(event, run.touched if run is not None else 0)
        verdict = router.judge(event, touched)
        due: list[Decision] = []
        if run is None:
            if not touched and verdict is not UNDECIDED:
                return verdict, due  # nothing to remember: the run named nothing wanted
            run = self._track(run_id, due)
        else:
            runs.move_to_end(run_id)
        if touched != run.touched:
            run.touched = touched
            if run.held:
                due += self._judge_held(run_id, run)
        if event.is_terminal:
            if verdict is UNDECIDED:
                verdict = NOT_ROUTED
            self._end(run_id, run, due)
            self._finished(run_id, now)
        elif verdict is UNDECIDED:
            if run.ended:
                verdict = NOT_ROUTED
            else:
                verdict = HELD
                self._hold(run_id, run, event, now, due)
        return verdict, due

    def expire(self, now: float) -> list[Decision]:
        """End the holds older than ``hold_timeout_s`` (their events dropped as
        ``not_routed``), forget runs whose terminal came over ``finished_ttl_s`` ago, and
        runs beyond ``max_tracked_runs`` (see :meth:`prime`)."""
        due: list[Decision] = []
        holds = self._holds
        while holds:
            run_id, run = next(iter(holds.items()))
            if now - run.since <= self._hold_timeout_s:
                break
            self._end(run_id, run, due)
        ended, runs = self._ended, self._runs
        while ended:
            run_id, at = next(iter(ended.items()))
            if now - at <= self._finished_ttl_s:
                break
            del ended[run_id]
            runs.pop(run_id, None)
        self._bound(due)
        return due

    def prime(self, event: LineageEvent, now: float) -> bool:
        """Learn what ``event``'s run named from an event before the committed offset (see
        :mod:`relay.source.lookback`), so that the run's later events are routed as they
        were, and whether the collector had ``event``: True when it was routed, or when
        it was undecided and held (an offset is committed past a held event only once it
        is decided; this takes it for routed, as it is when its run named a matching
        dataset later, and not when the run's hold ended undecided). A terminal ends the
        run's hold, as in :meth:`offer`. Holds nothing; runs beyond ``max_tracked_runs``
        are forgotten at the next ``offer``/``expire``."""
        router, run_id = self._router, event.run_id
        if run_id is None:
            return router.accepts(event) is None
        run = self._runs.get(run_id)
        touched = router.learn(event, run.touched if run is not None else 0)
        verdict = router.judge(event, touched)
        was_held = verdict is UNDECIDED and not event.is_terminal and not (run is not None and run.ended)
        if run is None and (touched or verdict is UNDECIDED):
            run = self._runs[run_id] = _Run()
        # A run holding events here learns from offer, which judges them again.
        if run is not None and not run.held:
            run.touched = touched
            if event.is_terminal:
                run.ended = True
                self._finished(run_id, now)
        return verdict is None or was_held

    def discard(self, predicate: Callable[[LineageEvent], bool]) -> list[LineageEvent]:
        """Remove the held events matching ``predicate`` without deciding them, and return
        them (a revoked partition's: its new owner reads them again). A run's hold keeps
        its start."""
        removed: list[LineageEvent] = []
        for run_id, run in list(self._holds.items()):
            keep = []
            for event in run.held:
                (removed if predicate(event) else keep).append(event)
            if len(keep) != len(run.held):
                run.held = keep
                if not keep:
                    del self._holds[run_id]
        self._held_count -= len(removed)
        return removed

    def _track(self, run_id: str, due: list[Decision]) -> _Run:
        run = self._runs[run_id] = _Run()
        self._bound(due)
        return run

    def _bound(self, due: list[Decision]) -> None:
        runs = self._runs
        while len(runs) > self._max_tracked_runs:
            run_id, run = runs.popitem(last=False)
            self._ended.pop(run_id, None)
            if run.held:
                self._drop_held(run_id, run, due)

    def _hold(self, run_id: str, run: _Run, event: LineageEvent, now: float, due: list[Decision]) -> None:
        if not run.held:
            run.since = now
            self._holds[run_id] = run
        run.held.append(event)
        self._held_count += 1
        while self._held_count > self._max_held_events:
            oldest_id, oldest = next(iter(self._holds.items()))
            self._end(oldest_id, oldest, due)

    def _judge_held(self, run_id: str, run: _Run) -> list[Decision]:
        """The run named more: its held events routed or excluded by that, in order."""
        decisions: list[Decision] = []
        keep: list[LineageEvent] = []
        judge, touched = self._router.judge, run.touched
        for event in run.held:
            verdict = judge(event, touched)
            if verdict is None:
                decisions.append(Forward(event))
            elif verdict is UNDECIDED:
                keep.append(event)
            else:
                decisions.append(Drop(event, verdict))
        self._held_count -= len(run.held) - len(keep)
        run.held = keep
        if not keep:
            del self._holds[run_id]
        return decisions

    def _end(self, run_id: str, run: _Run, due: list[Decision]) -> None:
        """The run's hold ends: what it holds is not routed, and it holds nothing again."""
        if run.held:
            self._drop_held(run_id, run, due)
        run.ended = True

    def _finished(self, run_id: str, now: float) -> None:
        """The run's terminal came: it is forgotten ``finished_ttl_s`` after the first one.
        Not at a hold's timeout or overflow: the run may still be running, routed by what it
        named (a run forgotten then would be held again, its terminal dropped)."""
        if run_id not in self._ended:
            self._ended[run_id] = now

    def _drop_held(self, run_id: str, run: _Run, due: list[Decision]) -> None:
        due += (Drop(event, NOT_ROUTED) for event in run.held)
        self._held_count -= len(run.held)
        run.held = []
        del self._holds[run_id]
