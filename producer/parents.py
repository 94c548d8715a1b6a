"""The parent (and root parent) run a producer's events name, from Spark conf or the
orchestrator's environment (used by :mod:`producer.sources` and :func:`producer.spark.enable_lineage`).

Parent and root always come from one source: Spark conf
(``spark.openlineage.parentJobNamespace``/``parentJobName``/``parentRunId``, ``rootParent*``),
else ``OPENLINEAGE_PARENT_ID``/``OPENLINEAGE_ROOT_PARENT_ID``. Both are set by whoever
launched the job, not by its lineage configuration, so a broken one costs the parent facet,
never the job or its lineage (as in the official Spark integration, which omits the facet):
an incomplete Spark parent (``parentRunId`` alone) or a run id that is not a UUID (an
unrendered ``{{ run_id }}`` template) is logged once and skipped, and the next source is used.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from producer.events import env_parent_id

log = logging.getLogger("producer.config")

Parent = tuple[str, str, str]

_SPARK = "spark.openlineage."
_KEYS = {
    "parent": ("parentJobNamespace", "parentJobName", "parentRunId"),
    "root_parent": ("rootParentJobNamespace", "rootParentJobName", "rootParentRunId"),
}
_FIELDS = ("job_namespace", "job_name", "run_id")
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def spark_parent(conf: Mapping[str, str], prefix: str) -> Parent | None:
    """The complete, valid ``spark.openlineage.<prefix>*`` run, or None (logged once when
    some of it is given but it cannot be used)."""
    keys = [_SPARK + k for k in _KEYS[prefix]]
    given = {k: str(conf[k]).strip() for k in keys if conf.get(k) is not None and str(conf[k]).strip()}
    if not given:
        return None
    missing = [k for k in keys if k not in given]
    if missing:
        _warn_once(f"event=parent_ignored keys={','.join(given)} reason={','.join(missing)} missing "
                   f"fix=set all three of {','.join(keys)} or none; the parent facet is omitted")
        return None
    namespace, name, run_id = (given[k] for k in keys)
    try:
        run_id = str(uuid.UUID(run_id))
    except ValueError:
        _warn_once(f"event=parent_ignored key={keys[2]} reason=not a UUID ({run_id!r}; an unrendered "
                   f"template?) fix=set it to the parent's run id, e.g. 0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a; "
                   f"the parent facet is omitted")
        return None
    return namespace, name, run_id


def resolve(conf: Mapping[str, str] | None, environ: Mapping[str, str]) -> tuple[Parent | None, Parent | None, str]:
    """``(parent, root, source)``: from Spark conf when it holds a usable parent, else from
    ``OPENLINEAGE_PARENT_ID`` (root only with its parent, from the same source)."""
    conf = conf or {}
    parent = spark_parent(conf, "parent")
    root = spark_parent(conf, "root_parent")
    if parent is not None:
        return parent, root, "spark"
    if root is not None and not any(conf.get(_SPARK + key) for key in _KEYS["parent"]):
        _warn_once(f"event=parent_ignored keys={_SPARK}rootParent* reason=a root parent without "
                   f"{_SPARK}parent* fix=set the parent run too; the parent facet is omitted")
    parent = env_parent_id("OPENLINEAGE_PARENT_ID", environ)
    if parent is None:
        return None, None, "env"
    return parent, env_parent_id("OPENLINEAGE_ROOT_PARENT_ID", environ), "env"


def parent_values(conf: Mapping[str, str] | None, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """:func:`resolve` as ProducerConfig fields: ``{field: (value, where it came from)}``."""
    parent, root, source = resolve(conf, environ)
    out: dict[str, tuple[str, str]] = {}
    for prefix, run, var in (("parent", parent, "OPENLINEAGE_PARENT_ID"),
                             ("root_parent", root, "OPENLINEAGE_ROOT_PARENT_ID")):
        if run is None:
            continue
        for name, key, value in zip(_FIELDS, _KEYS[prefix], run):
            out[f"{prefix}_{name}"] = (value, _SPARK + key if source == "spark" else f"env {var}")
    return out
