"""A clock that moves only when a test moves it (``clock.now += 1``), for code that takes a
``clock`` callable: time-dependent behaviour tested without sleeping."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
