"""The relay's own headers on consumed records: ``redriven_from`` and ``redriven_have``
(written by ``dlq redrive --to-topic``, :mod:`relay.ops.redrive_targets`).

Guarantee: reading them never raises. A record's headers come from whatever producer
wrote it, and a raise while the relay handles a record would fail the relay on that same
record after every restart (every replica of a group in turn). What cannot be read is
ignored, logged with the record's position, and the record is handled without it:
delivered at least once rather than lost or dead-lettered.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable

from relay.events import REDRIVEN_FROM, REDRIVEN_HAVE, SourceRef
from relay.logs import log_event

log = logging.getLogger("relay.source")

#: Of a ``redriven_have`` logged, the names shown (the first, sorted) and the characters
#: shown of each: the header is the producer's, of any size (a log line must stay one).
_NAMES_LOGGED = 10
_NAME_CHARS_LOGGED = 64


def collectors_named(values: Iterable[bytes | None]) -> tuple[frozenset[str], bool]:
    """The collector names in ``redriven_have`` header values (comma-separated UTF-8), and
    whether some name was not UTF-8. Such a name is left out: it names no collector, so
    the record goes to that collector too (at least once). Pure; never raises."""
    names: set[str] = set()
    unreadable = False
    for value in values:
        if not isinstance(value, bytes):
            continue
        for part in value.split(b","):
            try:
                names.add(part.decode())
            except UnicodeDecodeError:
                unreadable = True
    names.discard("")
    return frozenset(names), unreadable


def redriven_have(message, source: SourceRef) -> frozenset[str] | None:
    """None for a record ``dlq redrive --to-topic`` did not write back (no ``redriven_from``
    header), else the collectors its ``redriven_have`` names (the relay leaves them out).
    Headers that cannot be read at all (e.g. a name that is not UTF-8) are ignored: the
    record is an ordinary one. Each problem is logged once per record, on a line of bounded
    size (the count of names and the first few, cut); never raises."""
    try:
        headers = message.headers()
    except Exception as err:  # noqa: BLE001 - any record must be handled, whatever wrote it
        log_event(log, logging.WARNING, "record_headers_unreadable", source=str(source), error=repr(err),
                  hint="its headers are ignored: handled as a record without headers")
        return None
    if not headers or not any(name == REDRIVEN_FROM for name, _ in headers):
        return None
    have, unreadable = collectors_named(v for name, v in headers if name == REDRIVEN_HAVE)
    if unreadable:
        shown = [name if len(name) <= _NAME_CHARS_LOGGED else name[:_NAME_CHARS_LOGGED] + "..."
                 for name in heapq.nsmallest(_NAMES_LOGGED, have)]
        log_event(log, logging.WARNING, "redriven_have_unreadable", source=str(source), have=shown,
                  have_count=len(have),
                  hint="names in header redriven_have that are not UTF-8 are ignored: the record goes to "
                       "those collectors too")
    return have
