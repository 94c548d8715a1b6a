"""``lineage_job``'s arguments, checked and normalised where it is constructed: a mistake in
them raises ValueError there, never into the job at its entry.

* ``parent=``/``root_parent=``: ``(namespace, job name, run id)`` (the run id a UUID string
  or a ``uuid.UUID``) or ``"<namespace>/<job name>/<run id>"``; ``root_parent=`` needs
  ``parent=``.
* ``run_facets["parent"]``: a ParentRunFacet, whose job, run id and root are the run's parent
  and root (it cannot be given together with ``parent=``/``root_parent=``).
* Facets and datasets: openlineage-python objects are converted with its ``Serde.to_dict``;
  what JSON cannot carry raises (the run's events would all be dropped as unencodable).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from producer import events
from producer.event_values import check_encodable, plain
from producer.events import parse_parent_id

Parent = tuple[str, str, str]


def _job_type_facet(job_type: str | dict) -> dict:
    fields = ({"processingType": "BATCH", "integration": "PYTHON", "jobType": job_type}
              if isinstance(job_type, str) else dict(job_type))
    return events.facet("JobTypeJobFacet", fields)


def _nominal_time_facet(nominal: datetime | float | tuple) -> dict:
    start, end = nominal if isinstance(nominal, tuple) else (nominal, None)
    fields = {"nominalStartTime": events.iso(start)}
    if end is not None:
        fields["nominalEndTime"] = events.iso(end)
    return events.facet("NominalTimeRunFacet", fields)


def _json_arg(value: Any, what: str) -> Any:
    """A facets or datasets argument with openlineage-python objects converted; ValueError when
    it cannot be sent (construction-time misuse: the run's events would all be dropped)."""
    value = plain(value, what)
    check_encodable(value, what)
    return value


def _parent_from_facet(facet: Any) -> tuple[Parent, Parent | None]:
    """The parent and root runs a ``run_facets["parent"]`` ParentRunFacet names."""
    try:
        parent = (facet["job"]["namespace"], facet["job"]["name"], facet["run"]["runId"])
        root = facet.get("root") or None
        top = None if root is None else (root["job"]["namespace"], root["job"]["name"], root["run"]["runId"])
    except (KeyError, TypeError, AttributeError):
        raise ValueError("run_facets['parent'] must be a ParentRunFacet ({'job': {'namespace', 'name'}, "
                         "'run': {'runId'}}, optionally 'root' alike): build it with events.parent_facet()") from None
    return _parent_arg(parent, "run_facets['parent']"), _parent_arg(top, "run_facets['parent'] root")


def _parent_arg(value: Parent | str | None, what: str) -> Parent | None:
    """A ``parent=`` / ``root_parent=`` argument as ``(namespace, name, run_id)``, the run id in
    canonical form; raises ValueError (construction-time misuse) when it is not one."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_parent_id(value)
    if isinstance(value, (tuple, list)) and len(value) == 3:
        namespace, name, run_id = value
        if isinstance(namespace, str) and namespace and isinstance(name, str) and name:
            return namespace, name, events.check_run_id(run_id, f"{what} run id")
    raise ValueError(f"{what} must be (namespace, job name, run id) or \"<namespace>/<job name>/<run id>\", "
                     f"got {value!r}")
