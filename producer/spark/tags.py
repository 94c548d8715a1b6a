"""Job and run tags and job owners from the Spark conf, as the official Spark integration
reads them, for the ``tags`` job and run facets and the ``ownership`` job facet.

* ``spark.openlineage.job.tags`` / ``spark.openlineage.run.tags``: entries separated by
  ``;``, each ``key``, ``key:value`` or ``key:value:source`` (a bare key's value is
  ``"true"``; the source defaults to ``CONFIG``; parts after a third are ignored). ``\\;``
  and ``\\:`` stand for a literal ``;`` and ``:``. An entry without a key is skipped; a
  value left empty at the end of an entry (``a:``) counts as none (``a`` then means
  ``a:true``). Keys and values are stripped of surrounding blanks.
* ``spark.openlineage.job.owners.<type>=<name>``: one owner per key (``...owners.team=data``).

Tags go on every event of the application run and of its child runs (as the official
integration's builders do), in the order written.
"""

from __future__ import annotations

from typing import Mapping

PREFIX = "spark.openlineage."
JOB_TAGS = PREFIX + "job.tags"
RUN_TAGS = PREFIX + "run.tags"
OWNERS = PREFIX + "job.owners."

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
    if not raw:
        return ()
    tags: list[Tag] = []
    for entry in _split(raw, ";"):
        parts = [_unescape(p).strip() for p in _split(entry, ":")]
        while parts and parts[-1] == "":
            parts.pop()
        if not parts or not parts[0]:
            continue
        key = parts[0]
        value = parts[1] if len(parts) > 1 else "true"
        source = parts[2] if len(parts) > 2 else "CONFIG"
        tags.append((key, value, source))
    return tuple(tags)


def parse_owners(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(type, name) for each ``spark.openlineage.job.owners.<type>`` with a name, sorted by type."""
    return tuple(sorted((key[len(OWNERS):], value.strip()) for key, value in conf.items()
                        if key.startswith(OWNERS) and len(key) > len(OWNERS) and value and value.strip()))


def tag_list(tags: tuple[Tag, ...]) -> list[dict]:
    return [{"key": k, "value": v, "source": s} for k, v, s in tags]
