"""Kafka message keys, identical to the official OpenLineage Kafka transports.

Keys decide the partition, and Kafka keeps order only within a partition, so:

* RunEvent -> ``run:<ns>/<name>`` of the root parent job (``run.facets.parent.root.job``)
  when the parent facet has a root, else of the parent job (``run.facets.parent.job``),
  else of the event's own job. A whole run tree (an Airflow DAG run, its tasks, their
  Spark jobs) therefore lands on one partition, in emission order.
* JobEvent -> ``job:<ns>/<name>``; DatasetEvent -> ``dataset:<ns>/<name>``.

As in openlineage-python's ``KafkaTransport``: a root whose job has an empty namespace or
name falls back to the event's own job (not to the parent). Anything that is not
recognisably one of the three kinds gets no key (``None``: the partitioner spreads it).
"""

from __future__ import annotations

from typing import Any


def _ns_name(obj: Any) -> tuple[Any, Any]:
    if isinstance(obj, dict):
        return obj.get("namespace"), obj.get("name")
    return None, None


def message_key(event: dict) -> str | None:
    """The official transports' key for ``event`` (a dict); pure, never raises."""
    if not isinstance(event, dict):
        return None
    job = event.get("job")
    if "run" in event and isinstance(job, dict):
        return _run_key(event, job)
    if isinstance(job, dict):
        ns, name = _ns_name(job)
        return f"job:{ns}/{name}"
    dataset = event.get("dataset")
    if isinstance(dataset, dict):
        ns, name = _ns_name(dataset)
        return f"dataset:{ns}/{name}"
    return None


def _run_key(event: dict, job: dict) -> str:
    own_ns, own_name = _ns_name(job)
    default = f"run:{own_ns}/{own_name}"
    run = event.get("run")
    facets = run.get("facets") if isinstance(run, dict) else None
    parent = facets.get("parent") if isinstance(facets, dict) else None
    if not isinstance(parent, dict):
        return default
    root = parent.get("root")
    if isinstance(root, dict) and root:
        ns, name = _ns_name(root.get("job"))
    else:
        ns, name = _ns_name(parent.get("job"))
    if not ns or not name:
        return default
    return f"run:{ns}/{name}"
