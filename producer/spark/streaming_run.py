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
    session_key: int | None = None     # a foreachBatch query's own session (its identity hash): its writes are ours
    batch_outputs: list[dict] = field(default_factory=list)  # what its foreachBatch writes wrote (datasets)
    plan_json: str | None = None       # the logical plan's JSON, until both its reads below are done
    static: list[tuple[list[DatasetRef], list[dict]]] = field(default_factory=list)  # data at rest it reads, schema
    static_looked_up: bool = False

    def all_inputs(self) -> tuple[list[DatasetRef], list[list[DatasetRef]], list[list[dict]] | None]:
        """(inputs, each source's datasets, each source's schema) for :func:`input_datasets`: the
        progress's sources, then the data at rest the query reads besides (a stream-static
        join's), those the sources already name left out (their counts are the sources')."""
        streamed = {(r.namespace, r.name) for r in self.inputs}
        static = [([r for r in refs if (r.namespace, r.name) not in streamed], schema) for refs, schema in self.static]
        static = [(refs, schema) for refs, schema in static if refs]
        if not static:
            return self.inputs, self.source_refs, self.input_schemas
        inputs = list(self.inputs)
        for refs, _ in static:
            inputs.extend(r for r in refs if not any((r.namespace, r.name) == (i.namespace, i.name) for i in inputs))
        schemas = [(self.input_schemas[i] if self.input_schemas and i < len(self.input_schemas) else [])
                   for i in range(len(self.source_refs))]
        return inputs, self.source_refs + [refs for refs, _ in static], schemas + [schema for _, schema in static]

    def key(self) -> tuple:
        return (tuple((r.namespace, r.name) for r in self.all_inputs()[0]),
                tuple((r.namespace, r.name) for r in self.outputs),
                tuple((d["namespace"], d["name"]) for d in self.batch_outputs))

    def note(self, message: str) -> None:
        if len(self.errors) < _MAX_ERRORS and message not in self.errors:
            self.errors.append(message)

    def extraction_errors(self) -> list[str]:
        return (self.errors + [m for m in self.left_out if m not in self.errors])[:_MAX_ERRORS]
