"""The ``lineage-relay`` command's entry point (and ``python -m relay``'s): a stop asked for
during start-up is taken at once.

In a container the relay is PID 1, and the kernel drops a signal PID 1 has no handler for:
without one, a SIGTERM in the first moments (the imports take about half a second) would be
lost, and ``docker stop`` or the kubelet would wait out the grace period and SIGKILL. So a
handler for SIGTERM and SIGINT is the first thing installed, before anything heavy is
imported: until ``run`` puts the relay's own in place (:func:`relay.cli.serve`, or the
supervisor's), either signal ends the process with exit code 0, as a stop of a running
relay does (nothing was consumed or committed yet: nothing to drain). Other commands put
the previous handlers back (:func:`release_early_stop`) as soon as the command is known,
so their own stop behaviour is unchanged. What remains is the interpreter's own start-up
(tens of milliseconds), before any Python code runs.

A signal that was ignored when the process started (a supervisor's worker ignores SIGINT,
see ``relay/__main__.py``) stays ignored.
"""

from __future__ import annotations

import signal
from types import FrameType

#: The exit code of a stop before start: a running relay's stop exits 0 too, and so does a
#: stop during its start-up (relay/startup.py). 143 ("killed by SIGTERM") would read as a
#: failure: relay.workers' supervisor counts a worker's 0 or -SIGTERM as a clean stop, not 143.
EARLY_STOP_EXIT_CODE = 0

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_previous: dict[int, object] = {}


def _stop_before_start(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(EARLY_STOP_EXIT_CODE)


def install_early_stop() -> None:
    """Make SIGTERM and SIGINT (unless ignored) exit with :data:`EARLY_STOP_EXIT_CODE`
    until a handler of the command's own replaces this one. Main thread only."""
    for sig in _SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN or current is _stop_before_start:
            continue
        _previous[sig] = current
        signal.signal(sig, _stop_before_start)


def release_early_stop() -> None:
    """Put back the handlers :func:`install_early_stop` replaced, where it is still in
    place (one the command installed since is left alone)."""
    for sig, previous in list(_previous.items()):
        if signal.getsignal(sig) is _stop_before_start:
            signal.signal(sig, previous)  # type: ignore[arg-type]
        del _previous[sig]


def main() -> int:
    """``lineage-relay``: the early stop, then :func:`relay.cli.main`."""
    install_early_stop()
    from relay.cli import main as cli_main

    return cli_main()
