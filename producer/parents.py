"""The parent (and root parent) run a producer's events name, from Spark conf, the Spark
integration's other sources or the orchestrator's environment (used by :mod:`producer.sources`
and :func:`producer.spark.enable_lineage`).

With Spark conf, each of the six settings (``parentJobNamespace``, ``parentJobName``,
``parentRunId``, ``rootParentJobNamespace``, ``rootParentJobName``, ``rootParentRunId``) comes
from the highest source that sets it, as the official integration's
``SparkOpenLineageConfig.mergeWithNonNull`` merges them: Spark conf
(``spark.openlineage.parentJobNamespace``...), then openlineage.yml's top-level
``parentJobNamespace``..., then the ``OPENLINEAGE__PARENT_JOB_NAMESPACE``... variables. The
merged parent is used when its three fields are there and the run id is a UUID; each root field
not set falls back to the parent's (as the official ``buildApplicationParentFacet``), and no
root field at all is no root. Without Spark conf (openlineage-python's sources) none of those
are read. Otherwise, or when the merged parent cannot be used, ``OPENLINEAGE_PARENT_ID`` (with
``OPENLINEAGE_ROOT_PARENT_ID`` as its root, never mixed with the fields above) is the parent.

All are set by whoever launched the job, not by its lineage configuration, so a broken one
costs the parent facet, never the job or its lineage (as in the official Spark integration,
which omits the facet): an incomplete parent (``parentRunId`` alone) or a run id that is not a
UUID (an unrendered ``{{ run_id }}`` template) is logged once and skipped; so is a root whose
run id is not a UUID (the parent is then sent without a root).
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


class _Merged:
    """The six settings merged by precedence: each key's value, and the source that set it
    (``kind`` and the key as that source names it)."""

    def __init__(self, sources: Sequence[tuple[str, Mapping[str, Any], Callable[[str], str]]]) -> None:
        self.values: dict[str, str] = {}
        self.kinds: dict[str, str] = {}
        self.origins: dict[str, str] = {}
        self._top: Callable[[str], str] = lambda key: _SPARK + key   # the highest source that sets one
        found = False
        for kind, values, origin in sources:   # highest precedence first
            for key in _KEYS["parent"] + _KEYS["root_parent"]:
                value = values.get(key)
                if key in self.values or value is None or not str(value).strip():
                    continue
                self.values[key] = str(value).strip()
                self.kinds[key] = kind
                self.origins[key] = origin(key)
                if not found:
                    self._top, found = origin, True

    def origin(self, key: str) -> str:
        """Where ``key`` came from; a key not set is named as the highest source that sets any
        of them names it (where the rest belongs)."""
        return self.origins[key] if key in self.origins else self._top(key)


def _run_id(raw: str, where: str, what: str) -> str | None:
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        _warn_once(f"event=parent_ignored key={where} reason=not a UUID ({raw!r}; an unrendered template?) "
                   f"fix=set it to the {what}'s run id, e.g. 0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a; {_LOST[what]}")
        return None


_LOST = {"parent": "the parent facet is omitted", "root": "the parent facet is sent without a root"}


def _merged_parent(merged: _Merged) -> tuple[Parent | None, Parent | None]:
    """The merged parent and root, or ``(None, None)`` (logged once) when the parent cannot be used."""
    keys, root_keys = _KEYS["parent"], _KEYS["root_parent"]
    given = [k for k in keys if k in merged.values]
    if not given:
        roots = [merged.origin(k) for k in root_keys if k in merged.values]
        if roots:
            _warn_once(f"event=parent_ignored keys={','.join(roots)} "
                       f"reason=a root parent without {','.join(merged.origin(k) for k in keys)} fix=set the parent "
                       f"run too; the parent facet is omitted")
        return None, None
    if len(given) != 3:
        missing = [merged.origin(k) for k in keys if k not in given]
        _warn_once(f"event=parent_ignored keys={','.join(merged.origin(k) for k in given)} reason={','.join(missing)} "
                   f"missing fix=set all three of {','.join(merged.origin(k) for k in keys)} or none; the parent "
                   f"facet is omitted")
        return None, None
    run_id = _run_id(merged.values[keys[2]], merged.origin(keys[2]), "parent")
    if run_id is None:
        return None, None
    parent = (merged.values[keys[0]], merged.values[keys[1]], run_id)
    if not any(k in merged.values for k in root_keys):
        return parent, None
    root_run = merged.values.get(root_keys[2])
    root_run = run_id if root_run is None else _run_id(root_run, merged.origin(root_keys[2]), "root")
    if root_run is None:
        return parent, None
    return parent, (merged.values.get(root_keys[0], parent[0]), merged.values.get(root_keys[1], parent[1]), root_run)


def resolve(conf: Mapping[str, str] | None, environ: Mapping[str, str],
            lower: Sequence[Settings] = ()) -> tuple[Parent | None, Parent | None, str]:
    """``(parent, root, source)``: the six settings of Spark conf and ``lower`` (the Spark
    integration's other sources, lowest precedence first: :func:`producer.readers.settings_sources`)
    merged key by key, else ``OPENLINEAGE_PARENT_ID`` (root only with its parent, from the same
    variable pair); see the module docstring. ``source`` is where the parent's run id came from:
    ``spark``, ``file`` or ``env``."""
    parent, root, source, _origin = _resolve(conf or {}, environ, lower)
    return parent, root, source


def _resolve(conf: Mapping[str, str], environ: Mapping[str, str],
             lower: Sequence[Settings]) -> tuple[Parent | None, Parent | None, str, Callable[[str], str]]:
    sources = [("spark", {k: conf.get(_SPARK + k) for k in _KEYS["parent"] + _KEYS["root_parent"]},
                lambda k: _SPARK + k)]
    sources += [(s.kind, s.values, s.origin) for s in reversed(lower)]
    merged = _Merged(sources)
    parent, root = _merged_parent(merged)
    if parent is not None:
        def origin(key: str) -> str:
            # A root field not set is the parent's (as the official integration fills it).
            return merged.origins.get(key) or merged.origins[key.replace("rootParent", "parent")]
        return parent, root, merged.kinds["parentRunId"], origin
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
