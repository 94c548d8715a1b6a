"""What the relay checks of a parsed OpenLineage event, and its content digest.

:func:`~relay.stages.decode.decode_fields` hands every JSON object it parsed (or decoded
from Avro) to :func:`check_event`, which returns what the relay needs of it or raises
:class:`InvalidEvent`, turned into a ``Rejection`` there. Contract:

* It checks what the relay itself relies on (event kind, base fields, run and job
  identity, ``eventType``, ``eventTime``, container types), not the whole OpenLineage
  JSON schema: facet contents are the collectors' business. Namespaces and names (of
  ``job``, ``dataset``, each input and output) are strings, empty or not, as the spec has
  them (no ``minLength``): refusing an empty one would dead-letter spec-valid events, and
  would make an event with a valid ``dataset`` and a ``job`` of empty names a DatasetEvent
  where the spec's ``oneOf`` refuses it (it is both kinds). An optional field that is
  present must have the schema's type (``null`` is not an absent field). Container types
  include each facets object the spec defines (``run.facets``, ``job.facets``,
  ``dataset.facets``, an input's ``facets``/``inputFacets``, an output's
  ``facets``/``outputFacets``) and its values: each facet is an object, whatever it holds.
* Each refusal's ``detail`` names the field and what was wrong with it; its ``reason`` is
  one of the codes below, which :data:`relay.stages.decode.REASONS` includes.
* Run ids are lower-cased so one run has one key whatever case its producer used
  (``doc`` and ``body`` keep the original spelling).
* An integer beyond 64 bits (orjson reads one as the nearest float) is kept exactly in
  the returned ``doc`` and in the canonical JSON the digest is taken of, and the last
  field returned (``big_int``) is True (rarely too for a string that looks like one, as
  ``"1e+19 18446744073709551616"`` does): what parses ``body`` again must use
  :func:`relay.stages.json_bytes.loads` (or ``exact``) to keep it. When False, those read
  nothing ``orjson.loads(body)`` does not, so rebuilds skip their scan of the bytes.
* The digest (:data:`content_digest`) is the XXH3-128 of the canonical JSON. XXH3 is not
  a cryptographic hash: two different events could be made to collide on purpose, but only
  by someone who can already write to the topic (and could as well send a run's terminal
  event early), and only against content they can predict, run id and event time
  included. It costs a sixth of SHA-256 on a 3.5 KB event (0.6 against 3.3 us).

This is the per-event hot path: the valid path makes few function calls (the helpers
that name an error run only when a field is wrong), and the only regular expressions are
compiled once at import.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson
import xxhash

from relay.events import EVENT_TYPES, Rejection
from relay.stages.json_bytes import TooDeep, dumps, dumps_deep, exact, may_hold_big_int

# Rejection reason codes these checks give: stable, used as the dead-letter header and a
# metric label. The others are relay.stages.decode's, whose REASONS holds them all.
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
INVALID_VALUE = "invalid_value"
#: Nested deeper than MAX_DEPTH levels.
TOO_DEEP = "too_deep"

#: The deepest nesting accepted, the event object being level 1. The relay reads events
#: again with orjson, which reads 1024 levels, and nests them up to 4 levels deeper in its
#: run state (relay.state.records) and 1 in a batch body: those must read back. It is also
#: Jackson's default limit (StreamReadConstraints), which Java collectors such as Marquez
#: apply. Deeper than 254 levels, orjson cannot write an event: see relay.stages.json_bytes.
MAX_DEPTH = 1000

_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# RFC 3339 (the spec's "date-time"; its ABNF has a T, not the space its prose allows, and
# JSON Schema validators and Java's parsers refuse one). The offset is optional here only
# so that a naive time gets its own, clearer message. Any number of fraction digits: Java emits nanos.
_EVENT_TIME = re.compile(
    r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)?",
    re.ASCII,
)

#: The content digest of canonical JSON (dedupe, run state).
content_digest = xxhash.xxh3_128_digest
_MISSING: Any = object()
_NO_FACETS: dict[str, Any] = {}
_JSON_TYPES = {
    dict: "an object", list: "an array", str: "a string", int: "a number",
    float: "a number", bool: "a boolean", type(None): "null",
}
_EVENT_TYPE_LIST = ", ".join(sorted(EVENT_TYPES))


class InvalidEvent(Exception):
    """Internal control flow only: turned into a Rejection before decode_record returns."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail


def check_event(doc: dict[str, Any], body: bytes) -> tuple[Any, ...]:
    # Each check reads the field once and calls the helper, which names the error, only
    # when the field is not what it must be: the valid path makes few function calls.
    run_id = event_type = job_namespace = job_name = parent_run_id = None
    get = doc.get
    run = get("run", _MISSING)
    if run is not _MISSING and ("job" in doc or "dataset" not in doc):  # else a DatasetEvent with extra fields
        kind = "run"
        if type(run) is not dict:
            _require_object(run, "run")
        run_id = run.get("runId")
        if type(run_id) is not str:
            _string(run, "runId", "run.runId")
        if _UUID.fullmatch(run_id) is None:
            raise InvalidEvent(
                INVALID_VALUE,
                f"`run.runId` must be a UUID (8-4-4-4-12 hex digits), got {_show(run_id)}",
            )
        run_id = run_id.lower()
        run_facets = run.get("facets", _MISSING)
        if run_facets is _MISSING:
            run_facets = None
        elif type(run_facets) is not dict:
            _optional(run, "facets", "run.facets", dict)
        else:
            for facet in run_facets.values():
                if type(facet) is not dict:
                    _facet_values(run_facets, "run.facets")
        job = get("job", _MISSING)
        if type(job) is not dict:
            _require_object(_field(doc, "job", "job"), "job")
        event_type = _event_type(doc)
        parent_run_id = find_parent_run_id(run_facets)
    elif "dataset" in doc and ("job" not in doc or run is not _MISSING or _dataset_or_job(doc, body) == "dataset"):
        kind = "dataset"
        dataset = _require_object(doc["dataset"], "dataset")
        # Strings, empty or not: the spec sets no minLength (as for inputs and outputs).
        if type(dataset.get("namespace")) is not str or type(dataset.get("name")) is not str:
            _string(dataset, "namespace", "dataset.namespace")
            _string(dataset, "name", "dataset.name")
        for facet in (_optional(dataset, "facets", "dataset.facets", dict) or _NO_FACETS).values():
            if type(facet) is not dict:
                _facet_values(dataset["facets"], "dataset.facets")
        job = None
    elif "job" in doc:
        kind = "job"
        job = _require_object(doc["job"], "job")
    else:
        raise InvalidEvent(
            MISSING_FIELD,
            "event needs `run` (RunEvent), `dataset` (DatasetEvent) or `job` (JobEvent)",
        )
    if job is not None:
        # Strings, empty or not: the spec sets no minLength (as for inputs and outputs).
        job_namespace = job.get("namespace")
        if type(job_namespace) is not str:
            _string(job, "namespace", "job.namespace")
        job_name = job.get("name")
        if type(job_name) is not str:
            _string(job, "name", "job.name")
        job_facets = job.get("facets", _MISSING)
        if job_facets is not _MISSING:
            if type(job_facets) is not dict:
                _optional(job, "facets", "job.facets", dict)
            for facet in job_facets.values():
                if type(facet) is not dict:
                    _facet_values(job_facets, "job.facets")
        for key, own in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
            items = get(key, _MISSING)
            if items is _MISSING:
                continue
            if type(items) is not list:
                _optional(doc, key, key, list)
            for i, item in enumerate(items):
                if type(item) is not dict or type(item.get("namespace")) is not str or \
                        type(item.get("name")) is not str:
                    _dataset_item(item, f"{key}[{i}]")
                facets = item.get("facets", _MISSING)
                if facets is not _MISSING:
                    if type(facets) is not dict:
                        _optional(item, "facets", f"{key}[{i}].facets", dict)
                    for facet in facets.values():
                        if type(facet) is not dict:
                            _facet_values(facets, f"{key}[{i}].facets")
                facets = item.get(own, _MISSING)
                if facets is not _MISSING:
                    if type(facets) is not dict:
                        _optional(item, own, f"{key}[{i}].{own}", dict)
                    for facet in facets.values():
                        if type(facet) is not dict:
                            _facet_values(facets, f"{key}[{i}].{own}")
    event_time = get("eventTime")
    if type(event_time) is not str:
        _string(doc, "eventTime", "eventTime")
    event_time_text, event_time = _parse_event_time(event_time)
    for key in ("producer", "schemaURL"):
        value = get(key)
        if type(value) is not str or not value:
            _text(doc, key, key)
    try:
        canonical = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # Nested over the 254 levels orjson writes (it reads 1024): the same bytes, by parts.
        canonical = _deep_canonical(doc)
    big_int = False
    if may_hold_big_int(canonical):  # rare: a float of 9.2e18 or more (or such text in a string)
        exact_doc = exact(body)  # two events that differ only in such an integer are not duplicates
        if exact_doc is not None:
            big_int = True
            doc, canonical = exact_doc, dumps(exact_doc, orjson.OPT_SORT_KEYS, max_depth=MAX_DEPTH)
    return (doc, body, kind, content_digest(canonical), event_time, event_time_text, run_id,
            event_type, job_namespace, job_name, parent_run_id, big_int)


def _dataset_or_job(doc: dict[str, Any], body: bytes) -> str:
    """The kind of an event with ``dataset`` and ``job`` and no ``run``, as the spec's
    ``oneOf`` decides it: a DatasetEvent may hold any ``job`` (it only may not hold both
    ``job`` and ``run``), a JobEvent any ``dataset``, so it is the one of the two whose own
    fields pass, and refused when both pass or neither does. Rare: checks it twice."""
    errors: dict[str, InvalidEvent] = {}
    for kind, other in (("dataset", "job"), ("job", "dataset")):
        try:
            check_event({key: value for key, value in doc.items() if key != other}, body)
        except InvalidEvent as err:
            errors[kind] = err
    if not errors:
        raise InvalidEvent(INVALID_VALUE, "event is both a DatasetEvent and a JobEvent (`dataset` and `job`, no "
                                          "`run`): the spec accepts exactly one of them")
    if len(errors) == 1:
        return "job" if "dataset" in errors else "dataset"
    as_dataset, as_job = errors["dataset"], errors["job"]
    if as_dataset.detail == as_job.detail:  # a field both need (eventTime...)
        raise as_dataset
    raise InvalidEvent(as_dataset.reason, f"event has `dataset` and `job` and no `run`, and is neither a "
                                          f"DatasetEvent ({as_dataset.detail}) nor a JobEvent ({as_job.detail})")


def _deep_canonical(doc: dict[str, Any]) -> bytes:
    try:
        return dumps_deep(doc, orjson.OPT_SORT_KEYS, max_depth=MAX_DEPTH)
    except TooDeep as err:
        rejection = too_deep_rejection(err)
        raise InvalidEvent(rejection.reason, rejection.detail) from None
    except orjson.JSONEncodeError as err:
        raise InvalidEvent(INVALID_VALUE, f"event cannot be canonicalised: {err}") from None


def too_deep_rejection(err: TooDeep) -> Rejection:
    return Rejection(TOO_DEEP, f"event is nested {err.depth} levels deep (objects and arrays within one another), "
                               f"over the limit of {err.limit} levels")


def _event_type(doc: dict[str, Any]) -> str | None:
    event_type = doc.get("eventType", _MISSING)
    if event_type is _MISSING:
        return None
    if not isinstance(event_type, str):
        raise InvalidEvent(
            WRONG_TYPE, f"`eventType` must be a string, got {_type_name(event_type)}"
        )
    if event_type not in EVENT_TYPES:
        raise InvalidEvent(
            INVALID_VALUE,
            f"`eventType` must be one of {_EVENT_TYPE_LIST}, got {_show(event_type)}",
        )
    return event_type


def find_parent_run_id(run_facets: dict[str, Any] | None) -> str | None:
    # Informational only, so a malformed parent facet is ignored rather than rejected.
    if not run_facets:
        return None
    parent = run_facets.get("parent")
    if not isinstance(parent, dict):
        return None
    parent_run = parent.get("run")
    if not isinstance(parent_run, dict):
        return None
    parent_id = parent_run.get("runId")
    return parent_id.lower() if isinstance(parent_id, str) else None


def _parse_event_time(text: str) -> tuple[str, datetime]:
    """RFC 3339 date-time with a mandatory offset; fraction digits beyond microseconds
    are truncated (not rounded), so nanosecond timestamps never move to a later second.
    Returns the text :func:`datetime.fromisoformat` read (see ``event_time_text``) and
    the datetime."""
    if _EVENT_TIME.fullmatch(text) is None:
        raise InvalidEvent(
            INVALID_VALUE,
            f"`eventTime` must be an ISO-8601 date-time such as 2024-01-01T12:00:00.000Z, "
            f"got {_show(text)}",
        )
    iso = text
    # 26 = len("YYYY-MM-DDTHH:MM:SS.ffffff"); cut extra fraction digits before the offset
    # ourselves rather than rely on how a given Python version treats them.
    if len(iso) > 26 and iso[19] == ".":
        end = len(iso)
        if iso[-1] in "Zz":
            end -= 1
        elif iso[-6] in "+-":
            end -= 6
        if end > 26:
            iso = iso[:26] + iso[end:]
    iso = iso.upper()  # the C parser wants 'T' and 'Z'
    try:
        # The regex has vetted the shape, so the C parser is safe to use.
        parsed = datetime.fromisoformat(iso)
    except ValueError as err:
        leap = _leap_second(iso)
        if leap is None:
            raise InvalidEvent(
                INVALID_VALUE, f"`eventTime` {_show(text)} is not a real date-time: {err}"
            ) from None
        iso, parsed = leap
    if parsed.tzinfo is None:
        raise InvalidEvent(
            INVALID_VALUE,
            f"`eventTime` has no timezone offset (add Z or +HH:MM), got {_show(text)}",
        )
    return iso, parsed


def _leap_second(iso: str) -> tuple[str, datetime] | None:
    """A leap second, which RFC 3339 (and JSON Schema's date-time) allows at 23:59:60 UTC
    (``15:59:60-08:00`` elsewhere), as the last microsecond of its second 59: it orders
    after every time of :59 and before the next minute. None when ``iso`` is no leap second.
    Which days had one is not checked (the JSON Schema test suite does not either)."""
    if iso[17:19] != "60":
        return None
    rest = iso[19:]
    if rest.startswith("."):
        rest = rest.lstrip(".0123456789")
    iso = f"{iso[:17]}59.999999{rest}"
    try:
        parsed = datetime.fromisoformat(iso)
        utc = parsed if parsed.tzinfo is None else parsed.astimezone(UTC)  # none: refused by the caller
    except (ValueError, OverflowError):
        return None
    if (utc.hour, utc.minute) != (23, 59):
        return None
    return iso, parsed


def _field(obj: dict[str, Any], key: str, path: str) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise InvalidEvent(MISSING_FIELD, f"`{path}` is missing")
    return value


def _string(obj: dict[str, Any], key: str, path: str) -> str:
    value = _field(obj, key, path)
    if not isinstance(value, str):
        raise InvalidEvent(WRONG_TYPE, f"`{path}` must be a string, got {_type_name(value)}")
    return value


def _text(obj: dict[str, Any], key: str, path: str) -> str:
    """A required, non-empty string."""
    value = _string(obj, key, path)
    if not value:
        raise InvalidEvent(INVALID_VALUE, f"`{path}` must not be empty")
    return value


def _dataset_item(item: Any, path: str) -> None:
    """An input or output the spec would refuse: it names the field (namespace and name
    are required strings there, empty or not)."""
    obj = _require_object(item, path)
    _string(obj, "namespace", f"{path}.namespace")
    _string(obj, "name", f"{path}.name")


def _facet_values(facets: dict[str, Any], path: str) -> None:
    """A facets object holding something other than a facet object: the spec's facets
    objects (RunFacets, JobFacets, DatasetFacets...) allow only facets as their values."""
    for name, facet in facets.items():
        if type(facet) is not dict:
            name = name if len(name) <= 80 else name[:77] + "..."
            raise InvalidEvent(WRONG_TYPE, f"`{path}.{name}` must be an object (a facet), got {_type_name(facet)}")


def _require_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidEvent(WRONG_TYPE, f"`{path}` must be an object, got {_type_name(value)}")
    return value


def _optional(obj: dict[str, Any], key: str, path: str, kind: type) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        return None
    if not isinstance(value, kind):
        raise InvalidEvent(
            WRONG_TYPE, f"`{path}` must be {_JSON_TYPES[kind]}, got {_type_name(value)}"
        )
    return value


def _type_name(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
