"""A small progress bar for operations commands: count/total, rate and ETA on stderr.

On a terminal it redraws one line with ``\\r`` (at most ten times a second); elsewhere
(CI logs, pipes) it prints a line each time another 10% is done, so logs stay short.
The clock is injectable so the output can be tested without sleeping.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_WIDTH = 24
_REDRAW_EVERY_S = 0.1


def _duration(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class ProgressBar:
    """Counts work done out of ``total`` (which may grow, see :meth:`add_total`).

    ``advance`` is cheap enough to call per record. ``close`` draws the final state once
    and ends the line; calling it twice is harmless.
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.label = label
        self.total = max(0, total)
        self.count = 0
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._tty = self._stream.isatty() if tty is None else tty
        self._started = clock()
        self._last_draw = float("-inf")
        self._next_tenth = 1
        self._closed = False

    def add_total(self, n: int) -> None:
        self.total += n

    def advance(self, n: int = 1) -> None:
        if n <= 0 or self._closed:
            return
        self.count += n
        if self._tty:
            now = self._clock()
            if now - self._last_draw >= _REDRAW_EVERY_S:
                self._last_draw = now
                self._write("\r" + self.render(now))
        elif self.total and self.count * 10 >= self._next_tenth * self.total:
            self._next_tenth = min(10, self.count * 10 // self.total) + 1
            self._write(self.render(self._clock()) + "\n")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        line = self.render(self._clock())
        if self._tty:
            self._write("\r" + line + "\n")
        elif self._next_tenth <= 10 or not self.total:
            # Not printed yet at 100% (or nothing to do): show where it ended.
            self._write(line + "\n")

    def render(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = self.count / elapsed
        if self.total:
            done = min(1.0, self.count / self.total)
            filled = int(done * _WIDTH)
            bar = "#" * filled + "." * (_WIDTH - filled)
            left = self.total - self.count
            eta = _duration(left / rate) if rate > 0 and left > 0 else ("0:00:00" if left <= 0 else "?")
            return (f"{self.label} [{bar}] {self.count}/{self.total} {done * 100:3.0f}% "
                    f"{rate:,.0f}/s ETA {eta}")
        return f"{self.label} {self.count} {rate:,.0f}/s elapsed {_duration(elapsed)}"

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
