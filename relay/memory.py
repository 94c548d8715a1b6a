"""Give memory freed after a huge event back to the operating system.

Parsing a 20 MB event makes a tree of ~130 MB of small objects. CPython frees them, but
glibc keeps most of that heap mapped, so the relay's resident size stays near its worst
moment and the next huge event's peak lands on top of it. :func:`release_after` calls
glibc's ``malloc_trim`` after an event at least :data:`TRIM_AFTER_BYTES` large (a few ms,
next to the ~100 ms such an event takes); elsewhere it does nothing.

:func:`tune_malloc` (called by ``lineage-relay run``, through ``relay.process.tune_process``, and
by the decode worker) makes
buffers of 17 MiB and more always get their own mapping, so a freed 20 MB record or dump
leaves nothing resident. glibc otherwise raises its threshold after freeing one, later
ones came from the heap, and the relay's peak in tests/relay/test_relay_oversize.py
varied by up to four such events (relay and decode worker 468-571 MiB over ten runs,
against 422-465 with it; the test's bound is 570).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: Events smaller than this leave too little behind to be worth a trim.
TRIM_AFTER_BYTES = 4 * 1024 * 1024


def _glibc():  # noqa: ANN202 - a ctypes library or None
    """The C library when it is glibc (it has malloc_trim and mallopt), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - not glibc (e.g. musl): AttributeError
        return libc
    except (OSError, AttributeError):
        return None


_GLIBC = _glibc()
_TRIM = _GLIBC.malloc_trim if _GLIBC is not None else None

#: glibc's ``mallopt`` parameters: the size from which allocations get their own mapping,
#: and how much free memory the top of the heap may keep before it is given back.
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
#: Buffers this large (record values of huge events and their JSON dumps) are mapped on
#: their own and unmapped when freed. glibc raises its threshold after each such free (up
#: to 32 MiB), after which 20 MB buffers came from the heap and stayed mapped there between
#: events, fragmented. Just above the consumer's fetch size (16 MiB), which keeps reusing
#: the heap as before.
MMAP_THRESHOLD_BYTES = 17 * 1024 * 1024
#: Setting the threshold stops glibc from adjusting both thresholds; its trim threshold
#: would stay at 128 KiB, and the heap would shrink and grow again (page faults) with
#: every poll batch: ~1 µs per event with a batch collector. Twice the mapping threshold
#: is where glibc's own adjustment would have put it.
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES


def tune_malloc() -> None:
    """Process-wide, for a relay or decode process: big buffers always get their own
    mapping (see :data:`MMAP_THRESHOLD_BYTES`), the heap keeps what it had kept before."""
    if _GLIBC is not None:
        _GLIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        _GLIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def release_after(size: int) -> None:
    """Call after handling an event of ``size`` bytes whose parsed tree is gone."""
    if _TRIM is not None and size >= TRIM_AFTER_BYTES:
        _TRIM(0)
