"""Decode processes at ``idle`` priority that get no CPU.

``pipeline.decode_priority: idle`` (the ``auto`` default with per-event collectors) runs the
decode processes under Linux's SCHED_IDLE: they take only CPU nobody else wants, so decoding
never delays delivery. On a machine whose CPU other processes keep busy (a node shared
with CPU-bound work, a laptop running a build) that is next to none -- a weight of 3
against 1024 for each busy process: a batch that decodes in 0.3 s took minutes, the relay
consumed nothing meanwhile, and its lag grew with nothing wrong in the relay itself.

:class:`StarvationWatch` looks at each child with work pending every :data:`CHECK_S`. One
that has had work for :data:`STARVED_AFTER_S` without an answer, runnable at every look
(waiting for a CPU, not for its input, not stopped), and used less than
:data:`MIN_CPU_SHARE` of that time, while the relay's own process used less than
:data:`MAX_OWN_SHARE` of it (a relay busy delivering is what ``idle`` yields to: its own
backlog is no reason to give ``idle`` up), is starved. Looks more than :data:`GAP_S` apart
(the relay itself stopped: Ctrl-Z, ``docker pause``) start every clock again. The owner
then gives up ``idle`` for good (an unprivileged process cannot leave SCHED_IDLE: the
kernel treats it as nice 20, and RLIMIT_NICE is 0 by default): the children are replaced by
ones at ``low`` (nice 10, which still yields to the relay but gets a share), and what they
held is decoded again by those.

Linux only (``/proc/<pid>/stat``), as SCHED_IDLE is; elsewhere nothing is watched.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from relay.stages.decode_inflight import DecodeChild

#: How often the children are looked at.
CHECK_S = 0.5
#: Work pending this long without an answer, runnable all along, with less than
#: MIN_CPU_SHARE of it on a CPU while the relay used less than MAX_OWN_SHARE: starved.
STARVED_AFTER_S = 3.0
MIN_CPU_SHARE = 0.1
MAX_OWN_SHARE = 0.5
#: Two looks further apart than this: this process was not running (stopped, frozen).
GAP_S = 3 * CHECK_S

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

log = logging.getLogger("relay.decode_worker")


def sample(pid: int) -> tuple[float, str] | None:
    """(CPU time used so far, user + system, in seconds; scheduling state of its main thread,
    ``R`` when running or runnable) of process ``pid``; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # Fields after the command (in parentheses, which may hold anything): state is field 3,
    # utime and stime fields 14 and 15.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) * _TICK_S, fields[0].decode("ascii", "replace")
    except (IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    got = sample(pid)
    return None if got is None else got[0]


def watchable() -> bool:
    return sample(os.getpid()) is not None


class StarvationWatch:
    """A daemon thread that calls ``on_starved(child, waited_s, cpu_s)`` for a starved child
    of ``children()`` (those at ``idle`` priority), until ``stop`` is set or ``children()``
    answers None (the owner no longer runs any at ``idle``)."""

    def __init__(self, children: Callable[[], list[DecodeChild] | None],
                 on_starved: Callable[[DecodeChild, float, float], None], stop: threading.Event | None) -> None:
        self._children = children
        self._on_starved = on_starved
        self._stop = stop
        #: Per child (the object: a new child may get a dead one's pid): (since, its CPU then,
        #: answers then, this process's CPU then) of the work it has without an answer.
        self._since: dict[DecodeChild, tuple[float, float, int, float]] = {}
        self._last: float | None = None
        self._thread = threading.Thread(target=self._run, name="decode-starvation-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        assert self._stop is not None
        failed = False
        while not self._stop.wait(CHECK_S):
            children = self._children()
            if children is None:
                return
            try:
                self.check(children, time.monotonic())
            except Exception as err:  # noqa: BLE001 - the watch goes on; said once
                if not failed:
                    failed = True
                    log.warning("decode_starvation_watch_failed", exc_info=err)

    def check(self, children: list[DecodeChild], now: float) -> None:
        if self._last is not None and now - self._last > GAP_S:
            self._since.clear()  # this process did not run meanwhile: nobody starved anybody
        self._last = now
        own = cpu_seconds(os.getpid())
        live = set()
        for child in children:
            live.add(child)
            got = None if child.dead or not child.pending else sample(child.proc.pid)
            if got is None or got[1] != "R" or own is None:  # no work, gone, or waiting on something else
                self._since.pop(child, None)
                continue
            cpu = got[0]
            since = self._since.get(child)
            if since is None or since[2] != child.answers:  # new work, or an answer since
                self._since[child] = (now, cpu, child.answers, own)
                continue
            waited, used, own_used = now - since[0], cpu - since[1], own - since[3]
            if waited >= STARVED_AFTER_S and used < MIN_CPU_SHARE * waited and own_used < MAX_OWN_SHARE * waited:
                self._since.pop(child, None)
                self._on_starved(child, waited, used)
        for child in list(self._since):
            if child not in live:
                del self._since[child]
