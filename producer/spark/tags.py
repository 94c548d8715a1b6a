"""Job and run tags and job owners as the official Spark integration reads them, for the
``tags`` job and run facets and the ``ownership`` job facet (from Spark conf, openlineage.yml
or ``OPENLINEAGE__*``: :mod:`producer.spark.settings` finds and merges them).

* ``spark.openlineage.job.tags`` / ``spark.openlineage.run.tags``: entries separated by
  ``;``, each ``key``, ``key:value`` or ``key:value:source`` (a bare key's value is
  ``"true"``; the source defaults to ``CONFIG``; parts after a third are ignored). ``\\;``
  and ``\\:`` stand for a literal ``;`` and ``:``. An entry without a key is skipped; a
  value left empty at the end of an entry (``a:``) counts as none (``a`` then means
  ``a:true``). Keys and values are stripped of surrounding blanks.
  In openlineage.yml the value may also be a list, each item one entry
  (``job: {tags: ["env:prod", "pii"]}``).
* ``spark.openlineage.job.owners.<type>=<name>``: one owner per key (``...owners.team=data``;
  openlineage.yml ``job: {owners: {team: data}}``).

Tags go on every event of the application run and of its child runs (as the official
integration's builders do), in the order written.
"""

from __future__ import annotations

from typing import Any, Mapping

Tag = tuple[str, str, str]   # key, value, source


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` not escaped by a backslash; the escapes of ``;`` and
    ``:`` are resolved in the parts, any other backslash is kept."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in ";:":
            current.append("\\" + text[i + 1])   # resolved below, once both splits are done
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


def _unescape(text: str) -> str:
    return text.replace("\\;", ";").replace("\\:", ":")


def parse_tags(raw: str | None) -> tuple[Tag, ...]:
    """``raw``'s ``;``-separated entries (a Spark conf value, or a string in openlineage.yml)."""
    if not raw:
        return ()
    return tuple(tag for tag in map(parse_tag, _split(raw, ";")) if tag is not None)


def parse_tag(entry: str) -> Tag | None:
    """One ``key``, ``key:value`` or ``key:value:source`` entry (an item of a YAML list is one
    entry, as the official deserializer reads it), or None when it has no key."""
    parts = [_unescape(p).strip() for p in _split(entry, ":")]
    while parts and parts[-1] == "":
        parts.pop()
    if not parts or not parts[0]:
        return None
    return parts[0], parts[1] if len(parts) > 1 else "true", parts[2] if len(parts) > 2 else "CONFIG"


def parse_owners(owners: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(type, name) for each ``<type>: <name>`` of ``owners`` with a type and a name, sorted by type."""
    return tuple(sorted((str(kind), str(name).strip()) for kind, name in owners.items()
                        if str(kind) and name is not None and str(name).strip()))


def tag_list(tags: tuple[Tag, ...]) -> list[dict]:
    return [{"key": k, "value": v, "source": s} for k, v, s in tags]
