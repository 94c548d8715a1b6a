"""How a ``lineage_job`` run ends: the terminal event type an exception gives, and the FAIL
event's bounded ``errorMessage`` facet.

* No exception, or a ``SystemExit`` that ends the process with status 0: COMPLETE.
* The run was stopped, not failed: ABORT, without an ``errorMessage`` (the spec's ABORT is a
  run that stopped abnormally; the official Dagster integration sends ABORT for a cancelled
  run): ``GeneratorExit`` (a generator closed before its end), ``asyncio.CancelledError`` (a
  cancelled task, ``asyncio.wait_for``/``asyncio.timeout`` expiring around it) and
  ``KeyboardInterrupt`` (Ctrl-C: the user stopped it; the job did not fail).
* Anything else: FAIL, with the error and its stack trace.
"""

from __future__ import annotations

import os
import struct
import sys
import traceback

from producer import events

#: Bounds of the FAIL event's ErrorMessageRunFacet, in characters (a character may take up to
#: 6 bytes in JSON): a huge exception message (a whole payload in a ValueError) must not make
#: the FAIL event too large for Kafka (``message.max.bytes``, 1 MB by default) and lose it.
MAX_ERROR_MESSAGE_CHARS = 4_096
MAX_STACK_TRACE_CHARS = 32_768


def terminal_event_type(exc: BaseException | None) -> str:
    """COMPLETE, ABORT or FAIL for a run ended by ``exc`` (None: it returned)."""
    if exc is None or (isinstance(exc, SystemExit) and exit_succeeds(exc.code)):
        # sys.exit(0) / sys.exit() (click and other CLIs end a successful command so) is
        # a success for the process and its scheduler, as the Spark capture reads it too.
        return "COMPLETE"
    if is_stop(exc):
        return "ABORT"
    return "FAIL"


def is_stop(exc: BaseException) -> bool:
    """Whether ``exc`` stops the run rather than fails it (see the module's docstring)."""
    if isinstance(exc, (GeneratorExit, KeyboardInterrupt)):
        return True
    asyncio = sys.modules.get("asyncio")   # not imported: nothing can have raised its CancelledError
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def _safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what ``traceback`` prints when that raises (a broken ``__str__``)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - lineage must never break the job
        return "<exception str() failed>"


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _stack_trace(exc: BaseException) -> str:
    """The formatted traceback, each part (a frame, an exception's message) at most
    :data:`MAX_ERROR_MESSAGE_CHARS`, and at most :data:`MAX_STACK_TRACE_CHARS` in all: its
    tail, where the innermost frames and the exception are."""
    try:
        parts = traceback.format_exception(exc)
    except Exception:  # noqa: BLE001 - a traceback that cannot be formatted costs the stack only
        return ""
    text = "".join(_head(part, MAX_ERROR_MESSAGE_CHARS) for part in parts)
    if len(text) <= MAX_STACK_TRACE_CHARS:
        return text
    marker = f"[... {len(text) - MAX_STACK_TRACE_CHARS} characters of the stack trace left out]\n"
    return marker + text[len(text) - MAX_STACK_TRACE_CHARS:]


def error_facet(exc: BaseException) -> dict:
    return events.facet("ErrorMessageRunFacet", {
        "message": _head(f"{type(exc).__name__}: {_safe_str(exc)}", MAX_ERROR_MESSAGE_CHARS),
        "programmingLanguage": "python",
        "stackTrace": _stack_trace(exc),
    })


#: CPython exits with ``(int)PyLong_AsLong(code)``: a C long, then the OS keeps the low byte
#: (POSIX) or 32 bits (Windows) of the status; an int out of a long's range exits with -1.
_LONG_BITS = 8 * struct.calcsize("l")
_STATUS_MASK = 0xFFFFFFFF if os.name == "nt" else 0xFF


def exit_succeeds(status: object) -> bool:
    """Whether ``SystemExit(status)`` ends the process with exit status 0, as CPython decides:
    None, or an int (bool included) whose status bits are 0 (0, False, 256 on POSIX).
    Anything else (a message, 0.0, "0") is printed and exits with 1."""
    if status is None:
        return True
    if not isinstance(status, int):
        return False
    value = int.__index__(status)   # the int's own value, as C reads it (a subclass's __eq__ aside)
    return -(1 << (_LONG_BITS - 1)) <= value < (1 << (_LONG_BITS - 1)) and value & _STATUS_MASK == 0
