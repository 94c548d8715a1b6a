"""The changelog record of one run: how a :class:`~relay.state.table.RunStateTable` writes
a run's state, dedupe memory and outbox, and reads them back. Pure: no I/O, no clock.

Format: key ``<collector>/<run_id>``, value JSON
``{"v": 1, "state": <RunConsolidator.to_state>, "seen": <hex digests>, "outbox": [...]}``
(``seen`` only while the run is open, ``outbox`` only when it holds events); a tombstone
(no value) once the run is forgotten, or when it has neither state nor outbox. Read with
:func:`relay.stages.json_bytes.loads`, so that its events' integers beyond 64 bits come back
exact, not as floats.

A record the broker refuses as too large is made again reduced (:data:`FACETS_LEFT_OUT`):
the run's records leave out its merged facets (a restore builds its events without the
facets merged before), and if that is still too large (:data:`OUTBOX_LEFT_OUT`), the events
of its outbox read from the input topic (sent as themselves) too, and the facets of those
it built. A left-out event is marked in its place (:class:`OutboxMark`: its digest and
source offset); after a crash its copy read again takes the mark's place in the restored
outbox (:meth:`RunStateTable.refill`) and is sent in order.
"""

from __future__ import annotations

from typing import Any

import orjson

from relay.events import LineageEvent
from relay.stages.json_bytes import dumps, loads
from relay.stages.run_state import built_event, doc_without_facets, state_without_facets

RECORD_VERSION = 1
#: The size of an event's digest, as ``seen`` concatenates them.
DIGEST_BYTES = 16
#: How much of a run its records leave out (see :meth:`RunStateTable.written`).
WHOLE, FACETS_LEFT_OUT, OUTBOX_LEFT_OUT = 0, 1, 2


class OutboxMark:
    """In a restored outbox, the place of an event its record left out (read from the input
    topic, sent as itself): its copy read again takes it (see :meth:`RunStateTable.refill`).
    Never sent; the outbox waits at it."""

    __slots__ = ("digest", "topic", "partition", "offset")
    event_type = None
    is_terminal = False

    def __init__(self, digest: bytes, topic: str, partition: int, offset: int) -> None:
        self.digest, self.topic, self.partition, self.offset = digest, topic, partition, offset

    def to_json(self) -> list:
        return [self.digest.hex(), self.topic, self.partition, self.offset]


def encode_record(state: dict[str, Any] | None, seen: bytes, outbox: list[LineageEvent | OutboxMark] | tuple,
                  reduced: int, partition: int) -> bytes | None:
    """The record value of a run in ``state`` (None: a tombstone, when there is no state
    and no outbox), reduced as much as ``reduced`` says; ``partition`` is the run's."""
    if state is None and not outbox:
        return None
    record: dict[str, Any] = {"v": RECORD_VERSION, "state": state_without_facets(state) if reduced else state}
    if state is not None and "closed" not in state:
        record["seen"] = seen.hex()
    if outbox:
        left_out = partition if reduced == OUTBOX_LEFT_OUT else None
        record["outbox"] = [_outbox_entry(event, left_out) for event in outbox]
    return orjson.dumps(record)


def decode_record(run_id: str, value: bytes, now: float) -> tuple[dict[str, Any] | None, list, Any]:
    """``run_id``'s state, outbox (events built at ``now``, and marks) and ``seen`` (hex,
    as written: read by the caller, only for a run it keeps) from a record value. Raises
    ValueError for a record this version cannot read."""
    try:
        record = loads(value)  # its events' integers beyond 64 bits exact, not floats
    except orjson.JSONDecodeError as err:
        raise ValueError(f"run state for {run_id} is not JSON: {err}") from err
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
        raise ValueError(f"run state for {run_id} is not a version {RECORD_VERSION} record")
    outbox = [built_event(entry, now) if isinstance(entry, dict) else _read_mark(run_id, entry)
              for entry in record.get("outbox") or ()]
    return record.get("state"), outbox, record.get("seen")


def _outbox_entry(event: LineageEvent | OutboxMark, left_out: int | None) -> Any:
    """How a record holds an outbox event: whole, unless the outbox is left out (its run's
    partition ``left_out``): then an event read from that partition is a mark (its copy is
    read again after a crash, its offset not committed before it is delivered), one the run
    built is kept without its facets. One read from another partition is kept whole: that
    partition may stay here, and a revocation settles it (its new owner sends it)."""
    if type(event) is OutboxMark:
        return event.to_json()
    if left_out is None:
        return orjson.Fragment(event.body)
    src = event.source
    if src is None or event.ticket is None:
        return orjson.Fragment(dumps(doc_without_facets(loads(event.body))))
    if src.partition != left_out:
        return orjson.Fragment(event.body)
    return [event.digest.hex(), src.topic, src.partition, src.offset]


def _read_mark(run_id: str, entry: Any) -> OutboxMark:
    try:
        digest, topic, partition, offset = entry
        return OutboxMark(bytes.fromhex(digest), topic, int(partition), int(offset))
    except (TypeError, ValueError) as err:
        raise ValueError(f"malformed outbox entry in run state for {run_id}: {entry!r}") from err
