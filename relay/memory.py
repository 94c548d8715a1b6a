"""Give memory freed after a huge event back to the operating system.

Parsing a 20 MB event makes a tree of ~130 MB of small objects. CPython frees them, but
glibc keeps most of that heap mapped, so the relay's resident size stays near its worst
moment and the next huge event's peak lands on top of it. :func:`release_after` calls
glibc's ``malloc_trim`` after an event at least :data:`TRIM_AFTER_BYTES` large (a few ms,
next to the ~100 ms such an event takes); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: Events smaller than this leave too little behind to be worth a trim.
TRIM_AFTER_BYTES = 4 * 1024 * 1024


def _malloc_trim():  # noqa: ANN202 - a ctypes function or None
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to do
        return None


_TRIM = _malloc_trim()


def release_after(size: int) -> None:
    """Call after handling an event of ``size`` bytes whose parsed tree is gone."""
    if _TRIM is not None and size >= TRIM_AFTER_BYTES:
        _TRIM(0)
