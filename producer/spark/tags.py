"""Job and run tags and job owners as the official Spark integration reads them, for the
``tags`` job and run facets and the ``ownership`` job facet (from Spark conf, openlineage.yml
or ``OPENLINEAGE__*``: :mod:`producer.spark.settings` finds and merges them).

* ``spark.openlineage.job.tags`` / ``spark.openlineage.run.tags``: entries separated by
  ``;`` (the whole may be in ``[...]``), each ``key``, ``key:value`` or ``key:value:source``
  (a bare key's value is ``"true"``; the source defaults to ``CONFIG``; parts after a third
  are ignored). ``\\;`` and ``\\:`` stand for a literal ``;`` and ``:``; an escaped
  backslash stays as written. An entry with a blank key, value or source is skipped; an
  empty part at the end (``a:``) counts as none (``a`` then means ``a:true``). Keys and
  values are stripped of surrounding blanks (the official keeps them).
  In openlineage.yml the value may also be a list, each item one entry
  (``job: {tags: ["env:prod", "pii"]}``).
* ``spark.openlineage.job.ownership.<type>=<name>``, or, when none is set in that source, the
  older ``spark.openlineage.job.owners.<type>``: one owner per key (``...ownership.team=data``;
  openlineage.yml ``job: {ownership: {team: data}}``).

Tags go on every event of the application run and of its child runs (as the official
integration's builders do), in the order written.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

Tag = tuple[str, str, str]   # key, value, source


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` not escaped by a backslash (``\\;``); an escaped
    backslash (``\\\\``) is a pair of its own, so the separator after it splits. Escapes are
    kept in the parts (resolved by :func:`_unescape` once both splits are done)."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in ";:\\":
            current.append(text[i:i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


_ESCAPE = re.compile(r"\\([\\;:])")


def _unescape(text: str) -> str:
    """``\\;`` and ``\\:`` become ``;`` and ``:``; an escaped backslash stays as written
    (as the official parser keeps it)."""
    return _ESCAPE.sub(lambda m: m.group(0) if m.group(1) == "\\" else m.group(1), text)


def parse_tags(raw: str | None) -> tuple[Tag, ...]:
    """``raw``'s ``;``-separated entries (a Spark conf value, or a string in openlineage.yml)."""
    if not raw:
        return ()
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):   # the official reads "[a;b]" as a list
        raw = raw[1:-1]
    return tuple(tag for tag in map(parse_tag, _split(raw, ";")) if tag is not None)


def parse_tag(entry: str) -> Tag | None:
    """One ``key``, ``key:value`` or ``key:value:source`` entry (an item of a YAML list is one
    entry, as the official deserializer reads it), or None when it has a blank key, value or
    source."""
    parts = _split(entry, ":")
    while parts and parts[-1] == "":   # as Java's String.split: trailing empty parts go
        parts.pop()
    parts = parts[:3]
    if not parts or any(not p.strip() for p in parts):
        return None
    parts = [_unescape(p).strip() for p in parts]
    return parts[0], parts[1] if len(parts) > 1 else "true", parts[2] if len(parts) > 2 else "CONFIG"


def parse_owners(owners: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(type, name) for each ``<type>: <name>`` of ``owners`` with a type and a name, sorted by type."""
    return tuple(sorted((str(kind), str(name).strip()) for kind, name in owners.items()
                        if str(kind) and name is not None and str(name).strip()))


def tag_list(tags: tuple[Tag, ...]) -> list[dict]:
    return [{"key": k, "value": v, "source": s} for k, v, s in tags]
