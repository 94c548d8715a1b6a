"""Column lineage inside one expression: which attributes it reads, and how.

A lineage is a set of transformations ``(source, type, subtype, masking)``: a column of an
input dataset reached along one path, as the official integration's
``ColumnLevelLineageBuilder`` keeps one entry per distinct (type, subtype, masking). So
``concat(v, md5(v))`` has ``v`` both unmasked and masked, and ``CASE WHEN c THEN sha2(v)
ELSE v END`` has ``v`` as a masked TRANSFORMATION and as an IDENTITY: the raw values flow too.

Along one path the types compose as the official ``TransformationInfo.merge``: an INDIRECT
step stays INDIRECT with its subtype, DIRECT steps take the stronger subtype (IDENTITY <
TRANSFORMATION < AGGREGATION), and masking (a hash of the value, a count) sticks once applied.
The value positions of CASE WHEN / IF / COALESCE and a function Spark replaces by another
(``nvl`` -> ``coalesce``) add no transformation of their own: ``coalesce(v, 'z')`` is ``v``
as an IDENTITY (plus INDIRECT CONDITIONAL: whether it is null picks the result).

Contract: pure Python over :mod:`producer.spark.plan` expression trees.
"""

from __future__ import annotations

from collections.abc import Mapping

from producer.spark.plan import Node

SourceField = tuple[int, str]                 # (input dataset index, column name)
#: (source, "DIRECT"|"INDIRECT", subtype, masking)
Transformation = tuple[SourceField, str, str, bool]
Lineage = set[Transformation]
#: A reference inside an expression: (exprId, type, subtype, masking).
Ref = tuple[int, str, str, bool]

RANK = {"IDENTITY": 0, "TRANSFORMATION": 1, "AGGREGATION": 2}
#: Functions whose result does not reveal the values they read (as the official
#: ExpressionTraverser's list, Count included: a count carries no value of its column).
MASKING_FUNCTIONS = frozenset({"Sha1", "Sha2", "Md5", "Crc32", "Murmur3Hash", "XxHash64", "HiveHash", "Mask", "Count"})
#: Window functions computed from the window's ordering alone: their arguments are the
#: ORDER BY columns, an INDIRECT (WINDOW) dependency rather than a value they carry.
RANKING_FUNCTIONS = frozenset({"Rank", "DenseRank", "PercentRank", "RowNumber", "NTile", "CumeDist"})


def _passes_values(node: Node) -> bool:
    """A node whose value is one of its children's as is: an ``Alias``, or a function Spark
    replaces by another (``nvl``, ``ifnull``, ``nvl2``, ``left``...: a ``replacement``
    field, its only child), which the replacement describes."""
    return node.cls == "Alias" or "replacement" in node.fields


def expression_refs(expr: Node, subqueries: Mapping[int, list[int | None]] | None = None) -> list[Ref]:
    """Attribute references inside one expression: (exprId, type, subtype, masking).
    A subquery expression refers to its plan's output columns (``subqueries``: output ids
    by ``id()`` of the plan's JSON); its own children (the correlated outer columns) are
    left to the subquery's filter, which names them through ``OuterReference``."""
    out: list[Ref] = []
    # (node, aggregated, transformed, indirect subtype or None, masking)
    stack: list[tuple[Node, bool, bool, str | None, bool]] = [(expr, False, False, None, False)]
    while stack:
        node, agg, changed, indirect, mask = stack.pop()
        if node.cls == "AttributeReference" or isinstance(node.fields.get("plan"), list):
            if indirect:
                kind, sub = "INDIRECT", indirect
            else:
                kind, sub = "DIRECT", "AGGREGATION" if agg else "TRANSFORMATION" if changed else "IDENTITY"
            ids = ([node.expr_id] if node.cls == "AttributeReference"
                   else (subqueries or {}).get(id(node.fields["plan"]), []))
            out.extend((i, kind, sub, mask) for i in ids if i is not None)
            continue
        kids = node.exprs("e") if node.cls == "OuterReference" else node.children  # an outer column: its field
        if node.cls == "OuterReference" or _passes_values(node):
            stack.extend((c, agg, changed, indirect, mask) for c in kids)
            continue
        mask = mask or node.cls in MASKING_FUNCTIONS
        if node.cls == "CaseWhen":
            # children: condition, value, ... [, else value]; a value is the result as is
            has_else = node.fields.get("elseValue") not in (None, [])
            pairs = (len(kids) - (1 if has_else else 0)) // 2
            for i, child in enumerate(kids):
                is_condition = i < 2 * pairs and i % 2 == 0
                stack.append((child, agg, changed, "CONDITIONAL" if is_condition else indirect, mask))
        elif node.cls == "If" and kids:
            stack.append((kids[0], agg, changed, "CONDITIONAL", mask))
            stack.extend((c, agg, changed, indirect, mask) for c in kids[1:])
        elif node.cls == "Coalesce":
            # each argument is a value of the result, and whether it is null picks the result
            for c in kids:
                stack.append((c, agg, changed, indirect or "CONDITIONAL", mask))
                stack.append((c, agg, changed, indirect, mask))
        elif node.cls == "WindowSpecDefinition" or node.cls in RANKING_FUNCTIONS:
            stack.extend((c, agg, True, "WINDOW", mask) for c in kids)
        else:
            agg = agg or node.cls == "AggregateExpression"
            stack.extend((c, agg, True, indirect, mask) for c in kids)
    return out


def derive(refs: list[Ref], attrs: Mapping[int, Lineage]) -> Lineage:
    """The lineage of a value computed from ``refs``: each reference's own lineage composed
    with the way the expression reads it."""
    new: Lineage = set()
    for ref_id, kind, sub, mask in refs:
        for src, t, st, m in attrs.get(ref_id, ()):
            if t == "DIRECT" and kind == "DIRECT":
                new.add((src, "DIRECT", st if RANK[st] >= RANK[sub] else sub, m or mask))
            elif t == "DIRECT":
                new.add((src, "INDIRECT", sub, m or mask))
            else:
                new.add((src, "INDIRECT", st, m or mask))  # an indirect dependency is inherited as is
    return new
