"""Which event loop a relay process runs on: ``event_loop: auto | uvloop | asyncio``.

With one event per POST the relay is bound by its event loop's one thread; uvloop (libuv)
spends less CPU per event on it than asyncio's own loop (the two are compared in
bench/README.md). ``auto`` (the default) takes uvloop when it can be imported (a dependency
everywhere but Windows, which has no uvloop build), else asyncio's loop; ``uvloop`` without
it installed is refused when the configuration is validated (``check-config`` too), naming
the key and the fix.

What the relay asks of its loop works on both: signal handlers (``add_signal_handler``), a
reader on the supervisor's life-line pipe (``add_reader``), the supervisor's subprocesses
and their pipes, ``run_in_executor`` and ``call_soon_threadsafe`` from the consumer and
decode threads, timers (``call_later``). Where the two differ, and what the relay does:

- uvloop rounds a timer to whole milliseconds of its own clock, so a ``call_later(d, ...)``
  may run up to 1 ms before ``time.monotonic()`` says ``d`` has passed. A timer that checks
  the clock when it runs must allow for that (relay/sinks/deadlines.py re-arms with slack,
  not for the remaining fraction of a millisecond).
- asyncio's loop puts the process's default SIGINT/SIGTERM handlers back when it closes;
  uvloop's leaves its own in place, bound to the closed loop, and the signals are then
  ignored. Whoever adds a signal handler removes it (``remove_signal_handler``) before
  the loop closes (relay/cli.py ``serve``, relay/workers.py ``supervise``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

T = TypeVar("T")

EventLoopSetting = Literal["auto", "uvloop", "asyncio"]
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoopSetting)


def check_setting(value: Any) -> str:
    """``value`` as a valid ``event_loop`` setting; raises ValueError naming the fix (for the
    config's validator) when it is none, or when it is ``uvloop`` and uvloop cannot be imported."""
    if not isinstance(value, str) or value not in EVENT_LOOPS:
        raise ValueError("must be auto (uvloop when installed, else asyncio), uvloop or asyncio; "
                         "fix: write event_loop: auto, or leave it out")
    if value == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError as err:
            raise ValueError(f"is uvloop, which cannot be imported here ({type(err).__name__}: {err}); fix: "
                             "pip install uvloop (it has no Windows build: asyncio there), or set "
                             "event_loop: asyncio (or auto: uvloop where installed)") from None
    return value


def resolve(setting: str) -> str:
    """The loop ``setting`` means here: ``uvloop`` or ``asyncio`` (``auto``: uvloop when it
    can be imported). A ``uvloop`` that cannot be imported raises ImportError (the config's
    validation refuses it first)."""
    if setting == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if setting == "uvloop":
            raise
        return "asyncio"
    return "uvloop"


def loop_factory(setting: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A new loop of the kind ``setting`` means (see :func:`resolve`); None: asyncio's own
    (what ``asyncio.Runner`` makes without a factory)."""
    if resolve(setting) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def new_event_loop(setting: str) -> asyncio.AbstractEventLoop:
    """A new loop of the kind ``setting`` means (for a loop run on a thread of its own)."""
    factory = loop_factory(setting)
    return factory() if factory is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], setting: str) -> T:
    """``asyncio.run(main)`` on the loop ``setting`` means."""
    with asyncio.Runner(loop_factory=loop_factory(setting)) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``uvloop`` or ``asyncio``: the kind of ``loop`` (default: the running one), for logs."""
    loop = loop if loop is not None else asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"
