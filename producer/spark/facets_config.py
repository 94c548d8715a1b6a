"""The facets left out of every event, read as the official integration's ``FacetsConfig``
(used by :class:`producer.spark.settings.SparkSettings`).

Each source says it the same two ways: a list (``spark.openlineage.facets.disabled=[a;b]``,
openlineage.yml ``facets: {disabled: [a, b]}``, ``OPENLINEAGE__FACETS__DISABLED``) and a
per-facet flag that overrides it (``spark.openlineage.facets.<name>.disabled=true|false``,
``facets: {<name>: {disabled: true}}``, ``OPENLINEAGE__FACETS__<NAME>__DISABLED``). Sources are
read lowest precedence first (``OPENLINEAGE__*``, openlineage.yml, Spark conf). Since a left-out
facet may be left out for privacy, a list only ever adds: a facet named by any source's list or
flag is left out unless a higher source's flag sets it ``false`` explicitly. A flag is exactly
``true`` or ``false`` (or a YAML/JSON boolean), as the official ``FacetsConfig`` reads it; any
other value (``FALSE``, ``no``) is logged once and ignored, so it never turns a facet back on. A
name that leaves a facet out is matched as written and in snake_case (``sparkProperties`` also
leaves out ``spark_properties``: the environment's names reach us camelCased, as the Java
client's env parser makes them); ``false`` turns back on only the facet named exactly so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from producer.readers import Settings

log = logging.getLogger("producer.spark")
_logged: set[str] = set()


def disabled_facets(sources: Iterable[Settings]) -> frozenset[str]:
    """Facet names turned off by ``sources`` (lowest precedence first, Spark conf last, each
    nested as :class:`producer.spark.settings.SparkSettings` nests it)."""
    names: set[str] = set()
    for source in sources:
        facets = source.values.get("facets")
        if isinstance(facets, Mapping):
            _apply(names, facets.get("disabled"), _flags(facets, ""), source.origin("facets"))
    return frozenset(names)


def _apply(names: set[str], listed: Any, flags: Mapping[str, Any], where: str) -> None:
    for name in _listed(listed):
        names.update(_variants(name))
    for name, value in flags.items():
        if value is True or value == "true":
            names.update(_variants(name))
        elif value is False or value == "false":
            names.discard(name)   # only the name as written: a variant may be a facet left out for privacy
        else:
            _ignored_once(f"{where}.{name}.disabled")


def _ignored_once(key: str) -> None:
    # The value is not logged (settings are read more than once; a flag holds no secret, but a
    # mistyped key might be something else).
    if key not in _logged:
        _logged.add(key)
        log.warning("event=setting_ignored key=%s reason=expected true or false (exactly, as the official "
                    "integration reads it) fix=set it to true or false; the facet stays as the other settings "
                    "leave it", key)


def _listed(raw: Any) -> list[str]:
    """``[a;b]``, ``a;b`` or a YAML/JSON list."""
    if isinstance(raw, (list, tuple)):
        return [str(name).strip() for name in raw if str(name).strip()]
    text = str(raw if raw is not None else "").strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [name.strip() for name in text.split(";") if name.strip()]


def _flags(facets: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``{name: flag}`` of a ``facets`` mapping: ``<name>: {disabled: ...}``, nested names
    dotted (``spark: {logicalPlan: {disabled: true}}`` is ``spark.logicalPlan``)."""
    out: dict[str, Any] = {}
    for key, value in facets.items():
        if not isinstance(value, Mapping) or (not prefix and key == "disabled"):
            continue
        name = f"{prefix}{key}"
        if "disabled" in value:
            out[name] = value["disabled"]
        out.update(_flags({k: v for k, v in value.items() if k != "disabled"}, name + "."))
    return out


def _variants(name: str) -> set[str]:
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
    return {name, snake}
