"""Job and run tags and job owners from the Spark conf, as the official Spark integration
reads them, for the ``tags`` job and run facets and the ``ownership`` job facet.

* ``spark.openlineage.job.tags`` / ``spark.openlineage.run.tags``: entries separated by
  ``;`` (the whole may be in ``[...]``), each ``key``, ``key:value`` or ``key:value:source``
  (a bare key's value is ``"true"``; the source defaults to ``CONFIG``; parts after a third
  are ignored). ``\\;`` and ``\\:`` stand for a literal ``;`` and ``:``; an escaped
  backslash stays as written. An entry with a blank key, value or source is skipped; an
  empty part at the end (``a:``) counts as none (``a`` then means ``a:true``). Keys and
  values are stripped of surrounding blanks (the official keeps them).
* ``spark.openlineage.job.ownership.<type>=<name>``, or, when none is set, the older
  ``spark.openlineage.job.owners.<type>``: one owner per key (``...ownership.team=data``).

Tags go on every event of the application run and of its child runs (as the official
integration's builders do), in the order written.
"""

from __future__ import annotations

import re
from typing import Mapping

PREFIX = "spark.openlineage."
JOB_TAGS = PREFIX + "job.tags"
RUN_TAGS = PREFIX + "run.tags"
OWNERS = PREFIX + "job.owners."
OWNERSHIP = PREFIX + "job.ownership."

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
    if not raw:
        return ()
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):   # the official reads "[a;b]" as a list
        raw = raw[1:-1]
    tags: list[Tag] = []
    for entry in _split(raw, ";"):
        parts = _split(entry, ":")
        while parts and parts[-1] == "":   # as Java's String.split: trailing empty parts go
            parts.pop()
        parts = parts[:3]
        if not parts or any(not p.strip() for p in parts):   # no key, or a blank value or source
            continue
        parts = [_unescape(p).strip() for p in parts]
        key = parts[0]
        value = parts[1] if len(parts) > 1 else "true"
        source = parts[2] if len(parts) > 2 else "CONFIG"
        tags.append((key, value, source))
    return tuple(tags)


def parse_owners(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(type, name) for each ``spark.openlineage.job.ownership.<type>`` with a name, or, when
    there is none (the newer key wins, as in the official integration), each
    ``spark.openlineage.job.owners.<type>``; sorted by type."""
    for prefix in (OWNERSHIP, OWNERS):
        found = tuple(sorted((key[len(prefix):], value.strip()) for key, value in conf.items()
                             if key.startswith(prefix) and len(key) > len(prefix) and value and value.strip()))
        if found:
            return found
    return ()


def tag_list(tags: tuple[Tag, ...]) -> list[dict]:
    return [{"key": k, "value": v, "source": s} for k, v, s in tags]
