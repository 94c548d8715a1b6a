"""Decode processes at ``idle`` priority (SCHED_IDLE) that get no CPU (other processes keep
it busy) are replaced by ones at ``low``: the relay goes on consuming
(relay/stages/decode_starvation.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from types import SimpleNamespace

import pytest

from relay.stages import decode_starvation
from relay.stages.decode import decode_record
from relay.stages.decode_starvation import STARVED_AFTER_S, StarvationWatch
from relay.stages.decode_worker import DecodeWorker
from tests.relay.stages.test_decode_worker import MAX, Answer, same, values

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not decode_starvation.watchable(),
                                reason="SCHED_IDLE and /proc/<pid>/stat are Linux's")


def test_an_idle_decode_process_that_gets_no_cpu_is_replaced_at_low_priority_and_its_batches_answered(caplog):
    small = [v for v in values() if v is None or len(v) <= MAX]
    worker = DecodeWorker(max_bytes=MAX, priority="idle")
    worker.start()
    try:
        child = worker._proc
        assert wait_for(lambda: os.sched_getscheduler(child.pid) == os.SCHED_IDLE, 30)  # the child sets it
        child.send_signal(signal.SIGSTOP)  # no CPU at all, as a starved one gets next to none
        futures = [Answer(worker, small) for _ in range(3)]
        got = [f.result(timeout=30) for f in futures]
        got.append(worker.decode(small, timeout_s=30))
        now = worker._proc
        replaced = now.pid != child.pid
        policy = os.sched_getscheduler(now.pid)
        nice = os.getpriority(os.PRIO_PROCESS, now.pid)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
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


def _child(pid: int = 4242, pending: int = 1, answers: int = 0):
    return SimpleNamespace(proc=SimpleNamespace(pid=pid), dead=False, pending=deque([None] * pending), answers=answers)


def test_the_watch_judges_by_cpu_share_while_work_waits_unanswered(monkeypatch):
    cpu = {4242: 0.0}
    monkeypatch.setattr(decode_starvation, "cpu_seconds", lambda pid: cpu[pid])
    starved = []
    watch = StarvationWatch(lambda: [], lambda child, waited, used: starved.append((waited, used)), None)
    child = _child()
    watch.check([child], 100.0)                      # work seen: the clock starts
    cpu[4242] = 0.5 * STARVED_AFTER_S                # busy decoding: half a CPU
    watch.check([child], 100.0 + STARVED_AFTER_S)
    assert starved == []
    child.answers += 1                               # an answer: progress, the clock starts again
    watch.check([child], 300.0)
    cpu[4242] += 0.01                                # then next to no CPU for STARVED_AFTER_S
    watch.check([child], 300.0 + STARVED_AFTER_S - 0.1)
    assert starved == []
    watch.check([child], 300.0 + STARVED_AFTER_S)
    assert len(starved) == 1 and starved[0][0] == STARVED_AFTER_S and starved[0][1] == pytest.approx(0.01)
    child.pending.clear()                            # nothing pending: nothing to judge
    watch.check([child], 1000.0)
    assert len(starved) == 1


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
