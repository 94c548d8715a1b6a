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
* An integer beyond 64 bits (which orjson refuses) is written exactly, as its decimal
  digits; everything around it is still written by orjson (floats in orjson's format).
* ``option`` is 0 or ``orjson.OPT_SORT_KEYS``. orjson's other refusals (a key that is not
  a string, a type it cannot write) are raised as orjson raises them; a value that
  contains itself raises ``JSONEncodeError``.

Reading, :func:`loads` (from :mod:`producer.codec.json_text`) is ``orjson.loads`` except
that it keeps an integer beyond 64 bits (orjson reads one as the nearest float): what reads
back JSON the relay wrote, or rebuilds an event from its original bytes, uses it. Finding
one costs a scan of the bytes, so the per-event path does not: it tells a parsed tree that
may have lost one by the canonical bytes orjson wrote of it (:func:`may_hold_big_int`), and
only then looks at the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

# Reading keeps integers beyond 64 bits: shared with the producer's codec, which must not import
# the relay (re-exported here for the relay's modules).
from producer.codec.json_text import exact, has_big_int, loads  # noqa: F401

#: The deepest value ``orjson.dumps`` writes: one 255 containers deep raises.
ORJSON_WRITE_DEPTH = 254
_CONTAINERS = (dict, list, tuple)
_END: Any = object()
# The integers orjson reads and writes as integers.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
# After a digit and "e+": the exponent of a float of magnitude 9.2e18 or more (18 or more).
_BIG_EXPONENT = re.compile(rb"0*(?:1[89]|[2-9][0-9]|[1-9][0-9]{2})")


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
        piece = None
        if not isinstance(item, _CONTAINERS):
            piece = _scalar(item, option)
        elif heights[id(item)] <= write_depth and item is not value:  # orjson just refused value
            try:
                piece = orjson.dumps(item, option=option)
            except orjson.JSONEncodeError:
                pass  # an integer beyond 64 bits inside (else a refusal its member raises again)
        if piece is not None:
            out += piece
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


def may_hold_big_int(written: bytes) -> bool:
    """Whether ``written``, orjson's bytes for a tree orjson parsed, may stand for bytes
    with an integer beyond 64 bits: orjson read one as a float of magnitude at least
    9.2e18, which it writes with an exponent of 18 or more (``3.402823669209385e+38``;
    orjson writes the ``+`` from 3.11.7, the floor pyproject.toml sets). Cheap: a search
    for ``+`` (memchr; ``b"e+" in written`` costs ten times more), then a look at the bytes
    around each one found (a digit, ``e``, then the exponent). A string holding such text
    (``"1e+19"``) is a false alarm, for :func:`exact` to settle; SQL's ``price+tax`` is none."""
    at = written.find(b"+")
    while at >= 0:
        # "e" (101) after a digit: a float's exponent (the regex only then: a match costs ~0.2 us).
        if at >= 2 and written[at - 1] == 101 and 48 <= written[at - 2] <= 57 \
                and _BIG_EXPONENT.match(written, at + 1):
            return True
        at = written.find(b"+", at + 1)
    return False


def nesting(value: Any) -> int:
    """How many containers deep ``value`` nests: 0 for a string or number, 1 for ``[]``
    or ``{"a": 1}``, 2 for ``[[]]``. Walks the whole value (no recursion)."""
    return _heights(value).get(id(value), 0)


def _scalar(item: Any, option: int) -> bytes:
    try:
        return orjson.dumps(item, option=option)
    except orjson.JSONEncodeError:
        if isinstance(item, int) and not _INT_MIN <= item <= _INT_MAX:
            return int.__repr__(item).encode()  # the digits, whatever a subclass's repr says
        raise


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
