"""Decode one Kafka record value into a :class:`LineageEvent`, or say exactly why not.

Contract of :func:`decode_record`:

* It never raises for bad input: every record becomes a ``LineageEvent`` or a
  ``Rejection`` whose ``reason`` is one of :data:`REASONS` and whose ``detail`` names the
  field and what was wrong with it.
* JSON input keeps its original bytes as ``body`` (lossless, no re-encoding). Avro
  input (single-object encoding, marker ``C3 01``) is decoded by
  ``producer.codec.avro`` and re-encoded as JSON for ``body``.
* ``digest`` is the XXH3-128 of the canonical JSON (sorted keys, no whitespace), so key
  order and formatting do not make two copies of one event look different (why XXH3:
  :mod:`relay.stages.event_checks`).
* It checks what the relay itself relies on, not the whole OpenLineage JSON schema: what
  exactly, and how run ids are normalised, is :mod:`relay.stages.event_checks`' contract.
* An event may nest up to :data:`MAX_DEPTH` levels (objects and arrays within one another,
  the event itself being level 1); a deeper one is refused as :data:`TOO_DEEP`.

This is the per-event hot path: one parse, one canonical dump, no schema engine, and
the only regular expressions are compiled once at import.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

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
UNDECODABLE = "undecodable"
#: Decoding the record killed the decode worker, twice (see relay.stages.decode_worker).
DECODER_CRASHED = "decoder_crashed"
REASONS = frozenset(
    {EMPTY, TOO_LARGE, NOT_UTF8, INVALID_JSON, NOT_OBJECT, MISSING_FIELD, WRONG_TYPE,
     INVALID_VALUE, UNDECODABLE, TOO_DEEP}
)

#: Avro single-object encoding starts with these two bytes. No JSON text can: 0xC3 is a
#: UTF-8 lead byte and 0x01 is not a continuation byte, so the check is unambiguous.
AVRO_MARKER = b"\xc3\x01"


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
        decoded = _decode_avro(value)
        if isinstance(decoded, Rejection):
            return decoded
        doc, body = decoded
    else:
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
        return check_event(doc, body)
    except InvalidEvent as err:
        return Rejection(err.reason, err.detail)


#: The inverse of the normalisation in :func:`decode_fields` (``event_time_text``).
event_time_from_text = datetime.fromisoformat


def _parse_failure(value: bytes | memoryview, err: orjson.JSONDecodeError) -> Rejection:
    # orjson reports bad UTF-8 as a JSONDecodeError; decoding again is only paid on failure.
    try:
        str(value, "utf-8")
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
    return Rejection(INVALID_JSON, f"record value is not valid JSON: {err}")


def _decode_avro(value: bytes | memoryview) -> tuple[Any, bytes] | Rejection:
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
    except Exception as err:  # noqa: BLE001 - any codec failure is a property of the record
        return Rejection(UNDECODABLE, f"Avro record could not be decoded: {err}")
    try:
        body = dumps(doc, max_depth=MAX_DEPTH)
    except TooDeep as err:
        return too_deep_rejection(err)
    except orjson.JSONEncodeError as err:
        return Rejection(UNDECODABLE, f"Avro record holds a value JSON cannot carry: {err}")
    return doc, body

