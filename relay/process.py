"""What a relay process sets for itself: the garbage collector, glibc's handling of huge
buffers, and its decode processes' CPU priority."""

from __future__ import annotations

import gc

from relay.memory import tune_malloc
from relay.sinks.http import HttpCollector

#: The cyclic garbage collector's first threshold in a relay process (see tune_gc): tracked
#: objects allocated, net of those freed, since its last collection.
_GC_YOUNG_OBJECTS = 500_000
#: How often the relay's loop collects the young generations itself, and every how many
#: of those collections it collects all of them (see PeriodicCollection).
GC_EVERY_S = 30.0
_GC_FULL_EVERY = 10


def tune_gc() -> None:
    """Process-wide GC settings for a relay process (see :func:`tune_process`).

    Events are acyclic JSON, freed by reference counting: a whole bench run of 120,000
    events leaves 300-600 objects in cycles (start-up and shutdown). The cyclic collector
    only burns CPU walking the events in flight. Start-up objects are frozen, and a
    collection starts only once :data:`_GC_YOUNG_OBJECTS` more tracked objects live than
    at the last one: a poll batch (~40,000 of them) or a lane's ``max_pending`` events
    (~100,000) come and go without one. The relay's loop collects on a timer too (see
    :class:`PeriodicCollection`), so cycles made on failure paths (exceptions and their
    tracebacks) are reclaimed however few objects are allocated.

    At 20,000 young objects (the previous setting) the collector ran twice a second with
    single-event POSTs, ~1.5 µs per event; without it the relay's process spent ~2.5 µs
    less per event and delivered ~3.5% more (eight alternating runs each). Freezing and a
    threshold of 20,000 against the default 700 had given 10-30% before.
    """
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_OBJECTS, 20, 20)


def tune_process() -> None:
    """What a relay process sets for itself at start-up (the CLI calls this): the garbage
    collector (:func:`tune_gc`) and glibc's handling of huge buffers
    (:func:`relay.memory.tune_malloc`)."""
    tune_gc()
    tune_malloc()


class PeriodicCollection:
    """The relay loop's own garbage collections, one per :meth:`collect` call (every
    :data:`GC_EVERY_S`): the young generations (what was allocated since the last
    collection), and every :data:`_GC_FULL_EVERY` times all of them, for cycles among
    objects that were still alive when a collection promoted them (see :func:`tune_gc`).
    Measured with a lane's ``max_pending`` events in flight: 13-44 ms for the young
    generations, 43-58 ms for all, so ~0.1% of the loop's time."""

    def __init__(self) -> None:
        self._rounds = 0

    def collect(self) -> None:
        self._rounds += 1
        gc.collect(2 if self._rounds % _GC_FULL_EVERY == 0 else 1)


def decode_priority(setting: str, collectors: list) -> str:
    """The decode processes' priority for ``pipeline.decode_priority`` (see the config).

    ``auto`` is ``idle`` when every collector POSTs one event per request: the event loop
    is then the bottleneck, and decoding, far ahead of it, takes only CPU nobody else wants
    (measured on two cores: +3% events/s; at ``low`` it still preempted the loop ~5% of the
    time). A batch collector (or a third-party kind) delivers faster than one process
    decodes, so there decoding must compete: ``low`` (``idle`` measured -6% there).
    """
    if setting != "auto":
        return setting
    return "idle" if collectors and all(type(c) is HttpCollector for c in collectors) else "low"
