"""Build OpenLineage 2-0-2 events as plain dicts, ready for ``LineageProducer.emit``.

Contract:

* Every builder returns a fresh ``dict`` of JSON types only (str, int, float, bool,
  None, list, dict) that validates against ``OpenLineage.json`` (RunEvent, DatasetEvent
  or JobEvent) provided the facet contents passed in are themselves valid.
* Builders check what is cheap and what users get wrong (event type, run id shape,
  timezone-less times, unknown standard facet names) and raise ``ValueError``; they do
  not validate facet contents against the facet schemas. Run ids are emitted in canonical
  UUID form (``str(uuid.UUID(v))``), however they were written (a ``uuid.UUID`` too).
* openlineage-python facet and dataset objects (``SchemaDatasetFacet``, ``InputDataset``...)
  may be given wherever a facet or dataset dict goes: they are converted with its
  ``Serde.to_dict`` (:func:`producer.event_values.plain`), a failure raising ``ValueError``.
* ``new_run_id()`` returns a UUIDv7 (RFC 9562): ids sort by creation time, and ids made
  by one process are strictly increasing even within one millisecond.
* Times are UTC RFC 3339 with microseconds and a ``Z`` suffix:
  ``2026-11-22T10:00:00.123456Z``; an ``event_time`` given (an aware ``datetime``, or an ISO
  8601 string with a UTC offset) is written so too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from producer.event_values import plain
from producer.facet_urls import FACET_SCHEMA_URLS

log = logging.getLogger("producer.config")

PRODUCER_URI = "https://github.com/lineage-relay/lineage-relay/tree/0.1.0/producer"

_SPEC = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
RUN_EVENT_SCHEMA_URL = f"{_SPEC}#/$defs/RunEvent"
DATASET_EVENT_SCHEMA_URL = f"{_SPEC}#/$defs/DatasetEvent"
JOB_EVENT_SCHEMA_URL = f"{_SPEC}#/$defs/JobEvent"

EVENT_TYPES = frozenset({"START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"})

# --- run ids -----------------------------------------------------------------------

_uuid_lock = threading.Lock()
_last_ms = 0
_last_seq = 0  # 12-bit rand_a used as a sub-millisecond counter (RFC 9562, method 3)


def _new_uuid_lock() -> None:
    # A fork while another thread holds the lock would leave the child's new_run_id() waiting
    # for ever on a thread the child does not have.
    global _uuid_lock
    _uuid_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_uuid_lock)


def new_run_id() -> str:
    """A new UUIDv7 as a canonical lower-case string (time-ordered, unique)."""
    global _last_ms, _last_seq
    rand = int.from_bytes(os.urandom(10), "big")
    with _uuid_lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _last_seq = ms, (rand >> 64) & 0x3FF  # leave headroom for the counter
        else:
            # Same (or an earlier, if the clock stepped back) millisecond: keep order.
            _last_seq += 1
            if _last_seq > 0xFFF:
                _last_ms, _last_seq = _last_ms + 1, 0
        ms, seq = _last_ms, _last_seq
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | (rand & (1 << 62) - 1)
    return str(uuid.UUID(int=value))


def check_run_id(run_id: str | uuid.UUID, what: str = "run_id") -> str:
    """``run_id`` in canonical form (lower-case, hyphenated): ``{...}``, ``urn:uuid:...`` and
    bare hex name the same run, and a consumer joining runs by id compares strings. A
    ``uuid.UUID`` is accepted too."""
    if isinstance(run_id, uuid.UUID):
        return str(run_id)
    try:
        return str(uuid.UUID(run_id))
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{what} must be a UUID string (use new_run_id()), got {run_id!r}") from None


_check_run_id = check_run_id


# --- times -------------------------------------------------------------------------


def utc_now_iso() -> str:
    """The current time, e.g. ``2026-11-22T10:00:00.123456Z``."""
    return iso(time.time())


def iso(ts: datetime | float) -> str:
    """An aware ``datetime`` or epoch seconds as UTC ``YYYY-MM-DDTHH:MM:SS.ffffffZ``.

    A naive ``datetime`` raises ``ValueError``: guessing its zone silently shifts lineage.
    """
    if isinstance(ts, datetime):
        if ts.tzinfo is None or ts.utcoffset() is None:
            raise ValueError(f"datetime {ts!r} has no timezone; pass an aware datetime (tzinfo=timezone.utc)")
        dt = ts.astimezone(timezone.utc)
    elif isinstance(ts, (int, float)) and not isinstance(ts, bool):
        dt = datetime.fromtimestamp(ts, timezone.utc)
    else:
        raise ValueError(f"expected an aware datetime or epoch seconds, got {type(ts).__name__}")
    # Not strftime: its %Y does not zero-pad years before 1000 on every platform (glibc).
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
            f".{dt.microsecond:06d}Z")


def event_time_iso(event_time: str | datetime | None) -> str:
    """A builder's ``event_time``: None is now; an aware ``datetime`` goes through :func:`iso`;
    a string must be an ISO 8601 date-time with a UTC offset (or ``Z``), and is written as
    :func:`iso` writes it (UTC, microseconds, ``Z``). Anything else, or a time without a
    timezone, raises ``ValueError``: the spec's ``eventTime`` is an RFC 3339 date-time."""
    if event_time is None:
        return utc_now_iso()
    if isinstance(event_time, datetime):
        return iso(event_time)
    if not isinstance(event_time, str):
        raise ValueError(f"event_time must be an aware datetime or an ISO 8601 string with a UTC offset, "
                         f"got {type(event_time).__name__}")
    try:
        parsed = datetime.fromisoformat(event_time)
    except ValueError:
        raise ValueError(f"event_time {event_time!r} is not an ISO 8601 date-time "
                         "(e.g. 2026-11-22T10:00:00Z)") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"event_time {event_time!r} has no UTC offset; add one (Z or +00:00)")
    return iso(parsed)


# --- facets ------------------------------------------------------------------------


def facet(spec_name: str, fields: dict, *, producer: str = PRODUCER_URI) -> dict:
    """A standard facet: ``fields`` plus ``_producer`` and the spec ``_schemaURL``.

    ``spec_name`` is the facet's schema definition name (``"SchemaDatasetFacet"``), not
    the key it is stored under in ``facets`` (``"schema"``). Unknown names raise ValueError.
    """
    try:
        url = FACET_SCHEMA_URLS[spec_name]
    except KeyError:
        raise ValueError(
            f"unknown standard facet {spec_name!r}; use one of {sorted(FACET_SCHEMA_URLS)} "
            "or custom_facet(fields, schema_url=...)"
        ) from None
    return {**fields, "_producer": producer, "_schemaURL": url}


def custom_facet(fields: dict, *, schema_url: str, producer: str = PRODUCER_URI) -> dict:
    """A non-standard facet; ``schema_url`` must point at the JSON schema describing it."""
    if not isinstance(schema_url, str) or not schema_url:
        raise ValueError("custom_facet needs schema_url, the URL of the facet's JSON schema")
    return {**fields, "_producer": producer, "_schemaURL": schema_url}


def parent_facet(namespace: str, name: str, run_id: str, *,
                 root: tuple[str, str, str] | None = None) -> dict:
    """A ``ParentRunFacet`` (store it under ``run_facets["parent"]``).

    ``root`` is ``(root_job_namespace, root_job_name, root_run_id)``; it is the top of the
    parent chain (e.g. the Airflow DAG run when the parent is one of its tasks).
    """
    fields: dict = {
        "run": {"runId": _check_run_id(run_id, "parent run_id")},
        "job": {"namespace": namespace, "name": name},
    }
    if root is not None:
        root_ns, root_name, root_run = root
        fields["root"] = {
            "run": {"runId": _check_run_id(root_run, "root run_id")},
            "job": {"namespace": root_ns, "name": root_name},
        }
    return facet("ParentRunFacet", fields)


def parse_parent_id(value: str) -> tuple[str, str, str]:
    """``"<namespace>/<job name>/<run id>"`` (the ``OPENLINEAGE_PARENT_ID`` format Airflow's
    ``lineage_parent_id`` macro renders) -> ``(namespace, name, run_id)``. The job name may
    contain ``/``; the run id must be a UUID. Raises ValueError otherwise."""
    namespace, sep, rest = value.partition("/")
    name, sep2, run_id = rest.rpartition("/")
    if not (sep and sep2 and namespace and name and run_id):
        raise ValueError(f"parent id {value!r} is not <namespace>/<job name>/<run id>")
    return namespace, name, _check_run_id(run_id, "parent id run id")


_ignored_parent_ids: set[str] = set()


def env_parent_id(var: str, environ: Mapping[str, str] | None = None) -> tuple[str, str, str] | None:
    """The parent run named by environment variable ``var`` (``OPENLINEAGE_PARENT_ID`` or
    ``OPENLINEAGE_ROOT_PARENT_ID``), or None when unset or malformed. It is set by a
    scheduler (Airflow's ``lineage_parent_id`` macro), not by this job's lineage config: a
    malformed one costs the parent facet, never the job or its lineage, and is logged once
    per value."""
    value = (os.environ if environ is None else environ).get(var)
    if not value:
        return None
    try:
        return parse_parent_id(value)
    except ValueError as err:
        if value not in _ignored_parent_ids:
            _ignored_parent_ids.add(value)
            log.warning("event=parent_id_ignored var=%s reason=%s fix=set it to <namespace>/<job name>/<run id> "
                        "(run id a UUID) or unset it", var, err)
        return None


# --- datasets and events -----------------------------------------------------------


def dataset(namespace: str, name: str, facets: dict | None = None, *,
            input_facets: dict | None = None, output_facets: dict | None = None) -> dict:
    """A dataset for ``inputs``/``outputs`` (or ``dataset_event``); empty facet maps are omitted.
    openlineage-python facet objects among the facets are converted to dicts (a failure raises
    ValueError)."""
    out: dict = {"namespace": namespace, "name": name}
    if facets:
        out["facets"] = plain(facets, "dataset facets")
    if input_facets:
        out["inputFacets"] = plain(input_facets, "dataset input_facets")
    if output_facets:
        out["outputFacets"] = plain(output_facets, "dataset output_facets")
    return out


def run_event(event_type: str, *, run_id: str, job_namespace: str, job_name: str,
              event_time: str | datetime | None = None, inputs: Iterable[dict] = (),
              outputs: Iterable[dict] = (), run_facets: dict | None = None,
              job_facets: dict | None = None, producer: str = PRODUCER_URI) -> dict:
    """A ``RunEvent``. ``event_time`` defaults to now (see :func:`event_time_iso`)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"event_type must be one of {sorted(EVENT_TYPES)}, got {event_type!r}")
    return {
        "eventType": event_type,
        "eventTime": event_time_iso(event_time),
        "run": {"runId": _check_run_id(run_id), "facets": dict(plain(run_facets or {}, "run_facets"))},
        "job": {"namespace": job_namespace, "name": job_name, "facets": dict(plain(job_facets or {}, "job_facets"))},
        "inputs": list(plain(list(inputs), "inputs")),
        "outputs": list(plain(list(outputs), "outputs")),
        "producer": producer,
        "schemaURL": RUN_EVENT_SCHEMA_URL,
    }


def dataset_event(dataset: dict, *, event_time: str | datetime | None = None,
                  producer: str = PRODUCER_URI) -> dict:
    """A ``DatasetEvent`` (static metadata about one dataset, no run or job)."""
    dataset = plain(dataset, "dataset")
    if not isinstance(dataset, dict) or "namespace" not in dataset or "name" not in dataset:
        raise ValueError("dataset_event needs a dataset dict with namespace and name; build it with dataset()")
    return {
        "eventTime": event_time_iso(event_time),
        "dataset": {k: v for k, v in dataset.items() if k in ("namespace", "name", "facets")},
        "producer": producer,
        "schemaURL": DATASET_EVENT_SCHEMA_URL,
    }


def job_event(*, job_namespace: str, job_name: str, event_time: str | datetime | None = None,
              inputs: Iterable[dict] = (), outputs: Iterable[dict] = (),
              job_facets: dict | None = None, producer: str = PRODUCER_URI) -> dict:
    """A ``JobEvent`` (static metadata about a job, no run)."""
    return {
        "eventTime": event_time_iso(event_time),
        "job": {"namespace": job_namespace, "name": job_name, "facets": dict(plain(job_facets or {}, "job_facets"))},
        "inputs": list(plain(list(inputs), "inputs")),
        "outputs": list(plain(list(outputs), "outputs")),
        "producer": producer,
        "schemaURL": JOB_EVENT_SCHEMA_URL,
    }


def without_facets(event: dict, names: frozenset[str] | set[str]) -> dict:
    """``event`` minus the facets named ``names`` (run, job, and each dataset's ``facets``,
    ``inputFacets``, ``outputFacets``), as the official ``facets.disabled`` setting removes
    them; the event given is not changed."""
    def strip(container: dict | None, key: str) -> dict | None:
        facets = container.get(key) if container else None
        if not facets or not names.intersection(facets):
            return container
        return {**container, key: {k: v for k, v in facets.items() if k not in names}}

    out = dict(event)
    for part in ("run", "job"):
        if isinstance(out.get(part), dict):
            out[part] = strip(out[part], "facets")
    for part, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        if isinstance(out.get(part), list):
            out[part] = [strip(strip(ds, "facets"), extra) if isinstance(ds, dict) else ds for ds in out[part]]
    return out
