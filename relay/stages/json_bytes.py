"""orjson's JSON bytes for a parsed event or any part of one, however deeply it nests.

orjson reads 1024 levels of nesting but writes only 254 (a deeper value raises
``JSONEncodeError: Recursion limit reached``), and decode accepts events nested up to
:data:`relay.stages.event_checks.MAX_DEPTH` levels. Whatever encodes such a document, or
a part of one, uses :func:`dumps` instead of ``orjson.dumps``.

Contract of :func:`dumps` (and :func:`dumps_deep`):

* The bytes are ``orjson.dumps(value, option=option)`` whenever orjson can write
  ``value``, and otherwise the bytes orjson would write without its limit: every subtree
  orjson can write is written by orjson, and only the containers above those are joined
  here (compact separators; with ``OPT_SORT_KEYS``, keys in code point order, as orjson
  sorts them). So a canonical form does not depend on which path made it: the content
  digests of two copies of an event agree, however deep it is.
* No recursion: nesting costs heap, not stack, whatever the depth. A value orjson refuses
  costs a walk over its objects and arrays in Python (strings and numbers, and every part
  nested no deeper than orjson writes, are still written by orjson).
* ``option`` is 0 or ``orjson.OPT_SORT_KEYS``. orjson's other refusals (a key that is not
  a string, an integer beyond 64 bits, a type it cannot write) are raised as orjson raises
  them; a value that contains itself raises ``JSONEncodeError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

#: The deepest value ``orjson.dumps`` writes: one 255 containers deep raises.
ORJSON_WRITE_DEPTH = 254
_CONTAINERS = (dict, list, tuple)
_END: Any = object()


class TooDeep(ValueError):
    """The value nests ``depth`` levels (containers within one another), over ``limit``."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"nested {depth} levels deep, over the limit of {limit}")
        self.depth = depth
        self.limit = limit


def dumps(value: Any, option: int = 0, *, max_depth: int | None = None) -> bytes:
    """``orjson.dumps(value, option=option)`` at any depth; see the module docstring.

    ``max_depth`` (at least :data:`ORJSON_WRITE_DEPTH`) raises :class:`TooDeep` for a
    value nested deeper; it is only measured when orjson could not write the value.
    """
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        # Too deep, or a refusal of its own that dumps_deep raises again from orjson.
        return dumps_deep(value, option, max_depth=max_depth)


def dumps_deep(value: Any, option: int = 0, *, max_depth: int | None = None,
               write_depth: int = ORJSON_WRITE_DEPTH) -> bytes:
    """:func:`dumps` for a value ``orjson.dumps`` refused: the containers nested more than
    ``write_depth`` levels deep are joined here, everything below them by orjson (tests
    lower ``write_depth`` to compare the joining with orjson's own output)."""
    if option & ~orjson.OPT_SORT_KEYS:
        raise ValueError(f"option must be 0 or OPT_SORT_KEYS, got {option}")
    heights = _heights(value)
    depth = heights.get(id(value), 0)
    if max_depth is not None and depth > max_depth:
        raise TooDeep(depth, max_depth)
    sort = bool(option & orjson.OPT_SORT_KEYS)
    out = bytearray()
    # One frame per container being joined: [members left, closing bracket, no member yet].
    frames: list[list[Any]] = []
    item = value
    while True:
        if not isinstance(item, _CONTAINERS) or heights[id(item)] <= write_depth:
            out += orjson.dumps(item, option=option)
        elif isinstance(item, dict):
            out += b"{"
            frames.append([_members(item, sort), b"}", True])
        else:
            out += b"["
            frames.append([iter(item), b"]", True])
        while frames:  # the next member to write, closing the containers that are done
            frame = frames[-1]
            item = next(frame[0], _END)
            if item is _END:
                out += frame[1]
                frames.pop()
                continue
            if frame[2]:
                frame[2] = False
            else:
                out += b","
            if frame[1] == b"}":
                key, item = item
                out += key
            break
        else:
            return bytes(out)


def nesting(value: Any) -> int:
    """How many containers deep ``value`` nests: 0 for a string or number, 1 for ``[]``
    or ``{"a": 1}``, 2 for ``[[]]``. Walks the whole value (no recursion)."""
    return _heights(value).get(id(value), 0)


def _members(obj: dict[Any, Any], sort: bool) -> Iterator[tuple[bytes, Any]]:
    keys = list(obj)
    for key in keys:
        if not isinstance(key, str):
            raise orjson.JSONEncodeError("Dict key must be str")
    if sort:
        keys.sort()  # code point order: orjson compares the UTF-8 bytes, which orders alike
    return ((orjson.dumps(key) + b":", obj[key]) for key in keys)


def _heights(value: Any) -> dict[int, int]:
    """The height of every container in ``value`` (``[]`` is 1, ``[[]]`` is 2), by id."""
    heights: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, children_done = stack.pop()
        if not isinstance(node, _CONTAINERS):
            continue
        children = node.values() if isinstance(node, dict) else node
        if children_done:
            heights[id(node)] = 1 + max((heights[id(c)] for c in children if isinstance(c, _CONTAINERS)), default=0)
            continue
        seen = heights.get(id(node))
        if seen is not None:
            if seen < 0:  # still open: it is its own ancestor
                raise orjson.JSONEncodeError("value contains itself (a circular reference)")
            continue  # shared with another place, already measured
        heights[id(node)] = -1
        stack.append((node, True))
        stack.extend((c, False) for c in children if isinstance(c, _CONTAINERS))
    return heights
