"""Why the driver process is ending, for the application run's end: FAIL when it dies on an
uncaught exception or leaves with a failing exit status, COMPLETE otherwise.

* An uncaught exception reaches ``sys.excepthook`` (ours passes it on to the previous one).
* A ``SystemExit`` never does, and by the time ``atexit`` handlers run the interpreter has
  taken its status and dropped it. Its status fails when it is not 0 or None (a message is
  status 1), and schedulers read it so.

  Python 3.12+: seen as it leaves the main module, through ``sys.monitoring``'s PY_UNWIND
  event (called only when a frame is left by an exception, so the job pays nothing until
  one unwinds): ``sys.exit(n)``, ``raise SystemExit(n)``, ``exit(n)``, at any depth. One
  the job catches does not end the process and does not count.

  Python 3.11 has no such event: a ``raise SystemExit(n)`` written out leaves no trace
  that Python code can read, short of ``sys.settrace``/``sys.setprofile`` on the main thread,
  which would put every instruction of the job on the interpreter's slow tracing path. There
  only ``sys.exit`` is seen, by wrapping it; a status it is called with on the main thread
  counts even if the job catches the SystemExit. The same wrapper is the fallback where the
  main module cannot be watched (an interactive shell or notebook, no free monitoring tool).
"""

from __future__ import annotations

import sys
import threading
from types import CodeType
from typing import Any

#: ``sys.monitoring`` tool ids with no conventional owner (0-2 and 5 are the debugger's,
#: coverage's, the profiler's and the optimizer's).
_TOOL_IDS = (4, 3)


class DriverExit:
    """Watches how the driver ends; :attr:`failure` is what makes it a failure, or None."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self._prev_excepthook: Any = None
        self._orig_exit: Any = None
        self._tool: int | None = None
        self._main_code: CodeType | None = None

    def watch(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if not self._watch_main_module():
            self._orig_exit = sys.exit
            sys.exit = self._exit

    def unwatch(self) -> None:
        """Undo :meth:`watch` (what is no longer ours, someone else's hook, is left alone)."""
        if sys.excepthook == self._excepthook and self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
        if sys.exit == self._exit and self._orig_exit is not None:
            sys.exit = self._orig_exit
        tool, self._tool = self._tool, None
        if tool is not None:
            monitoring = sys.monitoring
            try:
                monitoring.set_events(tool, 0)
                monitoring.register_callback(tool, monitoring.events.PY_UNWIND, None)
                monitoring.free_tool_id(tool)
            except ValueError:   # freed by someone else meanwhile: nothing of ours is left
                pass

    def _watch_main_module(self) -> bool:
        monitoring = getattr(sys, "monitoring", None)
        self._main_code = _main_module_code()
        if monitoring is None or self._main_code is None:
            return False
        for tool in _TOOL_IDS:
            try:
                monitoring.use_tool_id(tool, "lineage-relay driver exit")
            except ValueError:   # taken by another tool
                continue
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, self._unwound)
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
            self._tool = tool
            return True
        return False

    def _unwound(self, code: CodeType, instruction_offset: int, exc: BaseException) -> None:
        # Called for every frame any thread leaves by an exception: the first test is the cheap one.
        if code is self._main_code and isinstance(exc, SystemExit) and _fails(exc.code):
            self.failure = exc

    def _excepthook(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        self.failure = exc
        (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    def _exit(self, status: object = None) -> None:
        """``sys.exit``: the job's exit, unchanged; a failing status on the main thread (which
        ends the process, unless the job catches it) is kept."""
        if threading.current_thread() is threading.main_thread() and _fails(status):
            self.failure = SystemExit(status)
        if self._orig_exit is None:
            raise SystemExit(status)
        self._orig_exit(status)


def _fails(status: object) -> bool:
    try:
        return status is not None and bool(status != 0)
    except Exception:  # noqa: BLE001 - a status that cannot be compared: the job's business
        return False


def _main_module_code() -> CodeType | None:
    """The code of the ``__main__`` module the main thread runs as a program (a script,
    ``python -m``, ``python -c``); None when it runs something else at the top (an
    interactive shell, a notebook kernel), where a SystemExit does not end the process."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        # python -i, the pyspark shell: the statement that called us looks like a main
        # module's code, but the process goes on at a prompt after it.
        return None
    main = sys.modules.get("__main__")
    frame = sys._current_frames().get(threading.main_thread().ident)
    if main is None or frame is None:
        return None
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    for frame in reversed(frames):   # from the outermost
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame.f_code
        if frame.f_globals.get("__name__") != "runpy":   # python -m runs the module through runpy
            return None
    return None
