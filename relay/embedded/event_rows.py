"""How one OpenLineage event reads as rows of the lineage graph: pure, no store, no I/O.

:func:`extract` takes a RunEvent, JobEvent or DatasetEvent (decoded JSON) and returns the
rows it contributes to :class:`relay.embedded.store.LineageStore`'s tables, in their column
order: jobs, datasets, ``symlinks`` aliases, columns (from the ``schema`` facet, and every
column the ``columnLineage`` facet names), job -> dataset edges and column lineage edges.
A part that is not lineage-shaped (no string name, a facet that is not an object) is
skipped, never an error: that is what lets :meth:`LineageStore.add` take any JSON object.

Ids are :func:`qualified_name` of ``namespace`` and ``name``, for datasets and jobs alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: ``target_field`` stored for a dataset-wide edge (SQLite primary keys and NULL do not mix).
WHOLE_DATASET = ""


@dataclass
class _Extract:
    jobs: list[tuple[str, str, str]] = field(default_factory=list)
    datasets: list[tuple[str, str, str]] = field(default_factory=list)
    aliases: list[tuple[str, str, str]] = field(default_factory=list)
    columns: list[tuple[str, str, str | None, int | None]] = field(default_factory=list)
    io: list[tuple[str, str, str]] = field(default_factory=list)
    column_edges: list[tuple[str, str, str, str, str, str, str, str | None]] = field(default_factory=list)


def qualified_name(namespace: str, name: str) -> str:
    """One readable id per dataset or job: ``s3://bucket/key``, ``file:/data/x`` (a name that
    is an absolute path joins its scheme-only namespace with ``:``), ``demo/job``."""
    return f"{namespace}:{name}" if name.startswith("/") and "/" not in namespace else f"{namespace}/{name}"


def _ref(obj: Any) -> tuple[str, str, str] | None:
    if isinstance(obj, dict) and isinstance(obj.get("namespace"), str) and isinstance(obj.get("name"), str):
        return qualified_name(obj["namespace"], obj["name"]), obj["namespace"], obj["name"]
    return None


def _facets(obj: dict[str, Any]) -> dict[str, Any]:
    facets = obj.get("facets")
    return facets if isinstance(facets, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _read_dataset(out: _Extract, obj: Any, job_id: str | None, direction: str | None) -> None:
    ref = _ref(obj)
    if ref is None:
        return
    ds_id = ref[0]
    out.datasets.append(ref)
    if job_id is not None and direction is not None:
        out.io.append((job_id, ds_id, direction))
    facets = _facets(obj)
    schema = facets.get("schema") if isinstance(facets.get("schema"), dict) else {}
    for pos, col in enumerate(_list(schema.get("fields")), 1):
        if isinstance(col, dict) and isinstance(col.get("name"), str):
            typ = col.get("type") if isinstance(col.get("type"), str) else None
            out.columns.append((ds_id, col["name"], typ, pos))
    symlinks = facets.get("symlinks") if isinstance(facets.get("symlinks"), dict) else {}
    for ident in _list(symlinks.get("identifiers")):
        alias = _ref(ident)
        if alias is not None:
            out.aliases.append((ds_id, alias[1], alias[2]))
    lineage = facets.get("columnLineage") if isinstance(facets.get("columnLineage"), dict) else {}
    fields = lineage.get("fields") if isinstance(lineage.get("fields"), dict) else {}
    targets = [(name, spec.get("inputFields")) for name, spec in fields.items() if isinstance(spec, dict)]
    targets.append((WHOLE_DATASET, lineage.get("dataset")))
    for target, inputs in targets:
        if target != WHOLE_DATASET:
            out.columns.append((ds_id, target, None, None))
        for source in _list(inputs):
            src = _ref(source)
            if src is None or not isinstance(source.get("field"), str):
                continue
            out.datasets.append(src)
            out.columns.append((src[0], source["field"], None, None))
            kinds = [t for t in _list(source.get("transformations")) if isinstance(t, dict)] or [{}]
            for t in kinds:
                desc = t.get("description") if isinstance(t.get("description"), str) else None
                out.column_edges.append((src[0], source["field"], ds_id, target, job_id or "",
                                         str(t.get("type") or ""), str(t.get("subtype") or ""), desc))


def extract(event: dict[str, Any]) -> _Extract:
    """The graph rows one event contributes (RunEvent, JobEvent or DatasetEvent)."""
    out = _Extract()
    job = _ref(event.get("job"))
    job_id = job[0] if job else None
    if job:
        out.jobs.append(job)
    for key, direction in (("inputs", "input"), ("outputs", "output")):
        for ds in _list(event.get(key)):
            _read_dataset(out, ds, job_id, direction)
    _read_dataset(out, event.get("dataset"), None, None)
    return out
