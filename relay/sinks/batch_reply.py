"""What a batch endpoint's answer means for each event in the batch: pure, no I/O.

The batch endpoint and its reply are not in a released OpenLineage spec (the spec's
``OpenLineage.yml`` defines ``POST /lineage`` alone): the reply read here is the one
proposed for it (OpenLineage PR #4109: 204 when all were received, or 200 with ``{"status":
"success" | "partial_success" | "failure", "summary": {...}, "failed_events": [{"index",
"reason", "retriable"}]}``) and the one OpenMetadata implements (``failedEvents``; its
``summary`` also counts ``partial`` events, written with some datasets unresolved); both
spellings are read.

:func:`read_batch_reply` turns one answer into one :class:`EventOutcome` per event:

* 2xx: each event listed as failed is ``retry`` when ``retriable`` is true, ``reject``
  (dead letter) otherwise (also when the flag is missing: an unknown failure is not retried
  forever); every other event is delivered, whatever ``status`` says (OpenMetadata answers
  ``partial_success`` for events it took with some datasets unresolved, listing none). Only
  when the reply counts more failures than it lists (``summary.failed`` above the entries
  with a valid index, entries without one, or ``status: failure`` with neither a list nor a
  count) can the failures not be placed: every event not known to have failed is re-sent
  alone (``single``; at-least-once).
  A body that is not a JSON object names no failed events: every event is delivered, the
  2xx stands. So does a body over :data:`MAX_REPLY_BYTES`, which is not read at all.
  A leading UTF-8 BOM is skipped. A body compressed although the relay asks for
  ``Accept-Encoding: identity`` (gzip, deflate; a gzip body without its Content-Encoding
  header is recognised by its first bytes) is read decompressed, up to
  :data:`MAX_REPLY_BYTES` decompressed too (a larger one is not read, as above). One that
  cannot be decompressed (corrupt, or an encoding not read here such as br) may list
  failures that cannot be seen: its events are re-sent alone (``unattributed``).
* 404, 405 or 501: there is no batch endpoint (``unsupported``): every event is re-sent
  alone, and the caller sends single events from then on.
* a retriable status (408, 429, 5xx; see the kind's classify): every event is ``retry``.
* a permanent status (other 4xx) whose body lists failed events (OpenMetadata answers 400
  so when every event of the batch failed): the listed events as for a 2xx, the others
  re-sent alone (a refusal says nothing of them). Otherwise the batch as a whole was
  refused, perhaps for one bad event; every event is re-sent alone on the single-event
  endpoint (``single``), so only the bad one is dead-lettered.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import orjson

from relay.sinks.retry import Verdict

Outcome = Literal["delivered", "retry", "reject", "single"]

#: How much of a batch reply is read. Enough for a reply listing every event of
#: the largest batch (``batch.max_events`` is at most 10,000) as failed, with ~400 bytes an
#: entry for its index, flag and reason; and little enough that ``batch.max_requests`` (at
#: most 64) replies held at once stay bounded. A longer body, from a collector or a proxy
#: gone wrong (or endless), is not a spec reply: not read, its connection closed.
MAX_REPLY_BYTES = 4 * 1024 * 1024
#: What a batch URL answers when there is no batch endpoint behind it (as OpenLineage PR
#: #4109 proposes: 404 and 501; 405 from a server that only has other methods there).
UNSUPPORTED = frozenset({404, 405, 501})


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
    #: ``ok`` | ``partial`` | ``retry`` | ``refused`` | ``unattributed`` | ``unsupported``:
    #: a metric label ("" for a batch that was not sent).
    result: str
    note: str = ""


def read_batch_reply(status: int, body: bytes | None, count: int, classify: Callable[[int | None], Verdict],
                     scrub: Callable[[str], str] | None = None,
                     quote: Callable[[bytes], str] | None = None, encoding: str | None = None) -> BatchReading:
    """``body`` None: a body over :data:`MAX_REPLY_BYTES`, not read. ``scrub`` and ``quote``
    take the collector's credentials out of what the outcomes quote (see
    relay.sinks.auth.AnswerScrubber): the body is parsed as it came, since scrubbing it
    first changed what it said (a token ``true`` made a retriable failure delivered).
    ``encoding``: the reply's Content-Encoding header, if any."""
    reading = _read(status, body, count, classify, quote or _raw, scrub or _same, encoding)
    if scrub is None or (reading.result == "ok" and not reading.note):  # all delivered: nothing quoted
        return reading
    done: dict[int, EventOutcome] = {}  # most outcomes are one object, repeated

    def scrubbed(o: EventOutcome) -> EventOutcome:
        if not o.detail:
            return o
        clean = done.get(id(o))
        if clean is None:
            clean = done[id(o)] = EventOutcome(o.outcome, scrub(o.detail), o.status)
        return clean
    return BatchReading([scrubbed(o) for o in reading.outcomes], reading.result, scrub(reading.note))


def _read(status: int, body: bytes | None, count: int, classify: Callable[[int | None], Verdict],
          quote: Callable[[bytes], str], scrub: Callable[[str], str], encoding: str | None) -> BatchReading:
    def _snippet(body: bytes | None) -> str:  # the reply's first bytes, as quoted
        return "(not read)" if body is None else quote(body)
    if status in UNSUPPORTED:
        outcome = EventOutcome("single", f"batch endpoint answered HTTP {status}: {_snippet(body)}", status)
        return BatchReading([outcome] * count, "unsupported")
    verdict = classify(status)
    if verdict is Verdict.RETRY:
        outcome = EventOutcome("retry", f"batch answered HTTP {status}: {_snippet(body)}", status)
        return BatchReading([outcome] * count, "retry")
    undecodable = ""
    if body is not None and (encoding or body[:2] == _GZIP_MAGIC):
        body, undecodable = _decoded(body, encoding, scrub)
    if verdict is Verdict.REJECT:
        reply = _json_object(body) if body is not None else None
        if reply is not None and _failed_list(reply):
            alone = EventOutcome("single", f"batch refused with HTTP {status}, this event not listed as failed; "
                                           "sending it alone", status)
            return _per_event(reply, count, alone, status, scrub)
        outcome = EventOutcome("single", f"batch refused with HTTP {status}: {_snippet(body)}", status)
        return BatchReading([outcome] * count, "refused")
    if undecodable:  # it may list failures: none is known to have been delivered
        resend = EventOutcome("single", f"{undecodable}; sending the events alone")
        return BatchReading([resend] * count, "unattributed", undecodable)
    if body is None:
        # Read like a body that is not JSON: it names no failed events, and the collector
        # said it took the batch. Sending every event again alone instead would turn a proxy
        # that pads every answer into duplicates and one POST per event; a real partial
        # success fits under the limit. The note gets the batch logged.
        return BatchReading([DELIVERED] * count, "ok", f"reply body over {MAX_REPLY_BYTES} bytes, not read")
    reply = _json_object(body)
    if reply is None:
        return BatchReading([DELIVERED] * count, "ok")
    return _per_event(reply, count, DELIVERED, None, scrub)


def _per_event(reply: dict, count: int, unlisted: EventOutcome, status: int | None,
               scrub: Callable[[str], str]) -> BatchReading:
    """Outcomes from a reply's list of failed events; ``unlisted`` for the events it does
    not name, unless it counts failures it does not place (see the module's docstring)."""
    failed = _failed_list(reply)
    outcomes = [unlisted] * count
    placed = ignored = 0
    for entry in failed:
        index = entry.get("index") if isinstance(entry, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            ignored += 1
            continue
        reason = entry.get("reason")
        detail = f"batch item {index} failed: {reason if isinstance(reason, str) else 'no reason given'}"
        placed += outcomes[index] is unlisted
        outcomes[index] = EventOutcome("retry" if entry.get("retriable") is True else "reject", detail, status)
    counted = _summary_failed(reply)
    state = reply.get("status")
    if counted is None and not placed and isinstance(state, str) and state.lower() not in ("success", "ok"):
        # It says some failed (partial_success, failure) but neither lists them in a form
        # read here nor counts them: nothing is known to have been delivered.
        # Scrubbed before it is cut: a token cut in two is no longer found whole.
        why = f"the reply says {scrub(state)[:40]} without listing or counting failed events"
    elif ignored:
        why = f"{ignored} failed_events entries without a valid index"
    elif counted is not None and counted > placed:
        why = f"the summary counts {counted} failed, the list names {placed}"
    else:
        return BatchReading(outcomes, "partial" if placed or status is not None else "ok")
    # Some failures cannot be placed (as a collector listing only the first few would):
    # whatever is not known to have failed goes again, alone.
    resend = EventOutcome("single", f"{why}; sending the others alone", status)
    return BatchReading([resend if o is unlisted else o for o in outcomes], "unattributed", why)


def _same(text: str) -> str:
    return text


def _failed_list(reply: dict) -> list:
    failed = reply.get("failed_events", reply.get("failedEvents"))
    return failed if isinstance(failed, list) else []


#: How a gzip stream starts (RFC 1952): no JSON or text reply does.
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def _decoded(body: bytes, encoding: str | None, scrub: Callable[[str], str]) -> tuple[bytes | None, str]:
    """``body`` without its Content-Encoding ``encoding`` (gzip, deflate; a gzip body
    without the header is known by its first bytes), None when that is over
    :data:`MAX_REPLY_BYTES` (a zip bomb is not inflated past it); or why it cannot be read."""
    codings = [c for c in (c.strip().lower() for c in (encoding or "").split(",")) if c and c != "identity"]
    if not codings:
        if body[:2] != _GZIP_MAGIC:
            return body, ""
        codings = ["gzip"]  # known by its first bytes
    data: bytes | None = body
    try:
        for coding in reversed(codings):  # applied in the order listed
            if coding in ("gzip", "x-gzip"):
                data = _inflate(data, 31)
            elif coding == "deflate":  # zlib-wrapped as RFC 9110 says; some servers send it raw
                try:
                    data = _inflate(data, 15)
                except zlib.error:
                    data = _inflate(data, -15)
            else:
                return None, f"reply with Content-Encoding {scrub(coding)[:40]}, not read"
            if data is None:
                return None, ""
    except zlib.error as err:
        return None, f"reply with Content-Encoding {scrub(','.join(codings))[:60]} could not be decoded ({err})"
    return data, ""


def _inflate(data: bytes, wbits: int) -> bytes | None:
    """``data`` decompressed (gzip: every member), or None past :data:`MAX_REPLY_BYTES`."""
    out: list[bytes] = []
    size = 0
    while True:
        d = zlib.decompressobj(wbits)
        chunk = d.decompress(data, MAX_REPLY_BYTES - size + 1)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            return None
        out.append(chunk)
        if not d.eof:
            raise zlib.error("the compressed reply is cut short")
        data = d.unused_data
        if wbits != 31 or not data:
            return b"".join(out)


def _json_object(body: bytes) -> dict | None:
    if body[:3] == _BOM:  # not JSON (RFC 8259 forbids it) but some servers send it; orjson refuses it
        body = body[3:]
    if not body.strip():
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _summary_failed(reply: dict) -> int | None:
    """``summary.failed``, or None when the reply has no such count."""
    summary = reply.get("summary")
    failed = summary.get("failed") if isinstance(summary, dict) else None
    return failed if isinstance(failed, int) and not isinstance(failed, bool) else None


def _raw(body: bytes) -> str:
    return body[:300].decode("utf-8", "replace")
