"""A hard limit on each test, past pytest-timeout's.

pytest-timeout's signal method arms one timer for a test's setup, call and teardown: when it
fires, the test fails, and whatever runs after it (the test's fixture teardown, a session
fixture's, the py4j or librdkafka call a broken test left waiting) runs with no limit at all. A
hang there never ends: under pytest-xdist the worker stops reporting and the run waits until
CI kills it, with no word on where it stopped.

This watchdog is faulthandler's C thread (it needs no GIL): armed for each test at its
pytest-timeout plus ``GRACE_S`` (``LINEAGE_RELAY_TEST_HARD_TIMEOUT`` overrides the whole
figure), it prints every thread's stack to the real stderr (the one pytest found at start,
not a capture) and ends the process with status 1. Under pytest-xdist that is a "worker
crashed while running <test>" failure: the run goes on and fails, naming the test.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

ENV = "LINEAGE_RELAY_TEST_HARD_TIMEOUT"
GRACE_S = 120.0
EXIT_LIMIT_S = 60.0  # plus GRACE_S: the whole exit of a worker


class HardTimeout:
    def __init__(self, stderr_fd: int) -> None:
        self._fd = stderr_fd
        self._deadline: float | None = None

    @classmethod
    def from_real_stderr(cls) -> HardTimeout:
        # Called from pytest_configure, while pytest's global capture is suspended: fd 2 is
        # the terminal (or the xdist worker's inherited stderr), not a capture file.
        return cls(os.dup(sys.__stderr__.fileno()))

    @staticmethod
    def limit_for(pytest_timeout: float | None) -> float | None:
        raw = os.environ.get(ENV)
        if raw:
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{ENV}={raw!r}: expected seconds, e.g. {ENV}=600") from None
            return value if value > 0 else None
        if not pytest_timeout or pytest_timeout <= 0:
            return None
        return pytest_timeout + GRACE_S

    def arm(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        faulthandler.dump_traceback_later(seconds, repeat=False, file=self._fd, exit=True)

    def rearm(self) -> None:
        """pytest's faulthandler plugin cancels faulthandler's one timer whenever a test fails
        (its ``pytest_exception_interact``), a pytest-timeout failure included: the rest of the
        test's time is armed again."""
        if self._deadline is not None:
            self.arm(max(self._deadline - time.monotonic(), 0.001))

    def disarm(self) -> None:
        self._deadline = None
        faulthandler.cancel_dump_traceback_later()

    def dump_on(self, signum: int) -> None:
        """Every thread's stack to the real stderr on ``signum``, the process going on: what
        .ci/run sends the whole run when it outlasts its limit, to say where each process was."""
        faulthandler.register(signum, file=self._fd, all_threads=True, chain=False)

    def guard_forks(self) -> None:
        """CPython 3.11's faulthandler has no fork handler: a child forked while the timer
        runs inherits its thread's lock held, and hangs for ever at its first cancel or arm,
        or its normal exit (which cancels). The timer is stopped around each fork (also
        subprocess's with a ``preexec_fn``) and armed again in the parent, for what is left."""
        os.register_at_fork(before=self._before_fork, after_in_parent=self.rearm,
                            after_in_child=self._in_child)

    def _before_fork(self) -> None:
        if self._deadline is not None:
            faulthandler.cancel_dump_traceback_later()

    def _in_child(self) -> None:
        self._deadline = None   # the child has no timer: the parent's limit is not its own

    def arm_for_exit(self) -> None:
        """From pytest_unconfigure on: faulthandler's timer runs until the interpreter's very
        end, past atexit handlers and the join of non-daemon threads."""
        limit = self.limit_for(EXIT_LIMIT_S)
        if limit is not None:
            self.arm(limit)
