"""Checks of a stage's knobs (constructor arguments), made once when the stage is built.

Each check returns the value (seconds as a float) or raises ValueError naming the knob,
what it must be and what it got; ``bool`` is never taken for a number.
"""

from __future__ import annotations

import math
from typing import Any


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def check_seconds(name: str, value: float, *, zero_ok: bool = False) -> float:
    """A finite number of seconds, positive (or also 0 with ``zero_ok``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero_ok):
        kind = "a non-negative" if zero_ok else "a positive"
        raise ValueError(f"{name} must be {kind} number of seconds, got {value!r}")
    return float(value)


def check_count(name: str, value: int) -> int:
    """A positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
