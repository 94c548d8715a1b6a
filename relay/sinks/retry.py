"""Retry policy: pure functions that decide, no I/O.

``classify`` maps one attempt's outcome to SUCCESS, RETRY or REJECT (Vector's model):
2xx succeeds; connection errors, timeouts, 408, 429 and 5xx are retried; any other
status is a permanent rejection that goes to the dead-letter topic. ``retry_after``
parses the header in both forms RFC 9110 allows. ``backoff`` is capped exponential
backoff with full jitter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime


class Verdict(enum.Enum):
    SUCCESS = "success"
    RETRY = "retry"
    REJECT = "reject"


RETRIABLE_STATUS = frozenset({408, 429})


def classify(status: int | None) -> Verdict:
    """``None`` means no HTTP answer (connection error, reset, timeout)."""
    if status is None:
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.SUCCESS
    if status in RETRIABLE_STATUS or status >= 500:
        return Verdict.RETRY
    return Verdict.REJECT


def retry_after(value: str | None, now: datetime | None = None, *, limit_s: float = 3600.0) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None
    when absent or unparsable. Capped at ``limit_s`` so a bad header cannot stall forever."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²", which isdigit() takes
        return min(float(value), limit_s)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    return min(max(0.0, (when - now).total_seconds()), limit_s)


def backoff(attempt: int, *, initial_s: float, cap_s: float, rand: Callable[[], float]) -> float:
    """Full jitter: uniform in [0, min(cap, initial * 2**(attempt-1))]; ``attempt`` >= 1."""
    ceiling = min(cap_s, initial_s * (2 ** min(attempt - 1, 62)))
    return rand() * ceiling
