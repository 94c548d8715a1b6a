"""An action's input leaves -> :class:`~producer.spark.relations.Relation` (or None), in plan order.

Every leaf of the written (or collected) query and of its subquery plans is an input, in the
order :func:`producer.spark.columns.leaf_groups` gives the plan's JSON (so that column lineage
can name them by position). The JSON says which leaves cannot be data at rest: those are never
fetched over py4j. With the batched reads (:mod:`producer.spark.batched_reads`) a plan without
subqueries is described in one call; a leaf that answer does not describe is read as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from producer.spark import batched_reads
from producer.spark.relations import QUALIFIED_PATH, RELATION_KINDS, SEP, LeafInfo, Relation, relation_of

if TYPE_CHECKING:
    from producer.spark.jvm import ActionSnapshot


def _leaf_infos(snap: ActionSnapshot) -> list[list[LeafInfo]] | None:
    """From the plan's JSON, its leaves in ``collectLeaves()`` order (both are pre-order
    walks of the children), then each subquery plan's in ``subqueriesAll()`` order (see
    :func:`producer.spark.columns.leaf_groups`): one list per plan; None when unknown."""
    from producer.spark.columns import (
        leaf_groups,  # pure; the one definition of the order
    )

    try:
        if snap.query_nodes is None:
            return None
        return [[LeafInfo(node["class"].rpartition(".")[2], node.get("catalogTable") is not None)
                 for node in group] for group in leaf_groups(snap.query_nodes)]
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def read_input_leaves(gateway: Any, snap: ActionSnapshot, query: Any, helper: Any = None) -> list[Relation | None]:
    """Every leaf of ``query`` and of its subquery plans (a table read only inside
    ``IN (SELECT ...)``, ``EXISTS`` or a scalar subquery is an input too), in the order of
    :func:`_leaf_infos`. Without subqueries (known from the JSON), two calls as before; with
    the batched reads (``helper``), one, plus the plain reads of a leaf it does not describe."""
    groups = _leaf_infos(snap)
    if helper is not None and groups is not None and len(groups) == 1:
        text = batched_reads.read_text(helper.leaves(query, SEP, batched_reads.PIECE_CHARS))
        try:
            summaries = batched_reads.fields(text, count=len(groups[0]))
        except ValueError:
            summaries = None   # a damaged answer, or not the leaves the JSON has: asked below
        if summaries is not None:
            return _described_leaves(gateway, query, groups[0], summaries)
    plans = [query]
    if groups is None or len(groups) > 1:
        subqueries = query.subqueriesAll()
        plans += [subqueries.apply(j) for j in range(subqueries.length())]
    # Indexed by length()/apply(): py4j's iterator protocol ends every loop with a Java
    # NoSuchElementException that PySpark converts at a cost of ~40 ms.
    seqs = [plan.collectLeaves() for plan in plans]
    counts = [seq.length() for seq in seqs]
    infos: list[list[LeafInfo | None]] = (
        groups if groups is not None and [len(g) for g in groups] == counts else [[None] * c for c in counts])
    # A leaf that cannot be data at rest (known from the JSON) is not even fetched.
    return [relation_of(gateway, seq.apply(i), info) if info is None or info.kind in RELATION_KINDS else None
            for seq, group in zip(seqs, infos) for i, info in enumerate(group)]


def _described_leaves(gateway: Any, query: Any, infos: list[LeafInfo], summaries: list) -> list[Relation | None]:
    """The leaves of ``query`` (no subqueries) from the helper's ``leaves`` answer: a file read
    with one qualified root and no catalog table as it describes it (what
    ``relations.relation_of`` would read); any other leaf that can be data at rest asked."""
    seq = None
    out: list[Relation | None] = []
    for i, (info, summary) in enumerate(zip(infos, summaries)):
        if info.kind not in RELATION_KINDS:
            out.append(None)
            continue
        rel = _described_file_read(info, summary)
        if rel is None:
            seq = seq if seq is not None else query.collectLeaves()
            rel = relation_of(gateway, seq.apply(i), info)
        out.append(rel)
    return out


def _described_file_read(info: LeafInfo, summary: Any) -> Relation | None:
    if info.kind != "LogicalRelation" or info.has_table or not isinstance(summary, str) or not summary.startswith("H"):
        return None
    file_format, _, joined = summary[1:].partition("\u001e")
    paths = joined.split(SEP) if joined else []
    if len(paths) > 1 or not all(QUALIFIED_PATH.match(path) for path in paths):
        return None  # several roots (directories), or one to qualify: asked
    return Relation(paths=paths, fmt=file_format.lower())
