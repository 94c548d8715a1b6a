"""What a batch endpoint's answer means for each event in the batch: pure, no I/O.

The OpenLineage spec's ``POST /lineage/batch`` answers 204 (all received), or 200 with
``{"status": "success" | "partial_success", "summary": {...}, "failed_events": [{"index",
"reason", "retriable"}]}``. OpenMetadata answers the same shape with ``failedEvents`` and
``status: "failure"`` when nothing went in; both spellings are read.

:func:`read_batch_reply` turns one answer into one :class:`EventOutcome` per event:

* 2xx: each event listed as failed is ``retry`` when ``retriable`` is true, ``reject``
  (dead letter) otherwise (also when the flag is missing: an unknown failure is not retried
  forever); every other event is delivered. A reply that reports failures without saying
  which events failed (no list, entries without a valid index, or a ``summary.failed``
  above the number listed) cannot be attributed:
  every event not known to have failed is re-sent alone (``single``; at-least-once).
  A body that is not a JSON object names no failed events: every event is delivered, the
  2xx stands. So does a body over :data:`MAX_REPLY_BYTES`, which is not read at all.
* a retriable status (408, 429, 5xx; see the kind's classify): every event is ``retry``.
* a permanent status (other 4xx): the batch as a whole was refused, perhaps for one bad
  event; every event is re-sent alone on the single-event endpoint (``single``), so only
  the bad one is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import orjson

from relay.sinks.retry import Verdict

Outcome = Literal["delivered", "retry", "reject", "single"]

#: How much of a 2xx batch reply is read. Enough for the spec's reply listing every event of
#: the largest batch (``batch.max_events`` is at most 10,000) as failed, with ~400 bytes an
#: entry for its index, flag and reason; and little enough that ``batch.max_requests`` (at
#: most 64) replies held at once stay bounded. A longer body, from a collector or a proxy
#: gone wrong (or endless), is not a spec reply: not read, its connection closed.
MAX_REPLY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EventOutcome:
    outcome: Outcome
    detail: str = ""
    #: The HTTP status when the batch as a whole was answered with an error.
    status: int | None = None


DELIVERED = EventOutcome("delivered")


@dataclass(frozen=True, slots=True)
class BatchReading:
    """Per-event outcomes, in batch order, and what was odd about the reply (for the log)."""

    outcomes: list[EventOutcome]
    #: ``ok`` | ``partial`` | ``retry`` | ``refused`` | ``unattributed``: a metric label.
    result: str
    note: str = ""


def read_batch_reply(status: int, body: bytes | None, count: int,
                     classify: Callable[[int | None], Verdict]) -> BatchReading:
    """``body`` None: a 2xx body over :data:`MAX_REPLY_BYTES`, not read."""
    verdict = classify(status)
    if verdict is Verdict.RETRY:
        outcome = EventOutcome("retry", f"batch answered HTTP {status}: {_snippet(body)}", status)
        return BatchReading([outcome] * count, "retry")
    if verdict is Verdict.REJECT:
        outcome = EventOutcome("single", f"batch refused with HTTP {status}: {_snippet(body)}", status)
        return BatchReading([outcome] * count, "refused")
    if body is None:
        # Read like a body that is not JSON: it names no failed events, and the collector
        # said it took the batch. Sending every event again alone instead would turn a proxy
        # that pads every answer into duplicates and one POST per event; a real partial
        # success fits under the limit. The note gets the batch logged.
        return BatchReading([DELIVERED] * count, "ok", f"reply body over {MAX_REPLY_BYTES} bytes, not read")
    reply = _json_object(body)
    if reply is None:
        return BatchReading([DELIVERED] * count, "ok")
    failed = reply.get("failed_events", reply.get("failedEvents"))
    state = reply.get("status")
    if not isinstance(failed, list) or not failed:
        if state in ("partial_success", "failure") or _summary_failed(reply) > 0:
            outcome = EventOutcome("single", f"batch reply says {state or 'some failed'} without listing "
                                             "failed events; sending each event alone")
            return BatchReading([outcome] * count, "unattributed", "failures not listed")
        return BatchReading([DELIVERED] * count, "ok")
    outcomes = [DELIVERED] * count
    ignored = 0
    for entry in failed:
        index = entry.get("index") if isinstance(entry, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            ignored += 1
            continue
        reason = entry.get("reason")
        detail = f"batch item {index} failed: {reason if isinstance(reason, str) else 'no reason given'}"
        outcomes[index] = EventOutcome("retry" if entry.get("retriable") is True else "reject", detail)
    placed = sum(1 for o in outcomes if o is not DELIVERED)
    unlisted = _summary_failed(reply) - placed
    if ignored or unlisted > 0:
        # Some failures cannot be placed (entries without a valid index, or a summary that
        # counts more failures than the list names, as a collector listing only the first
        # few would): whatever is not known to have failed goes again, alone.
        why = (f"{ignored} failed_events entries without a valid index" if ignored else
               f"the summary counts {placed + unlisted} failed, the list names {placed}")
        resend = EventOutcome("single", f"{why}; sending the others alone")
        outcomes = [resend if o is DELIVERED else o for o in outcomes]
        return BatchReading(outcomes, "unattributed", why)
    return BatchReading(outcomes, "partial")


def _json_object(body: bytes) -> dict | None:
    if not body.strip():
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _summary_failed(reply: dict) -> int:
    summary = reply.get("summary")
    failed = summary.get("failed") if isinstance(summary, dict) else None
    return failed if isinstance(failed, int) and not isinstance(failed, bool) else 0


def _snippet(body: bytes | None) -> str:
    return "(not read)" if body is None else body[:300].decode("utf-8", "replace")
