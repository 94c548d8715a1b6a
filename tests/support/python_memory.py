"""The peak of memory Python allocated while a call ran (tracemalloc): what a command
holds at once, measured in-process without sleeping or sampling."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def peak_python_memory(call: Callable[[], T]) -> tuple[T, int]:
    """``call()``'s result and the most bytes Python held meanwhile, above what it held
    before (every thread's allocations count: keep other work in the process small)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
