"""Sharing equal strings (facet JSON text, event bases) between runs without keeping them
for ever: :data:`intern` is ``sys.intern`` where interned strings are freed with their last
user, else a :class:`TextPool`."""

from __future__ import annotations

import sys
import sysconfig


def interning_is_mortal(version: tuple[int, ...] = tuple(sys.version_info[:3]),
                        implementation: str = sys.implementation.name,
                        free_threaded: bool = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))) -> bool:
    """Whether ``sys.intern``-ed strings are freed with their last user. Not in CPython
    3.12.0-3.12.5 (python/cpython#113993, fixed in 3.12.6), nor in free-threaded builds
    (which make them immortal): there, a relay interning every new facet would keep the
    text of every run it ever merged."""
    if implementation != "cpython":
        return True
    return not free_threaded and not (3, 12) <= version < (3, 12, 6)


class TextPool:
    """``sys.intern`` for the interpreters where interned strings never die: equal strings
    share one copy through a dict of its own, emptied whenever the text it holds reaches
    ``max_chars`` (then strings are shared again from scratch; held ones stay valid)."""

    __slots__ = ("_pool", "_chars", "_max_chars")

    def __init__(self, max_chars: int = 64 << 20) -> None:
        self._pool: dict[str, str] = {}
        self._chars = 0
        self._max_chars = max_chars

    def __call__(self, text: str) -> str:
        shared = self._pool.get(text)
        if shared is None:
            if self._chars + len(text) > self._max_chars:
                self._pool.clear()
                self._chars = 0
            shared = self._pool[text] = text
            self._chars += len(text)
        return shared


#: Equal strings in, one shared copy out.
intern = sys.intern if interning_is_mortal() else TextPool()
