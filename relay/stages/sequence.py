"""Per-run ordering for one collector: START first, exactly one terminal, nothing after.

Kafka keeps order only within a partition, and producers retry, so a run's COMPLETE can
arrive before its START. Collectors such as Marquez reject or mis-model that.
:class:`RunSequencer` holds a run's early events until its START arrives (or a timeout
or a memory bound forces a decision) and drops anything after the run's terminal event.

It is pure and synchronous: it never reads the clock (``now`` is passed in, in seconds,
and must not go backwards) and returns decisions for the caller to carry out (their
types and reason codes: :mod:`relay.stages.decisions`). What it gives back and unlearns
when events are taken back before delivery: :mod:`relay.stages.sequence_takeback`.
"""

from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter
from typing import Literal

from relay.events import TERMINAL_TYPES, LineageEvent
from relay.stages.decisions import AFTER_TERMINAL, HOLD_OVERFLOW, HOLD_TIMEOUT, DeadLetter, Decision, Drop, Forward
from relay.stages.knobs import check_count, check_seconds
from relay.stages.sequence_takeback import SequenceTakeBack

HoldPolicy = Literal["forward", "dead_letter"]

_by_event_time = attrgetter("event_time")
#: What :class:`RunSequencer` holds for a run it does not track.
_UNKNOWN = object()


class RunHold:
    """Events of one run that arrived before its START, in arrival order."""

    __slots__ = ("events", "arrivals")

    def __init__(self) -> None:
        self.events: list[LineageEvent] = []
        self.arrivals: list[float] = []

    @property
    def since(self) -> float:
        return self.arrivals[0]


class RunSequencer(SequenceTakeBack):
    """Orders each run's events for one collector.

    Contract:

    * Every event offered is decided exactly once: by the ``offer`` call itself or by a
      later ``offer``/``expire`` call, unless :meth:`discard` removes it first.
    * Events without a ``run_id`` (DatasetEvent, JobEvent) are forwarded at once.
    * A run's first forwarded event is its START, unless its hold ended by timeout or
      overflow with ``on_hold_timeout="forward"``. Events that arrive before the START
      are held; when it arrives they follow it: non-terminal events by ``event_time``
      (ties in arrival order), then the earliest terminal. With ``terminal_grace_s`` > 0
      such an early terminal waits that long after the START, so the run's stragglers
      (RUNNING events still behind the START in the topic) are forwarded before it.
    * A hold ended by timeout/overflow is released by ``on_hold_timeout``: ``"forward"``
      sends it in the order above and marks the run started; ``"dead_letter"``
      dead-letters every held event and remembers nothing, so a START arriving later
      begins the run afresh.
    * At most one terminal (COMPLETE/FAIL/ABORT) is forwarded per run; every event of the
      run after it is dropped with ``after_terminal``, except OTHER events, which the
      spec allows after the terminal (unless ``forward_other_after_terminal`` is off).
    * Runs are independent: one run's held events never delay another run.
    * Memory is bounded: at most ``max_held_events`` held events (beyond that, the run
      whose hold began earliest is released at once, reason ``hold_overflow``) and at
      most ``max_tracked_runs`` started/finished markers (least recently touched are
      forgotten first) besides those of runs whose early terminal waits out its grace:
      such a run is not forgotten before its terminal is sent (there are no more of them
      than early terminals released in the last ``terminal_grace_s``, each an unsettled
      record, which the relay's backpressure bounds). Finished markers are also forgotten
      ``finished_ttl_s`` after the terminal. A forgotten run's late events are treated like
      a new run's: held until a START or the hold timeout.
    """

    def __init__(
        self,
        *,
        hold_timeout_s: float,
        on_hold_timeout: HoldPolicy,
        max_held_events: int,
        max_tracked_runs: int,
        finished_ttl_s: float,
        terminal_grace_s: float = 0.0,
        forward_other_after_terminal: bool = True,
    ) -> None:
        check_seconds("hold_timeout_s", hold_timeout_s)
        check_seconds("finished_ttl_s", finished_ttl_s)
        check_count("max_held_events", max_held_events)
        check_count("max_tracked_runs", max_tracked_runs)
        if on_hold_timeout not in ("forward", "dead_letter"):
            raise ValueError(
                f"on_hold_timeout must be 'forward' or 'dead_letter', got {on_hold_timeout!r}"
            )
        self._hold_timeout_s = float(hold_timeout_s)
        self._on_hold_timeout = on_hold_timeout
        self._max_held_events = max_held_events
        self._max_tracked_runs = max_tracked_runs
        self._finished_ttl_s = float(finished_ttl_s)
        if terminal_grace_s < 0:
            raise ValueError(f"terminal_grace_s must be >= 0 seconds, got {terminal_grace_s!r}")
        self._terminal_grace_s = float(terminal_grace_s)
        self._forward_other_after_terminal = forward_other_after_terminal
        # Terminal events that arrived before their START, waiting out the grace period
        # after it so that the run's stragglers (RUNNING...) are forwarded first.
        # run_id -> (terminal, release time); insertion order is release order. Each is an
        # open run of _runs, never forgotten while here: forgotten, its later events would
        # be held and released again, a second terminal with them.
        self._grace: OrderedDict[str, tuple[LineageEvent, float]] = OrderedDict()
        # Runs waiting for their START, ordered by when their hold began (oldest first).
        self._holds: OrderedDict[str, RunHold] = OrderedDict()
        self._held_count = 0
        # Runs that may forward: run_id -> time of the forwarded terminal, or None while
        # the run is open. Least recently touched first. Disjoint from _holds.
        self._runs: OrderedDict[str, float | None] = OrderedDict()
        # Finished runs in the order they finished, for the finished_ttl_s sweep.
        self._finished: OrderedDict[str, float] = OrderedDict()
        # prime() only, with on_hold_timeout="dead_letter": terminals of runs not known to
        # have started, in case their START follows (bounded like _runs).
        self._primed_early: OrderedDict[str, float] = OrderedDict()
        # prime() only: runs held here that the look-back proved begun (and finished, when
        # True), released by the next expire() as learn_earlier() does.
        self._primed_holds: dict[str, bool] = {}

    @property
    def held_count(self) -> int:
        """Events currently held, across all runs (including terminals in grace)."""
        return self._held_count + len(self._grace)

    @property
    def held_runs(self) -> int:
        """Runs that currently hold at least one event."""
        return len(self._holds)

    @property
    def tracked_runs(self) -> int:
        """Runs whose started/finished state is remembered."""
        return len(self._runs)

    def admit(self, event: LineageEvent, now: float) -> bool:
        """:meth:`offer` for the common case, without building decisions (the lane's
        per-event path): True when ``event`` is to be forwarded now and nothing else became
        due (then offer must not be called for it); False, having changed nothing, when only
        :meth:`offer` can decide. The common case is an event of an open run (no early
        terminal waiting out its grace), a START of a run with nothing held, and an event
        without a run; offer begins with it."""
        run_id = event.run_id
        if run_id is None:
            return True
        runs = self._runs
        state = runs.get(run_id, _UNKNOWN)
        if state is None:  # open
            terminal = event.event_type in TERMINAL_TYPES
            if terminal and run_id in self._grace:
                return False
            runs.move_to_end(run_id)
            if terminal:
                self._finish(run_id, now)
            return True
        if state is _UNKNOWN and event.event_type == "START" and run_id not in self._holds:
            self._start(run_id)
            return True
        return False

    def offer(self, event: LineageEvent, now: float) -> list[Decision]:
        """Decide ``event`` if possible and return every decision that became due."""
        if self.admit(event, now):
            return [Forward(event)]
        run_id = event.run_id
        assert run_id is not None  # admit forwards every event without a run
        runs = self._runs
        if run_id in runs:
            runs.move_to_end(run_id)
            if runs[run_id] is not None:
                if event.event_type == "OTHER" and self._forward_other_after_terminal:
                    return [Forward(event)]  # the spec allows OTHER after the terminal
                return [Drop(event, AFTER_TERMINAL)]
            # Open, and admit left it: a terminal while an early one waits out its grace.
            grace = self._grace[run_id]
            if event.event_time < grace[0].event_time:
                self._grace[run_id] = (event, grace[1])
                return [Drop(grace[0], AFTER_TERMINAL)]
            return [Drop(event, AFTER_TERMINAL)]
        if event.event_type == "START":  # admit left it: the run holds events
            hold = self._holds.pop(run_id)
            self._start(run_id)
            self._held_count -= len(hold.events)
            return [Forward(event), *self._release_in_order(run_id, hold.events, now, self._terminal_grace_s)]
        hold = self._holds.get(run_id)
        if hold is None:
            hold = self._holds[run_id] = RunHold()
        hold.events.append(event)
        hold.arrivals.append(now)
        self._held_count += 1
        decisions: list[Decision] = []
        while self._held_count > self._max_held_events:
            oldest = next(iter(self._holds))
            decisions += self._release_hold(oldest, now, HOLD_OVERFLOW)
        return decisions

    def expire(self, now: float) -> list[Decision]:
        """Release runs whose hold began more than ``hold_timeout_s`` ago, by the
        ``on_hold_timeout`` policy, and forget runs finished over ``finished_ttl_s`` ago."""
        decisions: list[Decision] = []
        if self._primed_holds:
            primed, self._primed_holds = self._primed_holds, {}
            for run_id, finished in primed.items():
                decisions += self.learn_earlier(run_id, finished=finished, now=now)
        grace = self._grace
        graced = len(grace)
        while grace:
            run_id, (terminal, until) = next(iter(grace.items()))
            if now < until:
                break
            del grace[run_id]
            state = self._runs.get(run_id, _UNKNOWN)
            if state is None:
                decisions.append(Forward(terminal))
                self._finish(run_id, now)
            elif state is _UNKNOWN:  # defensive (see _grace): not sent ahead of its START
                self._hold_again(run_id, terminal, now)
            else:  # defensive: the run ended here by another terminal
                decisions.append(Drop(terminal, AFTER_TERMINAL))
        if len(grace) < graced:
            self._forget_beyond_cap()
        holds = self._holds
        while holds:
            run_id, hold = next(iter(holds.items()))
            if now - hold.since <= self._hold_timeout_s:
                break
            decisions += self._release_hold(run_id, now, HOLD_TIMEOUT)
        finished = self._finished
        while finished:
            run_id, finished_at = next(iter(finished.items()))
            if now - finished_at <= self._finished_ttl_s:
                break
            del finished[run_id]
            del self._runs[run_id]
        return decisions

    def prime(self, event: LineageEvent, now: float) -> None:
        """Learn from ``event`` that this collector already had it (it came before the
        committed offset: see :mod:`relay.source.lookback`), as :meth:`offer` would have
        learnt from forwarding it, without deciding anything: a START marks its run
        started, a terminal marks it finished. Another event of an unknown run marks it
        started only with ``on_hold_timeout="forward"`` (with ``"dead_letter"``, a run
        without its START was dead-lettered, not started). A run held here (its later
        events came from a partition already assigned, whose holds an incremental
        assignment keeps) learns only from a START (or, with ``"forward"``, a terminal), and
        its hold is then released by the next :meth:`expire` as :meth:`learn_earlier`
        releases one: its held events follow, or are dropped as ``after_terminal`` when the
        run had finished. Another event of a held run leaves the hold waiting for its START
        (or ``hold_timeout_s``)."""
        run_id = event.run_id
        if run_id is None or run_id in self._grace:
            return
        terminal = event.event_type in TERMINAL_TYPES
        if run_id in self._holds:
            # Released only by its START or (with "forward") its terminal: another event read
            # back proves neither that the START went out (with "forward" it may have gone
            # out at a hold timeout, the START still to come) nor that the run ended; the
            # hold waits for the START as before (or for hold_timeout_s).
            if event.event_type == "START" or (terminal and self._on_hold_timeout == "forward"):
                self._primed_holds[run_id] = self._primed_holds.get(run_id, False) or terminal
            elif terminal:  # "dead_letter": the START may follow (learn_earlier reads this)
                self._primed_early[run_id] = now
                if len(self._primed_early) > self._max_tracked_runs:
                    self._primed_early.popitem(last=False)
            return
        state = self._runs.get(run_id, _UNKNOWN)
        if state is _UNKNOWN:
            if event.event_type == "START":
                self._start(run_id)
                if self._primed_early.pop(run_id, None) is not None:
                    self._finish(run_id, now)  # its terminal came first, was held, then sent
                return
            if self._on_hold_timeout != "forward":
                if terminal:  # the START may follow (it was held for it), or it was dead-lettered
                    self._primed_early[run_id] = now
                    if len(self._primed_early) > self._max_tracked_runs:
                        self._primed_early.popitem(last=False)
                return
            self._start(run_id)
            state = None
        if state is None and terminal:
            self._finish(run_id, now)

    def pass_start(self, run_id: str, now: float) -> list[Decision]:
        """The run's START is not forwarded here (the route leaves it out, or this collector
        has it already: a duplicate): the run's events must not wait for it (for
        ``hold_timeout_s``, or to be dead-lettered). Its held events follow in order, as
        after a forwarded START; a known run is left as it is. Returns the decisions that
        became due."""
        if run_id in self._runs:
            return []
        hold = self._holds.pop(run_id, None)
        self._start(run_id)
        if hold is None:
            return []
        self._held_count -= len(hold.events)
        return self._release_in_order(run_id, hold.events, now, self._terminal_grace_s)

    def end_left_out(self, run_id: str, now: float) -> None:
        """The run's terminal is left out by the route (FAIL under ``event_types: [COMPLETE]``):
        an open run is forgotten after ``finished_ttl_s`` all the same. It stays open until
        then: a revoke may take back events forwarded before that terminal, and nothing
        taken back would reopen a run ended here (read again, they would be dropped as
        ``after_terminal``, their offsets committed)."""
        if self._runs.get(run_id, _UNKNOWN) is None and run_id not in self._grace:
            self._finished.pop(run_id, None)
            self._finished[run_id] = now

    def held_since(self) -> list[tuple[str, float, LineageEvent]]:
        """Each run holding events (waiting for its START): its id, when its hold began,
        and its first held event (oldest hold first)."""
        return [(run_id, hold.since, hold.events[0]) for run_id, hold in self._holds.items()]

    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> list[Decision]:
        """A run held for its START turns out to have begun before the committed offset (its
        START, and its terminal when ``finished``, were found further back than the
        look-back read: see :mod:`relay.source.run_search`). Its hold ends as if the START
        had just been forwarded: the held events follow in order, or, when the run had
        finished, they are dropped as ``after_terminal`` (OTHER forwarded as usual). A run
        not held is left as it is; returns the decisions that became due."""
        hold = self._holds.pop(run_id, None)
        if hold is None:
            return []
        self._held_count -= len(hold.events)
        self._start(run_id)
        # A terminal the look-back read for an unknown run (prime, with "dead_letter").
        finished = self._primed_early.pop(run_id, None) is not None or finished
        if not finished:
            return self._release_in_order(run_id, hold.events, now)
        self._finish(run_id, now)
        forward_other = self._forward_other_after_terminal
        return [Forward(e) if e.event_type == "OTHER" and forward_other else Drop(e, AFTER_TERMINAL)
                for e in sorted(hold.events, key=_by_event_time)]

    def _release_hold(self, run_id: str, now: float, reason: str) -> list[Decision]:
        """End a hold without a START, by the on_hold_timeout policy."""
        hold = self._holds.pop(run_id)
        self._held_count -= len(hold.events)
        if self._on_hold_timeout == "forward":
            # The run now counts as started, so its later events are not held again.
            self._start(run_id)
            return self._release_in_order(run_id, hold.events, now)
        held_for = now - hold.since
        if reason == HOLD_TIMEOUT:
            detail = (
                f"run {run_id}: no START within hold_timeout_s={self._hold_timeout_s:g}s "
                f"(held {held_for:.1f}s)"
            )
        else:
            detail = (
                f"run {run_id}: released before its START because held events exceeded "
                f"max_held_events={self._max_held_events} (held {held_for:.1f}s)"
            )
        return [DeadLetter(event, reason, detail) for event in hold.events]

    def _release_in_order(
        self, run_id: str, events: list[LineageEvent], now: float, grace_s: float = 0.0
    ) -> list[Decision]:
        """Forward a started run's held events: non-terminal by event time, then the
        earliest terminal (after ``grace_s``, see ``terminal_grace_s``); later terminals
        are dropped."""
        ordinary = sorted((e for e in events if not e.is_terminal), key=_by_event_time)
        terminals = sorted((e for e in events if e.is_terminal), key=_by_event_time)
        decisions: list[Decision] = [Forward(event) for event in ordinary]
        if not terminals:
            return decisions
        first, later = terminals[0], terminals[1:]
        waiting = self._grace.get(run_id)
        if waiting is not None:
            # Defensive (never so, see _grace): the earliest waits, as in offer; the other is dropped.
            if first.event_time < waiting[0].event_time:
                self._grace[run_id] = (first, waiting[1])
                later = [waiting[0], *later]
            else:
                later = terminals
        elif grace_s > 0:
            self._grace[run_id] = (first, now + grace_s)
        else:
            decisions.append(Forward(first))
            self._finish(run_id, now)
        decisions += (Drop(event, AFTER_TERMINAL) for event in later)
        return decisions

    def _hold_again(self, run_id: str, terminal: LineageEvent, since: float) -> None:
        """A terminal waiting out its grace whose run is no longer known (its START taken
        back) waits for its START again, with the run's events held since, if any."""
        holds = self._holds
        hold = holds.get(run_id)
        out_of_order = hold is None and bool(holds) and since < next(reversed(holds.values())).since
        if hold is None:
            hold = holds[run_id] = RunHold()
        hold.events.append(terminal)
        hold.arrivals.append(since)
        self._held_count += 1
        if out_of_order:  # keep _holds sorted by hold start for expire()
            self._holds = OrderedDict(sorted(holds.items(), key=lambda kv: kv[1].since))

    def _start(self, run_id: str) -> None:
        self._runs[run_id] = None
        self._runs.move_to_end(run_id)
        self._forget_beyond_cap()

    def _forget_beyond_cap(self) -> None:
        """Forget the least recently touched runs beyond ``max_tracked_runs``, those whose
        terminal waits out its grace aside (passed over as if touched). There is one to
        forget: more than max_tracked_runs (>= 1) runs are not in grace."""
        runs, grace = self._runs, self._grace
        while len(runs) - len(grace) > self._max_tracked_runs:
            evicted = next(iter(runs))
            while evicted in grace:
                runs.move_to_end(evicted)
                evicted = next(iter(runs))
            del runs[evicted]
            self._finished.pop(evicted, None)

    def _finish(self, run_id: str, now: float) -> None:
        self._runs[run_id] = now
        self._finished.pop(run_id, None)  # kept in the order of finishing, for expire()
        self._finished[run_id] = now
