"""The records that flow through the relay's pipeline.

A Kafka record becomes either a :class:`LineageEvent` (decoded and valid) or a
:class:`Rejection` (with a machine reason code and a human detail). Stages pass
``LineageEvent`` objects around; nothing in here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

EventKind = Literal["run", "dataset", "job"]

#: Event types the OpenLineage spec names for a RunEvent.
EVENT_TYPES = frozenset({"START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"})
#: A run has exactly one of these, and nothing is forwarded after it.
TERMINAL_TYPES = frozenset({"COMPLETE", "ABORT", "FAIL"})
#: Kafka header of a record ``dlq redrive --to-topic`` wrote back to the topic it came
#: from: the relay delivers it even where it was seen before (dedupe, after the terminal).
REDRIVEN_FROM = "redriven_from"
#: With ``redriven_from``: the collectors (comma-separated) an earlier redrive already
#: delivered that record to; the relay does not send it to them again.
REDRIVEN_HAVE = "redriven_have"


class SourceRef(NamedTuple):
    """Where a record came from; rendered as ``topic/partition/offset``. (A named tuple:
    one is made per consumed record, at a third of a frozen dataclass's cost.)"""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str) -> SourceRef | None:
        """The inverse of ``str()`` (e.g. a dead letter's ``source`` header); None when
        ``text`` is not ``topic/partition/offset``."""
        parts = text.rsplit("/", 2)
        # isascii(): isdigit() takes "²", which int() refuses (a header written by another tool).
        if len(parts) != 3 or not parts[0] or not (parts[1] + parts[2]).isascii() \
                or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]))


@dataclass(slots=True, eq=False)
class LineageEvent:
    """A decoded, validated OpenLineage event.

    ``body`` is what collectors receive: the original bytes for JSON input, a JSON
    re-encoding for other encodings. ``digest`` identifies the content (canonical JSON:
    key order and whitespace ignored), so two events with equal digests are duplicates.
    ``event_type`` is ``None`` for DatasetEvent/JobEvent and for a RunEvent without one.
    """

    kind: EventKind
    doc: dict[str, Any]
    body: bytes
    digest: bytes
    event_time: datetime
    run_id: str | None = None
    event_type: str | None = None
    job_namespace: str | None = None
    job_name: str | None = None
    parent_run_id: str | None = None
    source: SourceRef | None = None
    #: Set by the pipeline: the Kafka key, the original value when ``body`` differs from it
    #: (non-JSON encodings; dead letters carry the original bytes), and when it was consumed.
    key: bytes | None = field(default=None, repr=False)
    raw: bytes | None = field(default=None, repr=False)
    consumed_at: float = field(default=0.0, repr=False)
    #: Set by the pipeline: opaque bookkeeping handle (offset tracking); stages ignore it.
    ticket: Any = field(default=None, repr=False)
    #: Set by decode: ``body`` holds an integer beyond 64 bits, which ``orjson.loads`` reads
    #: as the nearest float (``doc`` from decode has it exactly), or rarely a string that
    #: looks like one. What rebuilds the event from a tree parsed again reads ``body`` with
    #: ``relay.stages.json_bytes.exact`` only then: False, the default of every other
    #: constructor, skips that scan of the bytes.
    big_int: bool = field(default=False, repr=False)

    @property
    def original(self) -> bytes:
        return self.raw if self.raw is not None else self.body

    @property
    def is_terminal(self) -> bool:
        return self.event_type in TERMINAL_TYPES


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record cannot be forwarded. ``reason`` is a stable machine code
    (``not_utf8``, ``invalid_json``, ``unsupported_json``, ``not_object``, ``missing_field``,
    ``wrong_type``, ``invalid_value``, ``too_large``, ``empty``, ``undecodable``) used as the dead-letter ``reason``
    header and as a metric label; ``detail`` is for humans."""

    reason: str
    detail: str
