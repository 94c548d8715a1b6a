"""Paths into a parsed OpenLineage event document, for :class:`~relay.stages.rewrite.Rewriter`.

Where the spec puts facets (:func:`facet_sites`), and edits at paths: a namespace mapped
(:func:`map_paths`), facets removed (:func:`without_facets`). Copy-on-write: the parsed event
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
