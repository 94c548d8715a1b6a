"""Paths into a parsed OpenLineage event document, for :class:`~relay.stages.rewrite.Rewriter`.

Where the spec puts facets (:func:`facet_sites`), and edits at paths: a namespace mapped
(:func:`map_paths`; in the ``lineage`` facet, :func:`map_lineage`), facets removed
(:func:`without_facets`). Copy-on-write: the parsed event
is shared by every collector, so its input is never mutated; an edit copies only the
containers on its path and shares everything else with the input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def map_paths(obj: Any, paths: tuple[tuple[str, ...], ...], map_ns: Callable[[str], str],
               list_key: str | None = None) -> Any:
    """Map ``namespace`` of the objects at ``paths`` inside ``obj`` (or, with ``list_key``,
    of each item of ``obj[list_key]``); copy-on-write."""
    if not isinstance(obj, dict):
        return obj
    if list_key is not None:
        items = obj.get(list_key)
        if not isinstance(items, list):
            return obj
        new_items = [map_paths(item, ((),), map_ns) for item in items]
        return {**obj, list_key: new_items} if any(n is not o for n, o in zip(new_items, items)) else obj
    for path in paths:
        if not path:
            namespace = obj.get("namespace")
            if isinstance(namespace, str) and map_ns(namespace) != namespace:
                obj = {**obj, "namespace": map_ns(namespace)}
            continue
        inner = obj.get(path[0])
        new_inner = map_paths(inner, (path[1:],), map_ns)
        if new_inner is not inner:
            obj = {**obj, path[0]: new_inner}
    return obj


def map_job_dependencies(facet: Any, map_job: Callable[[str], str]) -> Any:
    """The ``jobDependencies`` run facet with the namespace of the job of each of its
    ``upstream[]`` and ``downstream[]`` dependencies mapped. Copy-on-write."""
    if not isinstance(facet, dict):
        return facet
    changes: dict[str, Any] = {}
    for key in ("upstream", "downstream"):
        items = facet.get(key)
        if isinstance(items, list):
            new_items = [map_paths(item, (("job",),), map_job) for item in items]
            if any(n is not o for n, o in zip(new_items, items)):
                changes[key] = new_items
    return {**facet, **changes} if changes else facet


def map_lineage(facet: Any, map_job: Callable[[str], str], map_dataset: Callable[[str], str]) -> Any:
    """The ``lineage`` facet (LineageDatasetFacet of a dataset, LineageJobFacet of a job)
    with the namespace of each dataset and job it names mapped, by that reference's
    ``type`` (``DATASET``: ``map_dataset``, ``JOB``: ``map_job``; any other, or none: kept):
    its ``inputs[]`` and ``fields.*.inputs[]``, and its ``entries[]`` with theirs.
    Copy-on-write."""
    if not isinstance(facet, dict):
        return facet
    facet = _lineage_sources(facet, map_job, map_dataset)
    entries = facet.get("entries")
    if isinstance(entries, list):
        new_entries = [_lineage_sources(_lineage_ref(entry, map_job, map_dataset), map_job, map_dataset)
                       if isinstance(entry, dict) else entry for entry in entries]
        if any(n is not o for n, o in zip(new_entries, entries)):
            facet = {**facet, "entries": new_entries}
    return facet


def _lineage_sources(node: dict[str, Any], map_job: Callable[[str], str],
                     map_dataset: Callable[[str], str]) -> dict[str, Any]:
    """``node`` (a lineage facet or entry) with its ``inputs[]`` and ``fields.*.inputs[]`` mapped."""
    changes: dict[str, Any] = {}
    inputs = _lineage_refs(node.get("inputs"), map_job, map_dataset)
    if inputs is not node.get("inputs"):
        changes["inputs"] = inputs
    fields = node.get("fields")
    if isinstance(fields, dict):
        new_fields = {}
        for name, spec in fields.items():
            if isinstance(spec, dict):
                refs = _lineage_refs(spec.get("inputs"), map_job, map_dataset)
                if refs is not spec.get("inputs"):
                    spec = {**spec, "inputs": refs}
            new_fields[name] = spec
        if any(new_fields[name] is not spec for name, spec in fields.items()):
            changes["fields"] = new_fields
    return {**node, **changes} if changes else node


def _lineage_refs(refs: Any, map_job: Callable[[str], str], map_dataset: Callable[[str], str]) -> Any:
    if not isinstance(refs, list):
        return refs
    new_refs = [_lineage_ref(ref, map_job, map_dataset) for ref in refs]
    return new_refs if any(n is not o for n, o in zip(new_refs, refs)) else refs


def _lineage_ref(ref: Any, map_job: Callable[[str], str], map_dataset: Callable[[str], str]) -> Any:
    if not isinstance(ref, dict):
        return ref
    kind = ref.get("type")
    map_ns = map_dataset if kind == "DATASET" else map_job if kind == "JOB" else None
    namespace = ref.get("namespace")
    if map_ns is None or not isinstance(namespace, str):
        return ref
    new = map_ns(namespace)
    return ref if new == namespace else {**ref, "namespace": new}


def facet_sites(doc: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(path, facets dict)`` for every place the spec puts facets."""
    for holder in ("run", "job", "dataset"):
        obj = doc.get(holder)
        if isinstance(obj, dict) and isinstance(obj.get("facets"), dict):
            yield (holder, "facets"), obj["facets"]
    for group, own in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        items = doc.get(group)
        if isinstance(items, list):
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    for key in ("facets", own):
                        if isinstance(item.get(key), dict):
                            yield (group, index, key), item[key]


def without_facets(doc: dict[str, Any], drops: dict[tuple[Any, ...], set[str] | None]) -> dict[str, Any]:
    """``doc`` minus the named facets at each path (``None``: all of them); only the
    containers on those paths are copied (shallowly), everything else is shared with ``doc``."""
    out = dict(doc)
    ours: set[int] = {id(out)}
    for path, names in drops.items():
        parent: Any = out
        for key in path[:-1]:
            child = parent[key]
            if id(child) not in ours:
                child = list(child) if isinstance(child, list) else dict(child)
                ours.add(id(child))
                parent[key] = child
            parent = child
        facets = parent[path[-1]]
        parent[path[-1]] = {} if names is None else {k: v for k, v in facets.items() if k not in names}
    return out
