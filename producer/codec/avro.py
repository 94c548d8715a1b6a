"""Avro single-object encoding of OpenLineage events: no schema registry needed.

Wire format (Avro 1.x spec, "Single object encoding")::

    C3 01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema | Avro binary

Contract:

* ``decode(encode(e)) == e`` for every JSON object ``e`` (any event, valid or not):
  values keep their JSON types (int stays int, float stays float, null stays null,
  absent stays absent), and an integer beyond 64 bits is read back as that integer
  (:func:`producer.codec.json_text.loads`; orjson alone reads the nearest float). Key
  order is not kept (JSON objects are unordered).
* The core event is typed: ``eventType`` is an enum; ``eventTime``, ``producer``,
  ``schemaURL``, the run id and job/dataset namespace and name are strings; inputs and
  outputs are arrays of ``Dataset`` records. Facets are a ``map<string>`` from facet name
  to the facet as compact JSON text, so facets of any shape, standard or custom, survive
  exactly. Whatever does not fit a typed field (unknown keys, ``null`` values, values of
  another type) is kept, as JSON object text, in the enclosing record's ``extra``.
* Why facets are JSON text and not a recursive Avro ``Json`` record: fastavro pays a few
  microseconds per record, so a recursive encoding made a typical event 4-5x slower to
  encode and decode (~170 us vs ~35 us to decode) for ~10% fewer bytes. The relay decodes
  every record, so speed won.
* :func:`decode` raises :class:`AvroDecodeError` (a ``ValueError``) saying what is wrong:
  not single-object encoded, unknown schema fingerprint (a newer writer schema), or a
  truncated, corrupt or over-long body; and its subclass :class:`UnsupportedJsonText`
  when a facet's or an ``extra``'s JSON text is JSON orjson refuses (a number beyond a
  64-bit float, such as an integer of 310 digits, or a lone UTF-16 surrogate escape: see
  :mod:`producer.codec.json_text`), as the relay refuses the same event sent as JSON.
* The schema is parsed once at import; a decode is one fastavro read and one pass over
  the facets.

The writer schema is :data:`SCHEMA` (``lineage_relay.openlineage.LineageEvent``, v1).
A future version gets a new fingerprint; add the old one to ``_READERS`` so records
already written stay readable.
"""

from __future__ import annotations

import io
from typing import Any

import orjson

from producer.codec import json_dumps, json_text
from producer.codec.json_text import has_big_int, unsupported
from producer.codec.json_text import loads as _exact_loads

try:
    import fastavro
    from fastavro.schema import to_parsing_canonical_form
except ImportError as err:  # pragma: no cover - fastavro is a core dependency
    from producer.errors import MissingDependency

    raise MissingDependency(
        "Avro encoding needs fastavro: pip install 'fastavro>=1.9,<2' (a lineage-relay dependency)"
    ) from err

MAGIC = b"\xC3\x01"
_HEADER_LEN = 10
_NS = "lineage_relay.openlineage."

EVENT_TYPES = ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]
_EVENT_TYPE_SET = frozenset(EVENT_TYPES)

_OPT_STR = ["null", "string"]
#: JSON text of an object holding the fields that did not fit the typed ones.
_EXTRA = _OPT_STR
#: Facets by name, each facet (any JSON value, normally an object) as compact JSON text.
_FACETS = ["null", {"type": "map", "values": "string"}]
_DATASET = {
    "type": "record", "name": "Dataset", "fields": [
        {"name": "namespace", "type": _OPT_STR},
        {"name": "name", "type": _OPT_STR},
        {"name": "facets", "type": _FACETS},
        {"name": "inputFacets", "type": _FACETS},
        {"name": "outputFacets", "type": _FACETS},
        {"name": "extra", "type": _EXTRA},
    ],
}

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "LineageEvent",
    "namespace": "lineage_relay.openlineage",
    "doc": "An OpenLineage RunEvent, DatasetEvent or JobEvent. 'extra' maps hold every field "
           "of their record that does not fit the typed fields.",
    "fields": [
        {"name": "eventTime", "type": _OPT_STR},
        {"name": "producer", "type": _OPT_STR},
        {"name": "schemaURL", "type": _OPT_STR},
        {"name": "eventType", "type": ["null", {"type": "enum", "name": "EventType", "symbols": EVENT_TYPES}]},
        {"name": "run", "type": ["null", {
            "type": "record", "name": "Run", "fields": [
                {"name": "runId", "type": _OPT_STR},
                {"name": "facets", "type": _FACETS},
                {"name": "extra", "type": _EXTRA},
            ]}]},
        {"name": "job", "type": ["null", {
            "type": "record", "name": "Job", "fields": [
                {"name": "namespace", "type": _OPT_STR},
                {"name": "name", "type": _OPT_STR},
                {"name": "facets", "type": _FACETS},
                {"name": "extra", "type": _EXTRA},
            ]}]},
        {"name": "inputs", "type": ["null", {"type": "array", "items": _DATASET}]},
        {"name": "outputs", "type": ["null", {"type": "array", "items": "Dataset"}]},
        {"name": "dataset", "type": ["null", "Dataset"]},
        {"name": "extra", "type": _EXTRA},
    ],
}


class AvroDecodeError(ValueError):
    """The bytes are not an event this reader can decode; the message says why."""


class UnsupportedJsonText(AvroDecodeError, json_text.UnsupportedJson):
    """A facet's or an ``extra``'s JSON text holds JSON orjson refuses (RFC 8259 allows it,
    I-JSON forbids it): a number beyond a 64-bit float, or a lone UTF-16 surrogate escape.
    ``where`` names the field (``run.facets.stats``), ``message`` is orjson's."""


# --- fingerprint -------------------------------------------------------------------

_EMPTY64 = 0xC15D213AA4D7A795


def crc64_avro(data: bytes) -> int:
    """The Avro spec's 64-bit Rabin fingerprint (CRC-64-AVRO) of ``data``."""
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


_PARSED = fastavro.parse_schema(SCHEMA)
FINGERPRINT: int = crc64_avro(to_parsing_canonical_form(_PARSED).encode("utf-8"))
_HEADER = MAGIC + FINGERPRINT.to_bytes(8, "little")
#: Every writer schema this reader can decode, keyed by the 8 fingerprint bytes as written.
_READERS: dict[bytes, dict] = {FINGERPRINT.to_bytes(8, "little"): _PARSED}

# --- encode ------------------------------------------------------------------------
# Union branches are chosen with fastavro's (name, value) tuple notation: the converter
# already knows the type, and it spares fastavro a validation pass over every subtree.


def _text(value: Any) -> str:
    # As the JSON encoding writes it (producer.codec.encode_json): non-str keys, big ints.
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")
    except orjson.JSONEncodeError:
        return json_dumps(value)


def _extra(extra: dict) -> str | None:
    return _text(extra) if extra else None


def _facets(value: Any) -> Any:
    if type(value) is not dict:
        return _NO
    return ("map", {_key(name): _text(body) for name, body in value.items()})


def _key(key: Any) -> str:
    if type(key) is str:
        return key
    # A facet name that is not a str (int, float, bool, None) is written as JSON writes it.
    return next(iter(orjson.loads(_text({key: None}))))


_NO = object()
_STR_FIELDS = frozenset({"runId", "namespace", "name"})
_FACET_FIELDS = frozenset({"facets", "inputFacets", "outputFacets"})


def _part(obj: Any, template: dict[str, Any], name: str) -> Any:
    """Fill a Run/Job/Dataset record; keys it cannot type go to its ``extra``."""
    if type(obj) is not dict:
        return _NO
    out = dict(template)
    extra = {}
    for key, value in obj.items():
        if key in out and key != "extra":
            typed = value if key in _STR_FIELDS and type(value) is str else (
                _facets(value) if key in _FACET_FIELDS else _NO)
            if typed is not _NO:
                out[key] = typed
                continue
        extra[key] = value
    out["extra"] = _extra(extra)
    return (name, out)


_RUN = {"runId": None, "facets": None, "extra": None}
_JOB = {"namespace": None, "name": None, "facets": None, "extra": None}
_DS = {"namespace": None, "name": None, "facets": None, "inputFacets": None, "outputFacets": None,
       "extra": None}


def _datasets(value: Any) -> Any:
    if type(value) is not list:
        return _NO
    parts = [_part(d, _DS, "") for d in value]
    if any(p is _NO for p in parts):
        return _NO
    return ("array", [p[1] for p in parts])


def _top(key: str, value: Any) -> Any:
    if key in ("eventTime", "producer", "schemaURL"):
        return value if type(value) is str else _NO
    if key == "eventType":
        return value if type(value) is str and value in _EVENT_TYPE_SET else _NO
    if key == "run":
        return _part(value, _RUN, _NS + "Run")
    if key == "job":
        return _part(value, _JOB, _NS + "Job")
    if key in ("inputs", "outputs"):
        return _datasets(value)
    if key == "dataset":
        return _part(value, _DS, _NS + "Dataset")
    return _NO


_TOP_TEMPLATE = {f["name"]: None for f in SCHEMA["fields"]}


def to_record(event: dict) -> dict:
    """The Avro datum (a dict for fastavro) for one event. Pure; exposed for tests."""
    if type(event) is not dict:
        raise ValueError(f"an OpenLineage event is a JSON object (dict), got {type(event).__name__}")
    record = dict(_TOP_TEMPLATE)
    extra = {}
    for key, value in event.items():
        typed = _top(key, value) if key in record and key != "extra" else _NO
        if typed is _NO:
            extra[key] = value
        else:
            record[key] = typed
    record["extra"] = _extra(extra)
    return record


def encode(event: dict) -> bytes:
    """Single-object encode one event.

    Raises ``ValueError`` when ``event`` is not a dict and ``TypeError`` when it holds a
    value JSON cannot carry (the events the JSON encoding rejects too).
    """
    buf = io.BytesIO()
    buf.write(_HEADER)
    fastavro.schemaless_writer(buf, _PARSED, to_record(event))
    return buf.getvalue()


# --- decode ------------------------------------------------------------------------


def is_single_object(data: bytes) -> bool:
    """True when ``data`` starts with the single-object marker ``C3 01`` (no JSON text can)."""
    return data[:2] == MAGIC


def peek_event_type(data: bytes) -> Any:
    """The ``eventType`` of a record of this writer schema, read from the bytes of its
    first four fields without decoding the rest (~1 us): one of :data:`EVENT_TYPES`, or
    None when the typed field is null (no ``eventType``, or one that is not an
    EVENT_TYPES string, kept in ``extra``). For a reader that only wants some types
    (relay.source.run_search). Raises :class:`AvroDecodeError` when the bytes are not such
    a record's beginning (another fingerprint, truncated): decode it to know more."""
    data = bytes(data[:4096]) if not isinstance(data, bytes) else data
    if data[:_HEADER_LEN] != _HEADER:
        raise AvroDecodeError("not a single-object record of this writer schema")
    try:
        pos = _HEADER_LEN
        for _ in range(3):  # eventTime, producer, schemaURL: union of null and string
            branch, pos = _long(data, pos)
            if branch == 1:
                size, pos = _long(data, pos)
                if size < 0:
                    raise ValueError("negative string length")
                pos += size
            elif branch != 0:
                raise ValueError(f"union branch {branch}")
        branch, pos = _long(data, pos)
        if branch == 0:
            return None
        index, pos = _long(data, pos)
        if branch != 1 or not 0 <= index < len(EVENT_TYPES):
            raise ValueError("bad eventType")
        return EVENT_TYPES[index]
    except (IndexError, ValueError) as err:
        raise AvroDecodeError(f"corrupt Avro body ({err})") from None


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro ``long`` (zig-zag varint) at ``pos``, and the position after it."""
    byte = data[pos]
    value, shift = byte & 0x7F, 7
    pos += 1
    while byte & 0x80:
        if shift > 63:
            raise ValueError("varint over 10 bytes")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        shift += 7
        pos += 1
    return (value >> 1) ^ -(value & 1), pos


def _unfacets(value: dict[str, str], loads: Any, where: str) -> dict[str, Any]:
    try:
        return {name: loads(text) for name, text in value.items()}
    except orjson.JSONDecodeError:
        # Which one, and was it JSON orjson refuses? Only on failure.
        for name, text in value.items():
            _read(text, loads, f"{where}.{name}")
        raise


def _read(text: str, loads: Any, where: str) -> Any:
    """``loads(text)``; UnsupportedJsonText when orjson refused JSON RFC 8259 allows."""
    try:
        return loads(text)
    except orjson.JSONDecodeError as err:
        if unsupported(text, err):
            raise UnsupportedJsonText(where, str(err)) from None
        raise


def _unpart(rec: dict, loads: Any, where: str) -> dict:
    out: dict[str, Any] = {}
    for key, value in rec.items():
        if value is None or key == "extra":
            continue
        out[key] = _unfacets(value, loads, f"{where}.{key}") if key in _FACET_FIELDS else value
    if rec["extra"] is not None:
        out.update(_read(rec["extra"], loads, f"{where}.extra"))
    return out


def from_record(rec: dict, *, big_ints: bool = True) -> dict:
    """Rebuild the event from a decoded Avro datum. Pure; exposed for tests.

    ``big_ints`` False reads the JSON texts with plain ``orjson.loads``: for a record
    known to hold no integer beyond 64 bits (:func:`decode` scans its bytes once)."""
    loads = _exact_loads if big_ints else orjson.loads
    out: dict[str, Any] = {}
    for key, value in rec.items():
        if value is None or key == "extra":
            continue
        if key in ("run", "job", "dataset"):
            out[key] = _unpart(value, loads, key)
        elif key in ("inputs", "outputs"):
            out[key] = [_unpart(d, loads, f"{key}[{i}]") for i, d in enumerate(value)]
        else:
            out[key] = value
    if rec["extra"] is not None:
        out.update(_read(rec["extra"], loads, "extra"))
    return out


def decode(data: bytes) -> dict:
    """Decode one single-object encoded event; see the module docstring for the contract."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise AvroDecodeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if data[:2] != MAGIC:
        raise AvroDecodeError(
            f"not Avro single-object encoded: starts with {data[:2].hex() or 'nothing'}, expected c301"
        )
    if len(data) < _HEADER_LEN:
        raise AvroDecodeError(f"truncated single-object header: {len(data)} bytes, need {_HEADER_LEN}")
    fingerprint = data[2:_HEADER_LEN]
    schema = _READERS.get(fingerprint)
    if schema is None:
        known = ", ".join(fp[::-1].hex() for fp in _READERS)
        raise AvroDecodeError(
            f"unknown Avro schema fingerprint {fingerprint[::-1].hex()} (CRC-64-AVRO); this reader "
            f"knows {known}: the record was written by a newer lineage-relay schema, upgrade the reader"
        )
    buf = io.BytesIO(data)
    buf.seek(_HEADER_LEN)
    try:
        # One scan of the record's bytes: a facet's JSON text is in them verbatim (UTF-8).
        event = from_record(fastavro.schemaless_reader(buf, schema), big_ints=has_big_int(data))
    except UnsupportedJsonText:
        raise
    except (EOFError, StopIteration, IndexError, UnicodeDecodeError, ValueError, TypeError, KeyError,
            MemoryError, OverflowError) as err:
        raise AvroDecodeError(f"corrupt Avro body ({type(err).__name__}: {err})") from err
    if buf.tell() != len(data):
        raise AvroDecodeError(f"{len(data) - buf.tell()} trailing bytes after the Avro record")
    return event
