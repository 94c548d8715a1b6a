"""Decode one Kafka record value into a :class:`LineageEvent`, or say exactly why not.

Contract of :func:`decode_record`:

* It never raises for bad input: every record becomes a ``LineageEvent`` or a
  ``Rejection`` whose ``reason`` is one of :data:`REASONS` and whose ``detail`` names the
  field and what was wrong with it.
* JSON input keeps its original bytes as ``body`` (lossless, no re-encoding). Avro
  input (single-object encoding, marker ``C3 01``) is decoded by
  ``producer.codec.avro`` and re-encoded as JSON for ``body``, which is at most
  :func:`avro_body_bound` bytes (the decode worker's pipe relies on it): a record whose
  JSON would be longer is refused as :data:`TOO_LARGE` (none of the writer schema's can be).
  An integer beyond 64 bits in either is kept exactly (``doc``, digest), and the event
  marked ``big_int`` (:mod:`relay.stages.event_checks`).
* ``digest`` is the XXH3-128 of the canonical JSON (sorted keys, no whitespace), so key
  order and formatting do not make two copies of one event look different (why XXH3:
  :mod:`relay.stages.event_checks`).
* It checks what the relay itself relies on, not the whole OpenLineage JSON schema: what
  exactly, and how run ids are normalised, is :mod:`relay.stages.event_checks`' contract.
* JSON that RFC 8259's grammar allows but orjson (and the I-JSON profile, RFC 7493) does
  not, a lone UTF-16 surrogate escape (``"\\ud800"``) or a number beyond a 64-bit float
  (``1e400``), is refused as :data:`UNSUPPORTED_JSON`, not forwarded: every stage that
  rebuilds an event reads its body again with orjson, and such a value has no faithful
  form there (no character; Infinity). The dead letter keeps the bytes. So is an Avro
  record whose facet or ``extra`` JSON text holds one (the same event as JSON would be).
* An event may nest up to :data:`MAX_DEPTH` levels (objects and arrays within one another,
  the event itself being level 1); a deeper one is refused as :data:`TOO_DEEP`.

This is the per-event hot path: one parse, one canonical dump, no schema engine, and
the only regular expressions are compiled once at import.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from producer.codec.json_text import OUT_OF_RANGE, UnsupportedJson, has_big_int, unsupported
from relay.events import LineageEvent, Rejection, SourceRef
from relay.stages.event_checks import (
    INVALID_VALUE,
    MAX_DEPTH,
    MISSING_FIELD,
    TOO_DEEP,
    WRONG_TYPE,
    InvalidEvent,
    _type_name,
    check_event,
    too_deep_rejection,
)
from relay.stages.json_bytes import TooDeep, dumps

# Rejection reason codes: stable, used as the dead-letter header and a metric label. Those
# the event checks give are defined in relay.stages.event_checks, which imports nothing
# from here (no import cycle); REASONS holds them all.
EMPTY = "empty"
TOO_LARGE = "too_large"
NOT_UTF8 = "not_utf8"
INVALID_JSON = "invalid_json"
NOT_OBJECT = "not_object"
#: JSON, but not what the relay (and most collectors) can carry: a lone UTF-16 surrogate
#: escape, or a number beyond a 64-bit float (see _parse_failure).
UNSUPPORTED_JSON = "unsupported_json"
UNDECODABLE = "undecodable"
#: Decoding the record killed the decode worker, twice (see relay.stages.decode_worker).
DECODER_CRASHED = "decoder_crashed"
REASONS = frozenset(
    {EMPTY, TOO_LARGE, NOT_UTF8, INVALID_JSON, UNSUPPORTED_JSON, NOT_OBJECT, MISSING_FIELD, WRONG_TYPE,
     INVALID_VALUE, UNDECODABLE, TOO_DEEP}
)

#: Avro single-object encoding starts with these two bytes. No JSON text can: 0xC3 is a
#: UTF-8 lead byte and 0x01 is not a continuation byte, so the check is unambiguous.
AVRO_MARKER = b"\xc3\x01"
#: How many bytes of JSON one byte of an Avro record (producer.codec.avro's writer schema)
#: can become, at most, and the bytes on top for the field names of the event's own
#: record, written once each. The worst cases are ~6.7x: an input or output whose
#: namespace and name are "" and whose three facets maps are empty (11 bytes,
#: ``{"namespace":"","name":"","facets":{},"inputFacets":{},"outputFacets":{}},``), and a
#: string of control characters (``\x01`` is ``\u0001``, 6 bytes). Nulls cost a byte and
#: write nothing; a facet's JSON text grows only by its numbers (``9e15`` is
#: ``9000000000000000.0``, 4.5x). tests/relay/stages/test_decode_worker_avro.py checks them.
AVRO_JSON_GROWTH = 8
AVRO_JSON_SLACK = 4096


def avro_body_bound(size: int) -> int:
    """The longest JSON ``body`` an Avro record of ``size`` bytes decodes to."""
    return AVRO_JSON_GROWTH * size + AVRO_JSON_SLACK


def decode_record(
    value: bytes | None, *, max_bytes: int, source: SourceRef | None = None
) -> LineageEvent | Rejection:
    """Decode and validate one record value; see the module docstring for the contract.

    ``max_bytes`` is checked before any parsing so an oversized record costs nothing.
    ``source`` is copied onto the event for logging and dead-lettering.
    """
    found = decode_fields(value, max_bytes=max_bytes)
    if type(found) is Rejection:
        return found
    doc, body, kind, digest, event_time, _text, run_id, event_type, job_namespace, job_name, parent_run_id, \
        big_int = found
    event = LineageEvent(kind, doc, body, digest, event_time, run_id, event_type, job_namespace, job_name,
                         parent_run_id, source)
    if big_int:
        event.big_int = True
    return event


def decode_fields(value: bytes | memoryview | None, *, max_bytes: int) -> Rejection | tuple[Any, ...]:
    """What :func:`decode_record` finds, as a plain tuple rather than a LineageEvent:
    ``(doc, body, kind, digest, event_time, event_time_text, run_id, event_type,
    job_namespace, job_name, parent_run_id, big_int)``, or the same Rejection.

    ``event_time_text`` is ``eventTime`` normalised (upper case, fraction cut to
    microseconds) so that :func:`event_time_from_text` gives back ``event_time`` exactly,
    offset included: the decode worker sends it instead of the datetime, which costs
    several times more to pickle. ``value`` may be a memoryview (the decode worker's values
    are views of its input buffer); ``body`` is then that view.
    """
    if not value:
        what = "null (a tombstone?)" if value is None else "empty"
        return Rejection(EMPTY, f"record value is {what}; expected an OpenLineage event")
    size = len(value)
    if size > max_bytes:
        return Rejection(
            TOO_LARGE,
            f"record value is {size} bytes, over the limit of {max_bytes} bytes (max_bytes)",
        )
    if value[:2] == AVRO_MARKER:
        decoded = _decode_avro(value, max_bytes)
        if isinstance(decoded, Rejection):
            return decoded
        doc, body, big_int = decoded
    else:
        big_int = False
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError as err:
            return _parse_failure(value, err)
        body = value
    if not isinstance(doc, dict):
        return Rejection(
            NOT_OBJECT, f"record is {_type_name(doc)}; an OpenLineage event is a JSON object"
        )
    try:
        found = check_event(doc, body)
    except InvalidEvent as err:
        return Rejection(err.reason, err.detail)
    if big_int and not found[-1]:  # an Avro record's integer beyond 64 bits, kept by the codec
        found = (*found[:-1], True)
    return found


#: The inverse of the normalisation in :func:`decode_fields` (``event_time_text``).
event_time_from_text = datetime.fromisoformat


def _parse_failure(value: bytes | memoryview, err: orjson.JSONDecodeError) -> Rejection:
    # orjson reports bad UTF-8 as a JSONDecodeError; decoding again is only paid on failure.
    try:
        text = str(value, "utf-8")
    except UnicodeDecodeError as utf_err:
        bad = value[utf_err.start]
        return Rejection(
            NOT_UTF8,
            f"record value is not valid UTF-8: byte 0x{bad:02x} at offset {utf_err.start} "
            f"({utf_err.reason})",
        )
    if str(err).startswith("depth limit exceeded"):  # orjson reads 1024 levels
        return Rejection(TOO_DEEP, f"record value is nested more than 1024 levels deep (objects and arrays "
                                   f"within one another), over the limit of {MAX_DEPTH} levels ({err})")
    message = str(err)
    if unsupported(text, err):
        return _unsupported("record value is JSON but holds", message)
    return Rejection(INVALID_JSON, f"record value is not valid JSON: {message}")


def _unsupported(what_holds: str, message: str) -> Rejection:
    """UNSUPPORTED_JSON for orjson's refusal ``message`` of JSON text RFC 8259 allows
    (:data:`producer.codec.json_text.NOT_CARRIED`): in a JSON record, or in the JSON text
    of a facet or ``extra`` of an Avro record."""
    if message.startswith(OUT_OF_RANGE):
        what = ("a number beyond the range of a 64-bit float (read as Infinity, which JSON cannot write "
                "again; send such a value as a string)")
    else:
        what = ("a lone UTF-16 surrogate escape, such as \\ud800 (no character: PostgreSQL, Marquez's store, "
                "refuses it; Python's os.fsdecode makes them of file names that are not UTF-8)")
    return Rejection(UNSUPPORTED_JSON, f"{what_holds} {what}; RFC 8259 lets a parser refuse "
                                       f"either, I-JSON (RFC 7493) forbids both ({message})")


def _decode_avro(value: bytes | memoryview, max_bytes: int) -> tuple[Any, bytes, bool] | Rejection:
    # Imported lazily: JSON-only deployments never load the Avro codec or fastavro.
    try:
        from producer.codec import avro as avro_codec
    except ImportError as err:
        return Rejection(
            UNDECODABLE,
            f"record is Avro (single-object encoding) but the Avro codec is unavailable: {err}",
        )
    try:
        doc = avro_codec.decode(value)
    except UnsupportedJson as err:  # as the same event sent as JSON is refused
        return _unsupported(f"Avro record holds, in the JSON text of {err.where},", err.message)
    except Exception as err:  # noqa: BLE001 - any codec failure is a property of the record
        return Rejection(UNDECODABLE, f"Avro record could not be decoded: {err}")
    big_int = False
    try:
        body = orjson.dumps(doc)
    except orjson.JSONEncodeError:
        # Nested over the 254 levels orjson writes, or an integer beyond 64 bits, which the
        # codec keeps exactly: then marked big_int, as decode marks such a JSON record.
        try:
            body = dumps(doc, max_depth=MAX_DEPTH)
        except TooDeep as err:
            return too_deep_rejection(err)
        except orjson.JSONEncodeError as err:
            return Rejection(UNDECODABLE, f"Avro record holds a value JSON cannot carry: {err}")
        big_int = has_big_int(body)
    if len(body) > max_bytes:   # what collectors are sent, and held, is the JSON
        return Rejection(TOO_LARGE, f"Avro record of {len(value)} bytes is {len(body)} bytes as JSON, over the "
                                    f"limit of {max_bytes} bytes (max_bytes)")
    bound = avro_body_bound(len(value))
    if len(body) > bound:  # a writer schema that grows more than the bound says: see AVRO_JSON_GROWTH
        return Rejection(TOO_LARGE, f"Avro record of {len(value)} bytes is {len(body)} bytes as JSON, over the "
                                    f"{bound} bytes allowed for it ({AVRO_JSON_GROWTH}x its size + "
                                    f"{AVRO_JSON_SLACK})")
    return doc, body, big_int

