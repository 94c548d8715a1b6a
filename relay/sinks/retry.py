"""Retry policy: pure functions that decide, no I/O.

``classify`` maps one attempt's outcome to SUCCESS, RETRY or REJECT (Vector's model):
2xx succeeds; connection errors, timeouts, 408, 429 and 5xx are retried; any other
status is a permanent rejection that goes to the dead-letter topic. ``count_failure``
tells an event the collector keeps failing on (a bare 500 while it accepts other events)
from an outage. ``retry_after`` parses the header in both forms RFC 9110 allows.
``backoff`` is capped exponential backoff with full jitter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
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


#: The answer that, repeated to one event while the collector accepts others, marks that
#: event as one the collector fails on: a bare 500 (Marquez, DataHub and OpenMetadata
#: answer an exception raised while handling an event so). 502, 503 and 504 come from
#: proxies and overloaded or restarting services: outage signals, never counted.
FAILED_EVENT_STATUS = 500


@dataclass(frozen=True, slots=True)
class EventFailures:
    """What one event's failed attempts said so far (see :func:`count_failure`)."""

    #: Failed attempts, whatever the cause.
    attempts: int = 0
    #: Bare 500 answers counted against the event: its first, then each one that came after
    #: the collector accepted another event since the last one counted.
    strikes: int = 0
    #: The collector's count of accepted events when the last strike was counted.
    accepted_at: int = 0


def count_failure(seen: EventFailures, status: int | None, accepted: int,
                  poison_after: int | None) -> tuple[EventFailures, bool]:
    """One more failed attempt of one event (``status`` None: no answer): what is known of
    its failures now, and whether the collector fails on this event rather than being down
    (then it is dead-lettered instead of retried).

    ``accepted`` is how many events the collector has accepted so far (it only grows). A
    bare 500 is a strike when it is the event's first, or when the collector accepted some
    other event since the last strike: a collector that is down (its database, a bad deploy)
    answers every event 500 and accepts none in between, so however long that lasts, its
    500s count at most once more than the event's first (requests under way when it broke).
    Anything else (408, 429, 502-504, no answer) counts no strike and takes none away.
    ``poison_after`` strikes decide; None never does."""
    strikes, mark = seen.strikes, seen.accepted_at
    if status == FAILED_EVENT_STATUS and poison_after is not None and (strikes == 0 or accepted > mark):
        strikes, mark = strikes + 1, accepted
    now = EventFailures(seen.attempts + 1, strikes, mark)
    return now, poison_after is not None and strikes >= poison_after


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
