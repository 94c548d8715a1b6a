"""What a streaming run read and wrote: each source's schema and the rows of its micro-batches.

* :func:`source_schemas` reads the schema of each of a query's sources from its logical plan
  (two py4j calls once a run: ``logicalPlan().toJSON()``), in the order of the progress's
  ``sources``: the plan's streaming leaves (``StreamingExecutionRelation`` for V1 sources,
  ``StreamingDataSourceV2ScanRelation`` for V2 ones such as Kafka) in plan order, a leaf that
  repeats an earlier one's output (one source used twice) counted once, as Spark counts it.
  When the leaves and the sources do not pair up, no input gets a schema.
* :class:`RowCounts` sums the rows of every micro-batch of a run, per source
  (``numInputRows``) and for the sink (``numOutputRows``), from the query's ``recentProgress``
  (Spark keeps the last ``spark.sql.streaming.numRecentProgressUpdates``, 100 by default),
  read by :func:`read_new_progress` newest first down to the last batch already counted (two
  py4j calls, then two per progress read). A batch is counted once by its ``batchId`` (a
  progress seen again adds only what it has more: an empty progress Spark 3.4 posts for the
  batch to come, then that batch). Exact, or nothing: when batches were dropped from the
  buffer before they were read (after the last batch counted, or, at the run's first read,
  from the batch whose progress triggered that read on), the counts are given up for the run
  (:attr:`RowCounts.lost`, the reason named), never reported short. The sink's count is known
  only when the sink reports one (Spark's file sink does not: ``-1``); then there is no output
  count.
* :func:`input_datasets` and :func:`output_datasets` put both on a run's datasets.
"""

from __future__ import annotations

from typing import Any

import orjson

from producer import events
from producer.spark import capture
from producer.spark.capture import DatasetRef

#: Spark's default ``spark.sql.streaming.numRecentProgressUpdates``.
RECENT_PROGRESS = 100
_STREAMING_LEAVES = ("StreamingExecutionRelation", "StreamingDataSourceV2ScanRelation")


def source_schemas(plan_json: str) -> list[list[dict]]:
    """Each streaming source's schema-facet fields, in the progress's ``sources`` order, from
    ``LogicalPlan.toJSON()`` (a pre-order list of the plan's nodes)."""
    schemas: list[list[dict]] = []
    seen: set[tuple] = set()
    for node in orjson.loads(plan_json):
        if not isinstance(node, dict) or str(node.get("class", "")).rsplit(".", 1)[-1] not in _STREAMING_LEAVES:
            continue
        attrs = [a[0] for a in node.get("output") or [] if isinstance(a, list) and a and isinstance(a[0], dict)]
        identity = tuple(str(a.get("exprId")) for a in attrs)
        if identity in seen:
            continue
        seen.add(identity)
        schemas.append(capture.struct_fields({"fields": [{"name": str(a.get("name", "")), "type": a.get("dataType")}
                                                         for a in attrs]}))
    return schemas


def read_new_progress(query: Any, since_batch: int | None) -> tuple[list[dict], bool]:
    """The query's kept progresses from the newest back to ``since_batch`` (included: it may
    have grown since), oldest first, and whether the buffer was read to its oldest entry."""
    recent = query.recentProgress()
    found: list[dict] = []
    for index in range(len(recent) - 1, -1, -1):
        progress = orjson.loads(str(recent[index].json()))
        found.append(progress)
        batch = progress.get("batchId")
        if since_batch is not None and isinstance(batch, int) and batch <= since_batch:
            return found[::-1], False
    return found[::-1], True


class RowCounts:
    """The rows of one run's micro-batches (see the module docstring)."""

    def __init__(self) -> None:
        self.rows_in: list[int] = []          # per source, in the progress's order
        self.rows_out: int | None = None      # None: the sink reports no count
        self.last_batch: int | None = None
        self.lost: str | None = None          # why the counts were given up
        self._seen: dict[int, tuple[list[int], int]] = {}   # the recent batches, as counted

    def add(self, progresses: list[dict], read_to_oldest: bool, *, floor: int | None = None) -> None:
        """Count what ``progresses`` (oldest first, from :func:`read_new_progress`) add.

        ``floor``: the ``batchId`` of the progress that triggered the run's first read, a batch
        the buffer must still hold at that read; used until a batch is counted (after that, the
        batch after the last one counted must still be there). A buffer read to its oldest entry
        that no longer holds it gives the counts up. ``None`` (a run first read at its end, by
        no progress callback): batches dropped before a run's first read go unnoticed."""
        if self.lost is not None:
            return
        needed = floor if self.last_batch is None else self.last_batch + 1
        if not progresses:
            if read_to_oldest and needed is not None:
                self.lost = (f"Spark's recent progress held no micro-batch from {needed} on "
                             "(spark.sql.streaming.numRecentProgressUpdates)")
            return
        batches = [p.get("batchId") for p in progresses]
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in batches):
            self.lost = "a progress without a batchId"
            return
        if read_to_oldest and needed is not None and batches[0] > needed:
            self.lost = (f"micro-batches {needed}-{batches[0] - 1} left Spark's recent progress "
                         "before they were read (spark.sql.streaming.numRecentProgressUpdates)")
            return
        for batch, progress in zip(batches, progresses):
            sources = [s for s in progress.get("sources") or [] if isinstance(s, dict)]
            rows_in = [max(0, _int(s.get("numInputRows"))) for s in sources]
            rows_out = _int((progress.get("sink") or {}).get("numOutputRows"))
            before_in, before_out = self._seen.get(batch, ([0] * len(rows_in), 0))
            if len(self.rows_in) < len(rows_in):
                self.rows_in.extend([0] * (len(rows_in) - len(self.rows_in)))
            for index, rows in enumerate(rows_in):
                prior = before_in[index] if index < len(before_in) else 0
                self.rows_in[index] += max(0, rows - prior)
                rows_in[index] = max(rows, prior)
            if rows_out >= 0:
                self.rows_out = (self.rows_out or 0) + max(0, rows_out - max(0, before_out))
            self._seen[batch] = (rows_in, max(rows_out, before_out))
            self.last_batch = batch if self.last_batch is None else max(self.last_batch, batch)
        for batch in [b for b in self._seen if b < self.last_batch - RECENT_PROGRESS]:
            del self._seen[batch]


def input_datasets(inputs: list[DatasetRef], source_refs: list[list[DatasetRef]],
                   schemas: list[list[dict]] | None, counts: RowCounts) -> list[dict]:
    """A run's inputs with their sources' schemas and rows read. ``source_refs``: the datasets
    of each progress source, in order. A dataset read by several sources gets their sum; a source
    that is several datasets (a Kafka source of two topics) gives its datasets a schema but no
    row count (its rows are not counted per topic)."""
    schema: dict[tuple[str, str], list[dict]] = {}
    rows: dict[tuple[str, str], int | None] = {}
    for index, refs in enumerate(source_refs):
        known = schemas[index] if schemas and index < len(schemas) else None
        read = counts.rows_in[index] if counts.lost is None and index < len(counts.rows_in) else None
        for ref in refs:
            key = (ref.namespace, ref.name)
            if known:
                schema.setdefault(key, known)
            if read is None or len(refs) != 1 or (key in rows and rows[key] is None):
                rows[key] = None
            else:
                rows[key] = (rows.get(key) or 0) + read
    out = []
    for ref in inputs:
        key = (ref.namespace, ref.name)
        read = rows.get(key)
        stats = None if read is None else {
            "inputStatistics": events.facet("InputStatisticsInputDatasetFacet", {"rowCount": read})}
        out.append(events.dataset(ref.namespace, ref.name, capture.dataset_facets(ref, schema.get(key)),
                                  input_facets=stats))
    return out


def output_datasets(outputs: list[DatasetRef], schema: list[dict] | None, counts: RowCounts) -> list[dict]:
    """A run's outputs with the schema it writes and, when its sink counts them, the rows its
    micro-batches wrote."""
    written = counts.rows_out if counts.lost is None else None
    stats = None if written is None else {
        "outputStatistics": events.facet("OutputStatisticsOutputDatasetFacet", {"rowCount": written})}
    return [events.dataset(r.namespace, r.name, capture.dataset_facets(r, schema), output_facets=stats)
            for r in outputs]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
