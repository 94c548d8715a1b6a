"""The parent (and root parent) run a producer's events name, from Spark conf, the Spark
integration's other sources or the orchestrator's environment (used by :mod:`producer.sources`
and :func:`producer.spark.enable_lineage`).

Parent and root always come from one source, the first that holds a usable parent: Spark conf
(``spark.openlineage.parentJobNamespace``/``parentJobName``/``parentRunId``, ``rootParent*``),
then, when given (the Spark integration reads them as the official one does), openlineage.yml's
top-level ``parentJobNamespace``... and the ``OPENLINEAGE__PARENT_JOB_NAMESPACE``...
variables, then ``OPENLINEAGE_PARENT_ID``/``OPENLINEAGE_ROOT_PARENT_ID``. All are set by
whoever launched the job, not by its lineage configuration, so a broken one costs the parent
facet, never the job or its lineage (as in the official Spark integration, which omits the
facet): an incomplete parent (``parentRunId`` alone) or a run id that is not a UUID (an
unrendered ``{{ run_id }}`` template) is logged once and skipped, and the next source is used.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from producer.events import env_parent_id
from producer.readers import Settings

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


def _parent(values: Mapping[str, Any], prefix: str, origin: Callable[[str], str]) -> Parent | None:
    """The complete, valid ``<prefix>*`` run of one source (keys as the Java client names them),
    or None (logged once when some of it is given but it cannot be used)."""
    keys = _KEYS[prefix]
    given = {k: str(values[k]).strip() for k in keys if values.get(k) is not None and str(values[k]).strip()}
    if not given:
        return None
    missing = [origin(k) for k in keys if k not in given]
    if missing:
        _warn_once(f"event=parent_ignored keys={','.join(origin(k) for k in given)} reason={','.join(missing)} "
                   f"missing fix=set all three of {','.join(origin(k) for k in keys)} or none; the parent facet "
                   f"is omitted")
        return None
    namespace, name, run_id = (given[k] for k in keys)
    try:
        run_id = str(uuid.UUID(run_id))
    except ValueError:
        _warn_once(f"event=parent_ignored key={origin(keys[2])} reason=not a UUID ({run_id!r}; an unrendered "
                   f"template?) fix=set it to the parent's run id, e.g. 0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a; "
                   f"the parent facet is omitted")
        return None
    return namespace, name, run_id


def spark_parent(conf: Mapping[str, str], prefix: str) -> Parent | None:
    """The complete, valid ``spark.openlineage.<prefix>*`` run, or None (see :func:`_parent`)."""
    return _parent({k: conf.get(_SPARK + k) for k in _KEYS[prefix]}, prefix, lambda k: _SPARK + k)


def resolve(conf: Mapping[str, str] | None, environ: Mapping[str, str],
            lower: Sequence[Settings] = ()) -> tuple[Parent | None, Parent | None, str]:
    """``(parent, root, source)``: from the first of Spark conf, then ``lower`` (the Spark
    integration's other sources, lowest precedence first: :func:`producer.readers.settings_sources`)
    that holds a usable parent, else from ``OPENLINEAGE_PARENT_ID`` (root only with its parent,
    from the same source). ``source`` is ``spark``, ``file`` or ``env``."""
    parent, root, source, _origin = _resolve(conf or {}, environ, lower)
    return parent, root, source


def _resolve(conf: Mapping[str, str], environ: Mapping[str, str],
             lower: Sequence[Settings]) -> tuple[Parent | None, Parent | None, str, Callable[[str], str]]:
    sources = [("spark", {k: conf.get(_SPARK + k) for k in _KEYS["parent"] + _KEYS["root_parent"]},
                lambda k: _SPARK + k)]
    sources += [(s.kind, s.values, s.origin) for s in reversed(lower)]
    for kind, values, origin in sources:
        parent = _parent(values, "parent", origin)
        root = _parent(values, "root_parent", origin)
        if parent is not None:
            return parent, root, kind, origin
        if root is not None and not any(values.get(key) for key in _KEYS["parent"]):
            _warn_once(f"event=parent_ignored keys={origin('rootParent*')} reason=a root parent without "
                       f"{origin('parent*')} fix=set the parent run too; the parent facet is omitted")
    parent = env_parent_id("OPENLINEAGE_PARENT_ID", environ)
    root = env_parent_id("OPENLINEAGE_ROOT_PARENT_ID", environ) if parent is not None else None
    return parent, root, "env", lambda k: "env OPENLINEAGE_ROOT_PARENT_ID" if k.startswith("root") \
        else "env OPENLINEAGE_PARENT_ID"


def parent_values(conf: Mapping[str, str] | None, environ: Mapping[str, str],
                  lower: Sequence[Settings] = ()) -> tuple[dict[str, tuple[str, str]], str]:
    """:func:`resolve` as ProducerConfig fields, ``{field: (value, where it came from)}``, and
    the source (``spark``, ``file`` or ``env``)."""
    parent, root, source, origin = _resolve(conf or {}, environ, lower)
    out: dict[str, tuple[str, str]] = {}
    for prefix, run in (("parent", parent), ("root_parent", root)):
        if run is not None:
            for name, key, value in zip(_FIELDS, _KEYS[prefix], run):
                out[f"{prefix}_{name}"] = (value, origin(key))
    return out, source
