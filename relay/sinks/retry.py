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


#: Other events' bare 500s allowed for each request the collector accepted between two
#: strikes of one event: a collector answering a share of all requests 500 (overload, one
#: bad node behind a load balancer) fails no event in particular.
OTHERS_FAILED_PER_ACCEPTED = 0.1


@dataclass(frozen=True, slots=True)
class CollectorRecord:
    """What a collector's requests said so far, handed to :func:`count_failure`. Requests
    are numbered as they are sent."""

    #: The number of the request that just failed.
    request: int
    #: The highest number of a request the collector accepted (0: none yet).
    last_accepted: int
    #: Requests accepted so far.
    accepted: int
    #: Requests answered a bare 500 so far (the one that just failed included).
    failed: int


@dataclass(frozen=True, slots=True)
class EventFailures:
    """What one event's failed attempts said so far (see :func:`count_failure`)."""

    #: Failed attempts, whatever the cause.
    attempts: int = 0
    #: Bare 500 answers counted against the event (see :func:`count_failure`).
    strikes: int = 0
    #: The collector's record at the last strike: its failing request's number, and the
    #: counts of accepted and failed requests then.
    mark_request: int = 0
    mark_accepted: int = 0
    mark_failed: int = 0
    #: Its own bare 500s since the last strike that did not count (not others' failures).
    own_failed: int = 0


def count_failure(seen: EventFailures, status: int | None, record: CollectorRecord,
                  poison_after: int | None) -> tuple[EventFailures, bool]:
    """One more failed attempt of one event (``status`` None: no answer): what is known of
    its failures now, and whether the collector fails on this event rather than being down
    (then it is dead-lettered instead of retried).

    A bare 500 is a strike when it is the event's first, or when, since the last strike,
    (a) the collector accepted a request sent after that strike's request (answers to
    requests sent before an outage still arrive after it began: they prove nothing), and
    (b) other requests were answered 500 at most :data:`OTHERS_FAILED_PER_ACCEPTED` times per
    request accepted (a collector failing a share of everything fails no event in
    particular). So a collector that is down, or failing at random, adds at most the
    event's first strike however long it lasts. Anything else (408, 429, 502-504, no
    answer) counts no strike and takes none away. ``poison_after`` strikes decide; None
    never does."""
    strikes, own_failed = seen.strikes, seen.own_failed
    marks = (seen.mark_request, seen.mark_accepted, seen.mark_failed)
    if status == FAILED_EVENT_STATUS and poison_after is not None:
        accepted_since = record.accepted - seen.mark_accepted
        others_failed = record.failed - seen.mark_failed - own_failed - 1
        if strikes == 0 or (record.last_accepted > seen.mark_request and accepted_since > 0
                            and others_failed <= OTHERS_FAILED_PER_ACCEPTED * accepted_since):
            strikes, own_failed = strikes + 1, 0
            marks = (record.request, record.accepted, record.failed)
        else:
            own_failed += 1
    now = EventFailures(seen.attempts + 1, strikes, *marks, own_failed)
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
