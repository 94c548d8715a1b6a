"""Waiting for an os.fork() child of the test process with a bound.

A child forked from a pytest-xdist worker holds the worker's pipes to the controller: one
that hangs (a lock another thread held at the fork) must be killed, not waited for without
end (``os.waitpid(pid, 0)``), and one must never return into pytest (:func:`run_in_child`)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable


def exit_status(pid: int, timeout_s: float) -> int | str:
    """The child's exit code; "hung" (and the child killed and reaped) if it has not exited
    within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # SIGKILL cannot be caught: this returns
            return "hung"
        time.sleep(0.01)  # ok: the poll interval of a wait with a deadline


def run_in_child(body: Callable[[], int]) -> None:
    """In an os.fork() child: run ``body()`` and leave with its result as exit status (9 if it
    raised, its traceback on stderr; 8 if it returned no int from 0 to 255), never returning
    into pytest."""
    code = 9
    try:
        result = body()
        code = result if isinstance(result, int) and 0 <= result <= 255 else 8
    except BaseException:  # noqa: BLE001 - the child leaves with 9 all the same
        traceback.print_exc()
    finally:
        os._exit(code)
