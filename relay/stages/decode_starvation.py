"""Decode processes at ``idle`` priority that get no CPU.

``pipeline.decode_priority: idle`` (the ``auto`` default with per-event collectors) runs the
decode processes under Linux's SCHED_IDLE: they take only CPU nobody else wants, so decoding
never delays delivery. On a machine whose CPU other processes keep busy (a node shared
with CPU-bound work, a laptop running a build) that is next to none -- a weight of 3
against 1024 for each busy process: a batch that decodes in 0.3 s took minutes, the relay
consumed nothing meanwhile, and its lag grew with nothing wrong in the relay itself.

:class:`StarvationWatch` looks at each child with work pending every :data:`CHECK_S`: one
that has had work for :data:`STARVED_AFTER_S` without an answer, and used less than
:data:`MIN_CPU_SHARE` of that time on the CPU, is starved (a stopped process too). Its owner
then gives up ``idle`` for good (an unprivileged process cannot leave SCHED_IDLE: the kernel
treats it as nice 20, and RLIMIT_NICE is 0 by default): the children are replaced by ones at
``low`` (nice 10, which still yields to the relay but gets a share), and what they held is
decoded again by those.

Linux only (``/proc/<pid>/stat``), as SCHED_IDLE is; elsewhere nothing is watched.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from relay.stages.decode_inflight import DecodeChild

#: How often the children are looked at.
CHECK_S = 0.5
#: Work pending this long without an answer, with less than MIN_CPU_SHARE of it on a CPU: starved.
STARVED_AFTER_S = 3.0
MIN_CPU_SHARE = 0.1

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process ``pid`` used so far; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command (in parentheses, which may hold spaces): state is field 3,
    # utime and stime fields 14 and 15.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) * _TICK_S
    except (IndexError, ValueError):
        return None


def watchable() -> bool:
    return cpu_seconds(os.getpid()) is not None


class StarvationWatch:
    """A daemon thread that calls ``on_starved(child, waited_s, cpu_s)`` for a starved child
    of ``children()`` (those at ``idle`` priority), until ``stop`` is set or ``children()``
    answers None (the owner no longer runs any at ``idle``)."""

    def __init__(self, children: Callable[[], list[DecodeChild] | None],
                 on_starved: Callable[[DecodeChild, float, float], None], stop: threading.Event) -> None:
        self._children = children
        self._on_starved = on_starved
        self._stop = stop
        #: Per child: (since, cpu then, answers then) of the work it has without an answer.
        self._since: dict[int, tuple[float, float, int]] = {}
        self._thread = threading.Thread(target=self._run, name="decode-starvation-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            children = self._children()
            if children is None:
                return
            self.check(children, time.monotonic())

    def check(self, children: list[DecodeChild], now: float) -> None:
        seen = set()
        for child in children:
            pid = child.proc.pid
            seen.add(pid)
            if child.dead or not child.pending:
                self._since.pop(pid, None)
                continue
            cpu = cpu_seconds(pid)
            if cpu is None:
                continue
            since = self._since.get(pid)
            if since is None or since[2] != child.answers:  # new work, or an answer since
                self._since[pid] = (now, cpu, child.answers)
                continue
            waited, used = now - since[0], cpu - since[1]
            if waited >= STARVED_AFTER_S and used < MIN_CPU_SHARE * waited:
                self._since.pop(pid, None)
                self._on_starved(child, waited, used)
        for pid in list(self._since):
            if pid not in seen:
                del self._since[pid]
