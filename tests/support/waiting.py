"""Waiting for a condition in async tests: poll it, fail after a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        await asyncio.sleep(0.005)  # ok: the poll interval of a wait with a deadline
