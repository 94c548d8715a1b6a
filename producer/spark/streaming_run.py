"""One run of a streaming query as :class:`~producer.spark.streaming.StreamingLineage` knows
it (:class:`_Run`): the query, the datasets and row counts last known, what was looked up once,
what could not be read and what was last reported.

A plain record with no lock of its own: :mod:`producer.spark.streaming` says which thread
changes what, under which lock. What could not be read (:meth:`_Run.note`) is kept for the run,
each message once and at most ``_MAX_ERRORS`` of them (the first); what was left out is replaced
at each read; :meth:`_Run.extraction_errors` gives both, at most ``_MAX_ERRORS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from producer.spark.capture import DatasetRef
from producer.spark.streaming_stats import RowCounts

_MAX_ERRORS = 8


@dataclass
class _Run:
    run_id: str
    job_name: str
    query: Any = None          # the JVM StreamExecution, for the Kafka servers and sink topic (read once)
    inputs: list[DatasetRef] = field(default_factory=list)
    outputs: list[DatasetRef] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)     # what could not be read: kept for the run
    left_out: list[str] = field(default_factory=list)   # datasets left out at the last read: replaced by the next
    reported: tuple | None = None
    next_read: float = float("-inf")   # due at once: the first micro-batch is read
    read: bool = False                  # a progress was read (else its last one is, when it stops)
    kafka_servers: list[str | None] | None = None   # each streaming leaf's, in plan order
    kafka_looked_up: bool = False
    kafka_sink: DatasetRef | str | None = None   # a Kafka sink's topic, or why it is not known
    kafka_sink_looked_up: bool = False
    output_schema: list[dict] | None = None      # the schema the query writes (its analysed plan's)
    schema_looked_up: bool = False
    source_refs: list[list[DatasetRef]] = field(default_factory=list)  # each progress source's datasets
    input_schemas: list[list[dict]] | None = None  # each progress source's schema (its logical plan's)
    input_schemas_looked_up: bool = False
    counts: RowCounts = field(default_factory=RowCounts)
    first_batch: int | None = None    # the batchId of the progress that triggered its first read (the counts' floor)
    read_at_progress: int = 0         # the session's progress callbacks when it was last read
    matched: dict[int, list[str]] = field(default_factory=dict)  # topics each Kafka source showed offsets for

    def key(self) -> tuple:
        return (tuple((r.namespace, r.name) for r in self.inputs), tuple((r.namespace, r.name) for r in self.outputs))

    def note(self, message: str) -> None:
        if len(self.errors) < _MAX_ERRORS and message not in self.errors:
            self.errors.append(message)

    def extraction_errors(self) -> list[str]:
        return (self.errors + [m for m in self.left_out if m not in self.errors])[:_MAX_ERRORS]
