"""Decode processes at ``idle`` priority (SCHED_IDLE) that get no CPU (other processes keep
it busy) are replaced by ones at ``low``: the relay goes on consuming
(relay/stages/decode_starvation.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from types import SimpleNamespace

import pytest

from relay.stages import decode_starvation
from relay.stages.decode import decode_record
from relay.stages.decode_starvation import CHECK_S, STARVED_AFTER_S, StarvationWatch
from relay.stages.decode_worker import DecodeWorker
from tests.relay.stages.test_decode_worker import MAX, Answer, same, values

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not decode_starvation.watchable(),
                                reason="SCHED_IDLE and /proc/<pid>/stat are Linux's")


_HOG = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_an_idle_decode_process_that_gets_no_cpu_is_replaced_at_low_priority_and_its_batches_answered(caplog):
    """The child's decoding thread and a busy process at normal priority share one CPU: at
    SCHED_IDLE the child gets next to none of it, whatever the machine's other CPUs do."""
    small = [v for v in values() if v is None or len(v) <= MAX]
    worker = DecodeWorker(max_bytes=MAX, priority="idle")
    worker.start()
    hog = None
    try:
        child = worker._proc
        assert wait_for(lambda: os.sched_getscheduler(child.pid) == os.SCHED_IDLE, 30)  # the child sets it
        cpu = min(os.sched_getaffinity(0))
        hog = subprocess.Popen([sys.executable, "-c", _HOG])
        os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(child.pid, {cpu})   # its main thread, the one that decodes
        futures = [Answer(worker, small) for _ in range(3)]
        got = [f.result(timeout=60) for f in futures]
        got.append(worker.decode(small, timeout_s=30))
        now = worker._proc
        replaced = now.pid != child.pid
        policy = os.sched_getscheduler(now.pid)
        nice = os.getpriority(os.PRIO_PROCESS, now.pid)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait(10)
        worker.close()
    want = [decode_record(v, max_bytes=MAX) for v in small]
    for answers in got:
        assert [same(g, w) for g, w in zip(answers, want)] == [True] * len(want)
    assert replaced and worker.priority == "low" and not worker.in_process
    assert policy == os.SCHED_OTHER and nice >= 10
    assert "decode_starved" in caplog.text and "decode_worker_failed" not in caplog.text


def test_a_decode_process_at_low_priority_is_never_replaced_for_being_slow():
    worker = DecodeWorker(max_bytes=MAX, priority="low")
    worker.start()
    try:
        assert worker._watch_stop is None
    finally:
        worker.close()


class _Child:
    """What the watch reads of a DecodeChild (hashed by identity, as one is)."""

    def __init__(self, pid: int, pending: int, answers: int) -> None:
        self.proc = SimpleNamespace(pid=pid)
        self.dead = False
        self.pending = deque([None] * pending)
        self.answers = answers


def _child(pid: int = 4242, pending: int = 1, answers: int = 0) -> _Child:
    return _Child(pid, pending, answers)


class _Procs:
    """What /proc says, as the watch reads it: the child's CPU and state, this process's CPU."""

    def __init__(self, monkeypatch) -> None:
        self.cpu, self.state, self.own = 0.0, "R", 0.0
        monkeypatch.setattr(decode_starvation, "sample", lambda pid: (self.cpu, self.state))
        monkeypatch.setattr(decode_starvation, "cpu_seconds", lambda pid: self.own)


def _watch():
    starved: list[tuple[float, float]] = []
    return StarvationWatch(lambda: [], lambda child, waited, used: starved.append((waited, used)), None), starved


def _looks(watch, child, start: float, until: float) -> None:
    """Looks every CHECK_S from ``start`` to ``until`` (no gap: this process ran all along)."""
    t = start
    while t <= until + 1e-9:
        watch.check([child], t)
        t += CHECK_S


def test_the_watch_judges_by_cpu_share_while_work_waits_unanswered(monkeypatch):
    procs, (watch, starved) = _Procs(monkeypatch), _watch()
    child = _child()
    procs.cpu = 0.0
    watch.check([child], 100.0)                      # work seen: the clock starts
    procs.cpu = 0.5 * STARVED_AFTER_S                # busy decoding: half a CPU
    _looks(watch, child, 100.5, 100.0 + STARVED_AFTER_S)
    assert starved == []
    child.answers += 1                               # an answer: progress, the clock starts again
    _looks(watch, child, 104.0, 104.0 + STARVED_AFTER_S - 0.5)
    assert starved == []
    procs.cpu += 0.01                                # next to no CPU for STARVED_AFTER_S
    watch.check([child], 104.0 + STARVED_AFTER_S)
    assert len(starved) == 1 and starved[0][0] == STARVED_AFTER_S and starved[0][1] == pytest.approx(0.01)
    child.pending.clear()                            # nothing pending: nothing to judge
    _looks(watch, child, 108.0, 120.0)
    assert len(starved) == 1


def test_a_child_waiting_for_its_input_or_stopped_is_not_starved(monkeypatch):
    procs, (watch, starved) = _Procs(monkeypatch), _watch()
    child = _child()
    for state in ("S", "T", "D"):
        procs.state = state
        _looks(watch, child, 0.0, 2 * STARVED_AFTER_S)
        assert starved == [], state


def test_a_relay_busy_itself_keeps_its_children_at_idle(monkeypatch):
    """What ``idle`` is for: the relay's own delivery takes the CPU, decoding waits."""
    procs, (watch, starved) = _Procs(monkeypatch), _watch()
    child = _child()
    watch.check([child], 0.0)
    procs.own = 0.9 * STARVED_AFTER_S
    _looks(watch, child, 0.5, STARVED_AFTER_S)
    assert starved == []


def test_a_relay_that_did_not_run_meanwhile_starts_the_clocks_again(monkeypatch):
    """Ctrl-Z, ``docker pause``: the watch's own gap is no child's starvation."""
    _procs, (watch, starved) = _Procs(monkeypatch), _watch()
    child = _child()
    watch.check([child], 0.0)
    watch.check([child], 15.0)                       # stopped 15 s, all of it
    assert starved == []
    _looks(watch, child, 15.5, 15.0 + STARVED_AFTER_S - 0.5)
    assert starved == []
    watch.check([child], 15.0 + STARVED_AFTER_S)
    assert len(starved) == 1


def test_a_new_child_with_a_dead_ones_pid_gets_a_clock_of_its_own(monkeypatch):
    procs, (watch, starved) = _Procs(monkeypatch), _watch()
    old = _child(pid=7)
    procs.cpu = 5.0
    watch.check([old], 0.0)
    new = _child(pid=7)
    procs.cpu = 0.3
    _looks(watch, new, 0.5, STARVED_AFTER_S)         # a clock from 0.5: not yet STARVED_AFTER_S
    assert starved == []


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # ok: the poll interval of a wait with a deadline
    return True


def test_cpu_seconds_reads_a_process_of_ours():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                             "while time.process_time() < end: pass\ninput()"], stdin=subprocess.PIPE)
    try:
        used = None
        for _ in range(200):
            used = decode_starvation.cpu_seconds(busy.pid)
            if used is not None and used >= 0.25:
                break
            time.sleep(0.02)  # ok: polling a condition, at most 200 times (4 s)
        assert used is not None and used >= 0.25, used
    finally:
        busy.kill()
        busy.wait(10)
    assert decode_starvation.cpu_seconds(busy.pid) is None  # gone: /proc cannot say
