"""Every ``spark.openlineage.*`` setting :func:`producer.spark.enable_lineage` reads, found by
its dotted name (``columnLineage.datasetLineageEnabled``) in the sources the official Spark
integration's ArgumentParser builds its one config from, highest precedence first:

1. Spark conf: ``spark.openlineage.columnLineage.datasetLineageEnabled=false``;
2. openlineage.yml (the file :func:`producer.readers.find_yaml` finds), the name nested:
   ``columnLineage: {datasetLineageEnabled: false}``;
3. the ``OPENLINEAGE__*`` variables, named as the Java client's env parser names them:
   ``OPENLINEAGE__COLUMN_LINEAGE__DATASET_LINEAGE_ENABLED=false``.

A blank value is not set. A single value comes from the highest source that sets it; tags
and owners are merged as the official ``JobConfig``/``RunConfig`` merge them (a tag by its key,
an owner by its type, the higher source winning); the facets left out follow
:mod:`producer.spark.facets_config`. A value that cannot be used raises
:class:`producer.errors.ConfigError` naming the source and the key
(``/etc/openlineage.yml: columnLineage.datasetLineageEnabled``,
``env OPENLINEAGE__PYTHON__MAX_PLAN_BYTES``) and the fix. ``enable_lineage`` reads every
setting before it registers anything, so such an error reaches the job at that call only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from producer.errors import ConfigError
from producer.readers import Settings, settings_sources
from producer.spark import tags
from producer.spark.facets_config import disabled_facets

_P = "spark.openlineage."


@dataclass(frozen=True)
class Found:
    """A value, the key it was read from as written there, and its source (spark, file or env)."""

    value: Any
    origin: str
    kind: str


class SparkSettings:
    """The merged ``spark.openlineage.*`` settings of one session (see the module docstring)."""

    def __init__(self, conf: Mapping[str, str], lower: Sequence[Settings] = ()) -> None:
        self.conf = conf
        #: openlineage.yml and ``OPENLINEAGE__*`` settings, lowest precedence first.
        self.lower = tuple(lower)
        spark = Settings("spark", _nested(conf), lambda key: _P + key)
        self._sources = (*self.lower, spark)   # lowest precedence first

    @classmethod
    def read(cls, conf: Mapping[str, str], environ: Mapping[str, str] | None = None) -> SparkSettings:
        return cls(conf, settings_sources(os.environ if environ is None else environ))

    def find(self, name: str, *aliases: str) -> Found | None:
        """The value of the highest source that sets ``name`` (or, in that source, an alias)."""
        for source in reversed(self._sources):
            for key in (name, *aliases):
                value = _lookup(source, key)
                if _given(value):
                    return Found(value, source.origin(key), source.kind)
        return None

    def text(self, name: str, *aliases: str) -> str | None:
        found = self.find(name, *aliases)
        if found is None:
            return None
        if isinstance(found.value, (Mapping, list, tuple)):
            raise ConfigError(f"{found.origin}: expected text, got a {_kind(found.value)} fix: write it as one "
                              f"value ({name}: my_value)")
        # true/false as the Java client writes them; a number as written (producer.readers.YamlInt).
        return str(found.value).lower() if isinstance(found.value, bool) else str(found.value)

    def flag(self, name: str, default: bool) -> bool:
        found = self.find(name)
        if found is None:
            return default
        if isinstance(found.value, bool):
            return found.value
        text = found.value.strip().lower() if isinstance(found.value, str) else None
        if text not in ("true", "false"):
            raise ConfigError(f"{found.origin}: expected true or false, got {found.value!r} fix: set it to true "
                              f"or false, or remove it for the default ({str(default).lower()})")
        return text == "true"

    def byte_count(self, name: str, default: int) -> int:
        found = self.find(name)
        if found is None:
            return default
        count = None
        if isinstance(found.value, int) and not isinstance(found.value, bool):
            count = int(found.value)   # openlineage.yml's number (str() would be its text: 0x10, 1_000)
        elif not isinstance(found.value, (bool, float)):
            try:
                count = int(str(found.value).strip())
            except ValueError:
                pass
        if count is None or count < 0:
            raise ConfigError(f"{found.origin}: expected a number of bytes, got {found.value!r} fix: a whole "
                              f"number such as {default}, or remove it for the default")
        return count

    def names(self, name: str, default: Sequence[str]) -> list[str]:
        """A comma-separated list (or, in openlineage.yml, a list of names)."""
        found = self.find(name)
        if found is None:
            return list(default)
        value = found.value
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{found.origin}: expected a comma-separated list of names, got {found.value!r} "
                              f"fix: e.g. {','.join(default)}, or a YAML list of them")
        return [item.strip() for item in value if item.strip()]

    def tags(self, name: str) -> tuple[tags.Tag, ...]:
        """``job.tags`` or ``run.tags`` of every source, merged by key (the higher source wins)."""
        merged: dict[str, tags.Tag] = {}
        for source in self._sources:
            value = _lookup(source, name)
            if _given(value):
                for tag in _tags(value, source.origin(name)):
                    merged[tag[0]] = tag
        return tuple(merged.values())

    def owners(self) -> tuple[tuple[str, str], ...]:
        """``job.owners.<type>`` (or the newer ``job.ownership.<type>``, which replaces it within
        a source, as the official ``JobConfig``) of every source, merged by type."""
        merged: dict[str, str] = {}
        for source in self._sources:
            for key in ("job.ownership", "job.owners"):
                value = _lookup(source, key)
                if value is None:
                    continue
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{source.origin(key)}: expected owners by type, got {value!r} fix: one "
                                      f"name per type, e.g. {key}.team=data ({key.replace('.', ': {')}: "
                                      f"{{team: data}}}} in openlineage.yml)")
                merged.update(tags.parse_owners(value))
                break
        return tuple(sorted(merged.items()))

    def disabled_facets(self) -> frozenset[str]:
        return disabled_facets(self._sources)


def _nested(conf: Mapping[str, str]) -> dict[str, Any]:
    """``spark.openlineage.*`` (but ``transport.*``, read elsewhere) nested at the dots, as
    ArgumentParser nests it (``job.owners.team`` is ``{job: {owners: {team: ...}}}``); a key
    that is both a value and a parent of others (``a.b`` and ``a.b.c``) keeps the others."""
    out: dict[str, Any] = {}
    for key in sorted(k for k in conf if k.startswith(_P) and not k.startswith(_P + "transport.")):
        *parents, leaf = key[len(_P):].split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if not isinstance(node.get(leaf), dict):
            node[leaf] = conf[key]
    return out


def _lookup(source: Settings, name: str) -> Any:
    node: Any = source.values
    parts = name.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return None
        if not isinstance(node, Mapping):
            parent = ".".join(parts[:i])
            raise ConfigError(f"{source.origin(parent)}: expected a mapping holding {'.'.join(parts[i:])}, got "
                              f"{node!r} fix: nest it ({parent}: {{{parts[i]}: ...}} in openlineage.yml)")
        node = node.get(part)
    return node


def _given(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def _kind(value: Any) -> str:
    return "mapping" if isinstance(value, Mapping) else "list"


def _tags(value: Any, where: str) -> tuple[tags.Tag, ...]:
    """A source's tags: ``key:value:source`` entries separated by ``;``, or a list of entries."""
    if isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected tags as 'key:value:source' text, got a mapping fix: a list of "
                          f"entries (tags: [\"env:prod\", \"team:data:CONFIG\"]) or one text (env:prod;pii)")
    if not isinstance(value, (list, tuple)):
        return tags.parse_tags(str(value).lower() if isinstance(value, bool) else str(value))
    found = []
    for i, item in enumerate(value):
        if isinstance(item, (Mapping, list, tuple)):
            example = ":".join(str(item.get(k)) for k in ("key", "value", "source") if item.get(k) is not None) \
                if isinstance(item, Mapping) else "key:value:source"
            raise ConfigError(f"{where}[{i}]: expected a tag as 'key:value:source' text, got a {_kind(item)} "
                              f"(the official integration reads no other form) fix: write it as "
                              f"\"{example or 'key:value:source'}\"")
        if item is not None:
            tag = tags.parse_tag(str(item).lower() if isinstance(item, bool) else str(item))
            if tag is not None:
                found.append(tag)
    return tuple(found)
