"""Batch request bodies (relay.sinks.batch): an *envelope* joins the events' JSON bodies,
as they are, into the body a collector's batch endpoint takes."""

from __future__ import annotations

from collections.abc import Callable

#: Builds a batch request body from the events' JSON bodies (no re-encoding).
Envelope = Callable[[list[bytes]], bytes]
#: Bytes the widest envelope adds around the events (``{"events":[`` ... ``]}``).
ENVELOPE_BYTES = 16


def enclose(head: bytes, bodies: list[bytes], tail: bytes) -> bytes:
    """``head + b",".join(bodies) + tail``, copying the bodies once instead of three times.
    Each intermediate of a batch's size is a large allocation that glibc hands back to the
    system and faults in again: 5.2 against 0.19 µs per event for 200 events of 3.5 KB."""
    if len(bodies) < 2:
        return head + b"".join(bodies) + tail
    return b",".join([head + bodies[0], *bodies[1:-1], bodies[-1] + tail])


def json_array(bodies: list[bytes]) -> bytes:
    """The proposed batch body (OpenLineage PR #4109): a JSON array of events."""
    return enclose(b"[", bodies, b"]")
