"""Scrub a facet for one collector: credentials redacted, ``mask_keys`` values masked.

:class:`Scrubber` is the part of :class:`~relay.stages.rewrite.Rewriter` that walks a
facet's values (see that module for the contract of ``redact_credentials`` and
``mask_keys``). Pure and copy-on-write: the facet given is never changed; what is
returned shares every unchanged subtree with it, and is the facet itself when nothing
changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.stages.redact import Redactor

#: What a masked value becomes.
MASK = "***"
#: A facet's own fields of the spec: never masked (``mask_keys``), but their URLs lose their
#: credentials with ``redact_credentials`` like any string.
_ENVELOPE = frozenset({"_producer", "_schemaURL", "_deleted"})
#: Standard facets holding objects keyed by column (field) names, and that key: a column's
#: name is no setting's, so ``mask_keys`` never matches it; what is inside is scrubbed as
#: anywhere (the spec wants an object there: masked whole, the event would be refused).
_KEYED_BY_NAME = {"columnLineage": "fields", "dataQualityMetrics": "columnMetrics", "lineage": "fields"}
#: How :meth:`Scrubber.scrub` treats a value: redact its strings and mask the values of the
#: keys ``mask_keys`` matches; mask every string and number in it (it is under such a key);
#: or, for an object keyed by column names, scrub each member without matching its key.
_SCRUB, _MASK_ALL, _BY_NAME = 0, 1, 2


class Scrubber:
    """Redacts with ``redactor`` (None: no redaction) and masks the values of the keys
    ``mask`` matches (None: no masking)."""

    __slots__ = ("_redactor", "_mask")

    def __init__(self, redactor: Redactor | None, mask: Callable[[str], bool] | None) -> None:
        self._redactor = redactor
        self._mask = mask

    def facet(self, name: str, facet: Any) -> Any:
        """The facet ``name`` scrubbed (the standard facets keyed by column names keep their
        keys: see :data:`_KEYED_BY_NAME`)."""
        return self.scrub(facet, _KEYED_BY_NAME.get(name))

    def scrub(self, value: Any, names: str | None = None) -> Any:
        """Redact strings and mask keys at any depth; returns ``value`` itself if unchanged.
        ``names``: the key whose object, anywhere in ``value``, is keyed by column names
        (:data:`_KEYED_BY_NAME`). Recursion (~12% faster) unless the value is nested deeper
        than Python's recursion limit allows, which decode accepts
        (relay.stages.event_checks.MAX_DEPTH): then a loop. Neither changes ``value`` in
        place, so a recursion cut short leaves nothing behind."""
        try:
            return self._scrub_nested(value, names)
        except RecursionError:
            return self._scrub_deep(value, names)

    def _scrub_nested(self, value: Any, names: str | None = None, how: int = _SCRUB) -> Any:
        if how == _MASK_ALL:
            if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                return value if value == MASK else MASK
        elif isinstance(value, str):
            return self._redactor.text(value) if self._redactor is not None else value
        if isinstance(value, dict):
            out = None
            masked_pair = how == _SCRUB and self._masked_pair(value)
            for key, item in value.items():
                if key in _ENVELOPE and how != _BY_NAME:
                    # Never masked (the spec's own fields), but a URL there loses its credentials.
                    if self._redactor is None or not isinstance(item, str):
                        continue
                    new = self._redactor.text(item)
                else:
                    new = self._scrub_nested(item, names, self._inner(how, key, item, masked_pair, names))
                if new is item:
                    continue
                if out is None:
                    out = dict(value)
                out[key] = new
            return value if out is None else out
        if isinstance(value, list):
            inner = _MASK_ALL if how == _MASK_ALL else _SCRUB
            new_list = [self._scrub_nested(item, names, inner) for item in value]
            return new_list if any(n is not o for n, o in zip(new_list, value)) else value
        return value

    def _inner(self, how: int, key: str, item: Any, masked_pair: bool, names: str | None) -> int:
        """How a member of an object scrubbed ``how`` is scrubbed (see :data:`_SCRUB`)."""
        if how == _MASK_ALL:
            return _MASK_ALL
        if how == _BY_NAME:
            return _SCRUB  # the key is a column's name, not a setting's: never masked
        mask = self._mask
        if mask is not None and (mask(key) or (masked_pair and key == "value")):
            return _MASK_ALL
        return _BY_NAME if key == names and isinstance(item, dict) else _SCRUB

    def _masked_pair(self, obj: dict[str, Any]) -> bool:
        """Whether ``obj`` is a ``{"name": <masked key>, "value": ...}`` pair."""
        mask = self._mask
        if mask is None or "value" not in obj:
            return False
        name = obj.get("name")
        return isinstance(name, str) and mask(name)

    def _scrub_deep(self, value: Any, names: str | None = None) -> Any:
        """:meth:`scrub` as a loop, for values nested too deep to recurse over."""
        redactor = self._redactor
        if not isinstance(value, (dict, list)):
            return redactor.text(value) if redactor is not None and isinstance(value, str) else value
        frames = [self._frame(value, None, _SCRUB)]
        while True:
            frame = frames[-1]
            node, members, _copy, _place, is_dict, masked_pair, how = frame
            for place, item in members:
                if is_dict and place in _ENVELOPE and how != _BY_NAME:  # never masked (see _scrub_nested)
                    if redactor is not None and isinstance(item, str) and (new := redactor.text(item)) is not item:
                        _put(frame, place, new)
                    continue
                inner = self._inner(how, place, item, masked_pair, names) if is_dict else \
                    (_MASK_ALL if how == _MASK_ALL else _SCRUB)
                if isinstance(item, (dict, list)):
                    frames.append(self._frame(item, place, inner))
                    break
                if inner == _MASK_ALL:
                    if (isinstance(item, str) or (isinstance(item, (int, float)) and not isinstance(item, bool))) \
                            and item != MASK:
                        _put(frame, place, MASK)
                elif isinstance(item, str):
                    new = redactor.text(item) if redactor is not None else item
                    if new is not item:
                        _put(frame, place, new)
            else:  # every member done
                frames.pop()
                result = node if frame[2] is None else frame[2]
                if not frames:
                    return result
                if result is not node:
                    _put(frames[-1], frame[3], result)

    def _frame(self, container: dict[str, Any] | list[Any], place: Any, how: int) -> list[Any]:
        """What :meth:`scrub` keeps of a container it is in: [the container, its members
        left, its copy once a member changed, its place in the container above, whether it
        is an object, whether it is a masked ``{"name": ..., "value": ...}`` pair, how it is
        scrubbed]."""
        if isinstance(container, dict):
            masked_pair = how == _SCRUB and self._masked_pair(container)
            return [container, iter(container.items()), None, place, True, masked_pair, how]
        return [container, enumerate(container), None, place, False, False, how]


def _put(frame: list[Any], place: Any, new: Any) -> None:
    """Set a member of a :meth:`Scrubber._frame`'s container: in its copy, made at the first change."""
    if frame[2] is None:
        frame[2] = dict(frame[0]) if frame[4] else list(frame[0])
    frame[2][place] = new
