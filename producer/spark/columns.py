"""Column lineage from an analysed Spark plan, traced by expression ids.

Every attribute in a Spark plan has an ``exprId``; an ``Alias`` mints a new one. Walking the
plan bottom-up we record, for every exprId, which input-dataset columns it derives from and
how: DIRECT (IDENTITY, TRANSFORMATION, AGGREGATION) or INDIRECT (CONDITIONAL, WINDOW for a
single column; FILTER, JOIN, GROUP_BY, SORT for the whole dataset). Transformations compose
by their strength (IDENTITY < TRANSFORMATION < AGGREGATION), and masking (a hash of the
value) sticks once applied.

Contract: pure Python over :mod:`producer.spark.plan` trees. Node classes it does not know
pass their children's columns through unchanged, so an unknown operator can make the
answer less precise (e.g. a missing INDIRECT), never wrong about which columns feed which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from producer.spark.plan import Node

SourceField = tuple[int, str]                 # (input dataset index, column name)
#: (source, "DIRECT"|"INDIRECT", subtype) -> masking
Lineage = dict[tuple[SourceField, str, str], bool]

_RANK = {"IDENTITY": 0, "TRANSFORMATION": 1, "AGGREGATION": 2}
MASKING_FUNCTIONS = frozenset({"Sha1", "Sha2", "Md5", "Crc32", "Murmur3Hash", "XxHash64", "HiveHash", "Mask"})
#: Window functions computed from the window's ordering alone: their arguments are the
#: ORDER BY columns, an INDIRECT (WINDOW) dependency rather than a value they carry.
RANKING_FUNCTIONS = frozenset({"Rank", "DenseRank", "PercentRank", "RowNumber", "NTile", "CumeDist"})
_LEFT_ONLY_JOINS = ("LeftSemi", "LeftAnti", "ExistenceJoin")


@dataclass
class ColumnLineageResult:
    """``columns``: output column name -> its lineage; ``dataset``: whole-dataset INDIRECT
    dependencies (source, subtype)."""

    columns: list[tuple[str, Lineage]] = field(default_factory=list)
    dataset: set[tuple[SourceField, str]] = field(default_factory=set)


def _refs(expr: Node) -> list[tuple[int, str, str, bool]]:
    """Attribute references inside one expression: (exprId, type, subtype, masking)."""
    top = expr.children[0] if expr.cls == "Alias" and expr.children else expr
    if top.cls == "AttributeReference":
        return [(top.expr_id, "DIRECT", "IDENTITY", False)] if top.expr_id is not None else []
    out: list[tuple[int, str, str, bool]] = []
    # (node, aggregated, indirect subtype or None, masking)
    stack: list[tuple[Node, bool, str | None, bool]] = [(top, False, None, False)]
    while stack:
        node, agg, indirect, mask = stack.pop()
        if node.cls == "AttributeReference":
            if node.expr_id is not None:
                if indirect:
                    out.append((node.expr_id, "INDIRECT", indirect, mask))
                else:
                    out.append((node.expr_id, "DIRECT", "AGGREGATION" if agg else "TRANSFORMATION", mask))
            continue
        if node.cls in ("ScalarSubquery", "Exists", "ListQuery", "InSubquery"):
            continue  # their plans are separate trees
        agg = agg or node.cls == "AggregateExpression"
        mask = mask or node.cls in MASKING_FUNCTIONS
        kids = node.children
        if node.cls == "CaseWhen":
            has_else = node.fields.get("elseValue") not in (None, [])
            pairs = (len(kids) - (1 if has_else else 0)) // 2
            for i, child in enumerate(kids):
                is_condition = i < 2 * pairs and i % 2 == 0
                stack.append((child, agg, "CONDITIONAL" if is_condition else indirect, mask))
        elif node.cls == "If" and kids:
            stack.append((kids[0], agg, "CONDITIONAL", mask))
            stack.extend((c, agg, indirect, mask) for c in kids[1:])
        elif node.cls == "WindowSpecDefinition" or node.cls in RANKING_FUNCTIONS:
            stack.extend((c, agg, "WINDOW", mask) for c in kids)
        else:
            stack.extend((c, agg, indirect, mask) for c in kids)
    return out


def _derive(refs: list[tuple[int, str, str, bool]], attrs: dict[int, Lineage]) -> Lineage:
    new: Lineage = {}
    for ref_id, kind, sub, mask in refs:
        for (src, t, st), m in attrs.get(ref_id, {}).items():
            if t == "DIRECT" and kind == "DIRECT":
                key = (src, "DIRECT", st if _RANK[st] >= _RANK[sub] else sub)
            elif t == "DIRECT":
                key = (src, "INDIRECT", sub)
            else:
                key = (src, "INDIRECT", st)  # an indirect dependency is inherited as is
            new[key] = new.get(key, False) or m or mask
    return new


def _indirect_sources(exprs: list[Node], attrs: dict[int, Lineage], subtype: str,
                      into: set[tuple[SourceField, str]]) -> None:
    for expr in exprs:
        for ref_id, _kind, _sub, _mask in _refs(expr):
            for (src, _t, _st) in attrs.get(ref_id, {}):
                into.add((src, subtype))


def _output_ids(exprs: list[Node]) -> list[int | None]:
    return [e.expr_id for e in exprs]


def trace(query: Node, leaf_dataset: Callable[[int, Node], int | None]) -> ColumnLineageResult:
    """Trace ``query``'s output columns back to the input datasets.

    ``leaf_dataset(i, leaf)`` gives the input dataset index of the ``i``-th leaf (pre-order)
    or None for leaves that are not datasets (an in-memory DataFrame).
    """
    attrs: dict[int, Lineage] = {}
    outputs: dict[int, list[int | None]] = {}
    result = ColumnLineageResult()
    leaf_index = {id(n): i for i, n in enumerate(query.leaves())}

    # Post-order without recursion.
    order: list[Node] = []
    stack = [query]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children)
    for node in reversed(order):
        kids = node.children
        cls = node.cls
        if not kids:
            exprs = node.exprs("output")
            ids = _output_ids(exprs)
            ds = leaf_dataset(leaf_index[id(node)], node)
            for e in exprs:
                if e.expr_id is not None:
                    attrs[e.expr_id] = {} if ds is None or e.name is None else {((ds, e.name), "DIRECT", "IDENTITY"): False}
            outputs[id(node)] = ids
            continue
        child_out = [i for c in kids for i in outputs.get(id(c), [])]
        if cls == "Project":
            exprs = node.exprs("projectList")
            for e in exprs:
                if e.expr_id is not None:
                    attrs[e.expr_id] = _derive(_refs(e), attrs)
            outputs[id(node)] = _output_ids(exprs)
        elif cls == "Aggregate":
            _indirect_sources(node.exprs("groupingExpressions"), attrs, "GROUP_BY", result.dataset)
            exprs = node.exprs("aggregateExpressions")
            for e in exprs:
                if e.expr_id is not None:
                    attrs[e.expr_id] = _derive(_refs(e), attrs)
            outputs[id(node)] = _output_ids(exprs)
        elif cls == "Window":
            exprs = node.exprs("windowExpressions")
            for e in exprs:
                if e.expr_id is not None:
                    attrs[e.expr_id] = _derive(_refs(e), attrs)
            outputs[id(node)] = outputs.get(id(kids[0]), []) + _output_ids(exprs)
        elif cls == "Filter":
            _indirect_sources(node.exprs("condition"), attrs, "FILTER", result.dataset)
            outputs[id(node)] = child_out
        elif cls == "Join":
            _indirect_sources(node.exprs("condition"), attrs, "JOIN", result.dataset)
            join_type = str(node.fields.get("joinType"))
            left_only = any(t in join_type for t in _LEFT_ONLY_JOINS)
            outputs[id(node)] = outputs.get(id(kids[0]), []) if left_only else child_out
        elif cls == "Sort":
            _indirect_sources(node.exprs("order"), attrs, "SORT", result.dataset)
            outputs[id(node)] = child_out
        elif cls == "Union":
            first = outputs.get(id(kids[0]), [])
            for pos, out_id in enumerate(first):
                if out_id is None:
                    continue
                merged: Lineage = dict(attrs.get(out_id, {}))
                for other in kids[1:]:
                    other_ids = outputs.get(id(other), [])
                    if pos < len(other_ids) and other_ids[pos] is not None:
                        for key, m in attrs.get(other_ids[pos], {}).items():
                            merged[key] = merged.get(key, False) or m
                attrs[out_id] = merged
            outputs[id(node)] = first
        else:
            outputs[id(node)] = child_out

    names = {e.expr_id: e.name for n in order for f in ("projectList", "aggregateExpressions", "windowExpressions", "output")
             for e in n.exprs(f) if e.expr_id is not None}
    for out_id in outputs.get(id(query), []):
        if out_id is not None:
            result.columns.append((names.get(out_id) or f"col{out_id}", attrs.get(out_id, {})))
    return result


def facet_fields(result: ColumnLineageResult, datasets: list[tuple[str, str]],
                 column_names: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Render as the ColumnLineageDatasetFacet's ``fields`` and ``dataset`` members.
    ``column_names`` renames the output columns by position (a write's target names)."""
    fields: dict[str, dict] = {}
    for pos, (name, lineage) in enumerate(result.columns):
        if column_names is not None and pos < len(column_names):
            name = column_names[pos]
        direct: dict[SourceField, tuple[str, bool]] = {}
        indirect: dict[tuple[SourceField, str], bool] = {}
        for (src, t, st), m in lineage.items():
            if t == "DIRECT":
                prev = direct.get(src)
                if prev is None or _RANK[st] > _RANK[prev[0]]:
                    direct[src] = (st, m or (prev[1] if prev else False))
                else:
                    direct[src] = (prev[0], prev[1] or m)
            else:
                indirect[(src, st)] = indirect.get((src, st), False) or m
        by_src: dict[SourceField, list[dict]] = {}
        for src, (st, m) in direct.items():
            by_src.setdefault(src, []).append({"type": "DIRECT", "subtype": st, "masking": m})
        for (src, st), m in sorted(indirect.items()):
            by_src.setdefault(src, []).append({"type": "INDIRECT", "subtype": st, "masking": m})
        input_fields = []
        for (ds, col), transformations in sorted(by_src.items()):
            ns, ds_name = datasets[ds]
            input_fields.append({"namespace": ns, "name": ds_name, "field": col, "transformations": transformations})
        if input_fields:
            fields[name] = {"inputFields": input_fields}
    dataset_level = []
    grouped: dict[SourceField, list[str]] = {}
    for src, st in result.dataset:
        grouped.setdefault(src, []).append(st)
    for (ds, col), subtypes in sorted(grouped.items()):
        ns, ds_name = datasets[ds]
        dataset_level.append({"namespace": ns, "name": ds_name, "field": col,
                              "transformations": [{"type": "INDIRECT", "subtype": s, "masking": False}
                                                  for s in sorted(subtypes)]})
    return fields, dataset_level
