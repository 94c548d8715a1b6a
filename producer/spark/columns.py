"""Column lineage from an analysed Spark plan, traced by expression ids.

Every attribute in a Spark plan has an ``exprId``; an ``Alias`` mints a new one. Walking the
plan bottom-up we record, for every exprId, which input-dataset columns it derives from and
how: DIRECT (IDENTITY, TRANSFORMATION, AGGREGATION) or INDIRECT (CONDITIONAL, WINDOW for a
single column; FILTER, JOIN, GROUP_BY, SORT for the whole dataset). One expression's
references and how transformations compose (one entry per distinct type, subtype and
masking, as the official integration) are :mod:`producer.spark.column_exprs`'.

Subquery plans (IN, EXISTS, scalar subqueries) are separate trees held by an expression's
``plan`` field: their leaves are inputs too, numbered after the main plan's in the order of
:func:`leaf_groups`, and their output columns feed the expression that holds them (so an
``IN (SELECT ...)`` in a WHERE is a FILTER dependency). What decides a subquery's own rows
filters the output where it sits in a filter or join, and only its column where it sits in
the SELECT list. A common table expression's references (``CTERelationRef``) carry the
columns of their definition (same ``cteId``).

Contract: pure Python over :mod:`producer.spark.plan` trees. Node classes it does not know
pass their children's columns through unchanged; when they list their own ``output``, a
column the children do not have gets no lineage (see ``_Tracer._passed_through``), so an
unknown operator can make the answer less complete, never wrong about which columns feed
which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from producer.spark.column_exprs import (
    MASKING_FUNCTIONS,
    RANK,
    RANKING_FUNCTIONS,
    Lineage,
    Ref,
    SourceField,
    derive,
    expression_refs,
)
from producer.spark.plan import Node, parse_plan

__all__ = ["MASKING_FUNCTIONS", "RANKING_FUNCTIONS", "ColumnLineageResult", "Lineage", "SourceField", "facet_fields",
           "leaf_groups", "plan_leaves", "subquery_plans", "trace"]

_LEFT_ONLY_JOINS = ("LeftSemi", "LeftAnti", "ExistenceJoin")
#: Operators that compute columns from expressions: a subquery in one of them decides a
#: column's value, not which rows are kept (see ``_Tracer._subqueries_of``).
_VALUE_NODES = ("Project", "Aggregate", "Window", "Generate", "Expand")


@dataclass
class ColumnLineageResult:
    """``columns``: output column name -> its lineage; ``dataset``: whole-dataset INDIRECT
    dependencies (source, subtype)."""

    columns: list[tuple[str, Lineage]] = field(default_factory=list)
    dataset: set[tuple[SourceField, str]] = field(default_factory=set)


def _plans_in(value: Any, found: list[list[dict]]) -> None:
    """Subquery plans (flat JSON) held by the expressions in one field's value, in pre-order.
    Like Spark's ``Expression.collect``, a subquery expression's other fields are not
    entered: a nested subquery belongs to its own plan's expressions."""
    if not isinstance(value, list):
        return
    for item in value:
        if isinstance(item, dict):
            plan = item.get("plan")
            if isinstance(plan, list) and plan:
                found.append(plan)
        elif isinstance(item, list):
            _plans_in(item, found)


def _direct_subqueries(plan_nodes: Iterable[Mapping[str, Any]]) -> list[list[dict]]:
    """Spark's ``QueryPlan.subqueries`` over every node (``plan_nodes``: their fields, in
    pre-order), as flat JSON arrays."""
    found: list[list[dict]] = []
    for fields in plan_nodes:
        for value in fields.values():
            _plans_in(value, found)
    return found


def subquery_plans(plan_nodes: Iterable[Mapping[str, Any]]) -> list[list[dict]]:
    """Spark's ``QueryPlan.subqueriesAll`` order: the subqueries of every node in pre-order,
    then, for each of them, its own ``subquery_plans``."""
    direct = _direct_subqueries(plan_nodes)
    return direct + [plan for sub in direct for plan in subquery_plans(sub)]


def leaf_groups(nodes: list[dict]) -> list[list[dict]]:
    """The leaves of a plan's flat JSON (Spark's ``collectLeaves()`` order), then those of
    each subquery plan in ``subqueriesAll()`` order: one list per plan. The JVM side
    collects the leaves it resolves in this same order."""
    return [[n for n in plan if n.get("num-children") == 0] for plan in [nodes, *subquery_plans(nodes)]]


def plan_leaves(query: Node) -> list[Node]:
    """The leaves of ``query`` and of its subquery plans, in :func:`leaf_groups` order (the
    order of the relations the JVM side resolves). Subquery plans are parsed here, so their
    leaves are not the objects :class:`_Tracer` numbers; use this for their schemas."""
    return query.leaves() + [leaf for raw in subquery_plans(n.fields for n in query.walk())
                             for leaf in parse_plan(raw).leaves()]


def _output_ids(exprs: list[Node]) -> list[int | None]:
    return [e.expr_id for e in exprs]


def _is_union(plan: Node) -> bool:
    """``plan`` is a ``Union`` once Spark's optimizer drops the aliases, views and projections
    of bare columns above it (they would push into its branches)."""
    while plan.cls in ("SubqueryAlias", "View", "Project") and len(plan.children) == 1:
        if plan.cls == "Project" and any(e.cls != "AttributeReference" for e in plan.exprs("projectList")):
            return False
        plan = plan.children[0]
    return plan.cls == "Union"


def trace(query: Node, leaf_dataset: Callable[[int, Node], int | Iterable[int] | None]) -> ColumnLineageResult:
    """Trace ``query``'s output columns back to the input datasets.

    ``leaf_dataset(i, leaf)`` gives the input dataset index of the ``i``-th leaf, the indexes
    of every dataset that holds its columns (several directories read as one), or None /
    nothing for leaves whose columns are no dataset's (an in-memory DataFrame, a JDBC
    query's result); leaves are numbered in
    :func:`leaf_groups` order (the main plan's in pre-order, then each subquery plan's).
    """
    return _Tracer(query, leaf_dataset).run()


class _Tracer:
    """One trace: lineage by exprId, each plan node's output ids, CTE definitions' outputs."""

    def __init__(self, query: Node, leaf_dataset: Callable[[int, Node], int | Iterable[int] | None]) -> None:
        self.query = query
        self.leaf_dataset = leaf_dataset
        self.attrs: dict[int, Lineage] = {}
        self.outputs: dict[int, list[int | None]] = {}
        self.result = ColumnLineageResult()
        self.ctes: dict[Any, list[int | None]] = {}        # cteId -> its definition's output ids
        self.sub_outputs: dict[int, list[int | None]] = {}  # id(subquery JSON) -> output ids
        self.next_synthetic = -1   # ids (negative: never Spark's) of what a subquery's own rows depend on
        raw_subs = subquery_plans(n.fields for n in query.walk())
        self.sub_plans = {id(raw): parse_plan(raw) for raw in raw_subs}
        leaves = query.leaves() + [leaf for raw in raw_subs for leaf in self.sub_plans[id(raw)].leaves()]
        self.leaf_index = {id(n): i for i, n in enumerate(leaves)}

    def run(self) -> ColumnLineageResult:
        order = self._trace_plan(self.query)
        names = {e.expr_id: e.name for n in order
                 for f in ("projectList", "aggregateExpressions", "windowExpressions", "generatorOutput", "output")
                 for e in n.exprs(f) if e.expr_id is not None}
        # One entry per output column, even one without an exprId: facet_fields names the
        # columns by position.
        for pos, out_id in enumerate(self.outputs.get(id(self.query), [])):
            self.result.columns.append((names.get(out_id) or f"col{pos}", self.attrs.get(out_id, set())))
        return self.result

    def _refs(self, expr: Node) -> list[Ref]:
        return expression_refs(expr, self.sub_outputs)

    def _derive_all(self, exprs: list[Node]) -> None:
        for e in exprs:
            if e.expr_id is not None:
                self.attrs[e.expr_id] = derive(self._refs(e), self.attrs)

    def _indirect(self, exprs: list[Node], subtype: str) -> None:
        for expr in exprs:
            for ref_id, _kind, _sub, _mask in self._refs(expr):
                for src, _t, _st, _m in self.attrs.get(ref_id, ()):
                    self.result.dataset.add((src, subtype))

    def _subqueries_of(self, node: Node) -> None:
        """Trace the subquery plans this node's expressions hold (after its children, so a
        correlated subquery finds the outer columns it refers to). What decides a subquery's
        own rows (its WHERE, correlation, joins, grouping) filters this node's rows when the
        node filters or joins (a whole-dataset dependency); in a computed column (a scalar
        subquery or an EXISTS in the SELECT list) it decides that column's value only, so
        it is an INDIRECT dependency of that column, with its own subtype."""
        for raw in _direct_subqueries([node.fields]):
            if id(raw) in self.sub_outputs or id(raw) not in self.sub_plans:
                continue
            plan = self.sub_plans[id(raw)]
            outer, self.result.dataset = self.result.dataset, set()
            try:
                self._trace_plan(plan)
            finally:
                own, self.result.dataset = self.result.dataset, outer
            out_ids = list(self.outputs.get(id(plan), []))
            if node.cls in _VALUE_NODES and own:
                synthetic, self.next_synthetic = self.next_synthetic, self.next_synthetic - 1
                self.attrs[synthetic] = {(src, "INDIRECT", subtype, False) for src, subtype in own}
                out_ids.append(synthetic)
            else:
                self.result.dataset |= own
            self.sub_outputs[id(raw)] = out_ids

    def _trace_plan(self, plan: Node) -> list[Node]:
        """Post-order over ``plan`` without recursion; returns its nodes (pre-order)."""
        outputs = self.outputs
        order: list[Node] = []
        stack = [plan]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children)
        for node in reversed(order):
            kids = node.children
            cls = node.cls
            self._subqueries_of(node)
            if not kids:
                self._leaf(node)
                continue
            child_out = [i for c in kids for i in outputs.get(id(c), [])]
            if cls == "Project":
                self._derive_all(node.exprs("projectList"))
                outputs[id(node)] = _output_ids(node.exprs("projectList"))
            elif cls == "Aggregate":
                self._indirect(node.exprs("groupingExpressions"), "GROUP_BY")
                self._derive_all(node.exprs("aggregateExpressions"))
                outputs[id(node)] = _output_ids(node.exprs("aggregateExpressions"))
            elif cls == "Window":
                self._derive_all(node.exprs("windowExpressions"))
                outputs[id(node)] = outputs.get(id(kids[0]), []) + _output_ids(node.exprs("windowExpressions"))
            elif cls == "Generate":
                self._generate(node)
            elif cls == "Filter":
                self._indirect(node.exprs("condition"), "FILTER")
                outputs[id(node)] = child_out
            elif cls == "Join":
                self._indirect(node.exprs("condition"), "JOIN")
                join_type = str(node.fields.get("joinType"))
                left_only = any(t in join_type for t in _LEFT_ONLY_JOINS)
                outputs[id(node)] = outputs.get(id(kids[0]), []) if left_only else child_out
            elif cls == "Sort":
                self._indirect(node.exprs("order"), "SORT")
                outputs[id(node)] = child_out
            elif cls == "Union":
                self._union(node)
            elif cls in ("Intersect", "Except") and len(kids) == 2:
                # INTERSECT / EXCEPT [ALL] (intersect, exceptAll, subtract): the rows are the
                # left's; the right only decides which of them are kept, as a filter does.
                self._dataset_dependency(outputs.get(id(kids[1]), []), "FILTER")
                outputs[id(node)] = outputs.get(id(kids[0]), [])
            elif cls == "Expand":
                self._expand(node, child_out)
            elif cls in ("Distinct", "Deduplicate"):
                self._distinct(node, child_out)
            elif cls == "WithCTE":  # children: the definitions, then the query
                outputs[id(node)] = outputs.get(id(kids[-1]), [])
            else:
                outputs[id(node)] = self._passed_through(node, child_out)
                if cls == "CTERelationDef":
                    self.ctes[node.fields.get("id")] = child_out
        return order

    def _dataset_dependency(self, ids: list[int | None], subtype: str) -> None:
        """Every source of the columns ``ids`` as a whole-dataset INDIRECT dependency."""
        for ref_id in ids:
            for src, _t, _st, _m in self.attrs.get(ref_id, ()) if ref_id is not None else ():
                self.result.dataset.add((src, subtype))

    def _distinct(self, node: Node, child_out: list[int | None]) -> None:
        """SQL ``DISTINCT`` (``Distinct``), ``distinct()`` / ``dropDuplicates(keys)``
        (``Deduplicate``): rows are grouped by their keys (all columns for a DISTINCT), a
        GROUP_BY of the whole dataset, as the official integration sees them (Spark's
        optimizer makes them an ``Aggregate``). Not over a ``UNION`` on every column: that is
        SQL's ``UNION`` (distinct), as the official integration leaves it."""
        keys = _output_ids(node.exprs("keys")) if node.cls == "Deduplicate" else child_out
        if not (_is_union(node.children[0]) and set(child_out) <= set(keys)):
            self._dataset_dependency(keys, "GROUP_BY")
        self.outputs[id(node)] = child_out

    def _passed_through(self, node: Node, child_out: list[int | None]) -> list[int | None]:
        """An operator not known here: its children's columns, unchanged. When it lists its
        own ``output`` attributes those are its columns: one the children have (same exprId)
        keeps its lineage; a new one has none, whatever its position: the operator computes
        it opaquely (a script ``TRANSFORM`` may swap columns, ``mapInPandas`` returns
        anything), as the official integration gives it none."""
        own = _output_ids(node.exprs("output"))
        if not own:
            return child_out
        for out_id in own:
            if out_id is not None:
                self.attrs.setdefault(out_id, set())
        return own

    def _expand(self, node: Node, child_out: list[int | None]) -> None:
        """``Expand`` (ROLLUP, CUBE, GROUPING SETS, unpivot/melt): each input row becomes one row
        per projection, so output column ``i`` derives from the expressions at position ``i``
        of every projection. Spark's JSON leaves ``projections`` null when it holds Scala
        collections it does not serialise (a DataFrame unpivot's ArraySeq): then a column the
        child has keeps its lineage and a new one gets none (which child columns feed it is
        not known)."""
        own = node.exprs("output")
        projections = node.fields.get("projections")
        rows = [[parse_plan(e) if isinstance(e, list) and e and isinstance(e[0], dict) else None for e in row]
                for row in projections if isinstance(row, list)] if isinstance(projections, list) else []
        for pos, attr in enumerate(own):
            out_id = attr.expr_id
            if out_id is None:
                continue
            refs = [r for row in rows if pos < len(row) and row[pos] is not None for r in self._refs(row[pos])]
            if rows:
                self.attrs[out_id] = derive(refs, self.attrs)
            elif out_id not in self.attrs:
                self.attrs[out_id] = set()
        self.outputs[id(node)] = _output_ids(own) if own else child_out

    def _leaf(self, node: Node) -> None:
        exprs = node.exprs("output")
        self.outputs[id(node)] = _output_ids(exprs)
        if node.cls == "CTERelationRef":
            # A reference's columns are its definition's, by position; the first reference
            # may even share the definition's exprIds.
            defined = self.ctes.get(node.fields.get("cteId"))
            for pos, e in enumerate(exprs):
                if e.expr_id is None:
                    continue
                source = defined[pos] if defined is not None and pos < len(defined) else None
                if source is not None:
                    self.attrs[e.expr_id] = set(self.attrs.get(source, ()))
                else:
                    self.attrs.setdefault(e.expr_id, set())
            return
        index = self.leaf_index.get(id(node))
        found = self.leaf_dataset(index, node) if index is not None else None
        datasets = () if found is None else (found,) if isinstance(found, int) else tuple(found)
        for e in exprs:
            if e.expr_id is not None:
                self.attrs[e.expr_id] = (set() if e.name is None
                                         else {((ds, e.name), "DIRECT", "IDENTITY", False) for ds in datasets})

    def _generate(self, node: Node) -> None:
        """``explode(arr)`` and the like: every generated column derives from the generator's
        arguments; the child's columns pass through, less those Spark marked unrequired."""
        refs = [r for g in node.exprs("generator") for r in self._refs(g)]
        lineage = derive(refs, self.attrs)
        generated = node.exprs("generatorOutput")
        for e in generated:
            if e.expr_id is not None:
                self.attrs[e.expr_id] = set(lineage)
        unrequired = set(node.fields.get("unrequiredChildIndex") or [])
        child_ids = self.outputs.get(id(node.children[0]), [])
        self.outputs[id(node)] = [i for p, i in enumerate(child_ids) if p not in unrequired] + _output_ids(generated)

    def _union(self, node: Node) -> None:
        kids = node.children
        first = self.outputs.get(id(kids[0]), [])
        for pos, out_id in enumerate(first):
            if out_id is None:
                continue
            merged: Lineage = set(self.attrs.get(out_id, ()))
            for other in kids[1:]:
                other_ids = self.outputs.get(id(other), [])
                if pos < len(other_ids) and other_ids[pos] is not None:
                    merged |= self.attrs.get(other_ids[pos], set())   # every branch's, masked or not
            self.attrs[out_id] = merged
        self.outputs[id(node)] = first


def _order(kind: tuple[str, str, bool]) -> tuple:
    """DIRECT before INDIRECT, DIRECT by strength, INDIRECT by subtype; unmasked first."""
    t, st, m = kind
    return (t != "DIRECT", RANK.get(st, 0) if t == "DIRECT" else 0, st, m)


def facet_fields(result: ColumnLineageResult, datasets: list[tuple[str, str]],
                 column_names: list[str] | None = None, *, dataset_lineage: bool = True) -> tuple[dict, list[dict]]:
    """Render as the ColumnLineageDatasetFacet's ``fields`` and ``dataset`` members.
    ``column_names`` (the written schema's names) renames the output columns by position
    when it names exactly as many columns as were traced; otherwise the positions cannot be
    trusted and the plan's own names stand, for the columns of the schema a single traced
    column names (never a field outside the schema). ``dataset_lineage`` False (the official Spark
    integration's ``spark.openlineage.columnLineage.datasetLineageEnabled=false``): the
    whole-dataset dependencies go into the ``inputFields`` of every output field that has
    inputs of its own (a ``count(*)`` has none, and gets none) instead of ``dataset``, for
    consumers that read ``fields`` only."""
    fields: dict[str, dict] = {}
    # The written schema's names when the counts agree (by position). Otherwise the plan's
    # names, and only those the schema has, once: a name the trace found twice cannot be
    # told apart, and a field outside the schema is no field of the dataset.
    keep: set[str] | None = None
    if column_names is not None and len(column_names) != len(result.columns):
        traced = [name for name, _ in result.columns]
        keep = {n for n in column_names if traced.count(n) == 1}
        column_names = None
    for pos, (name, lineage) in enumerate(result.columns):
        if column_names is not None:
            name = column_names[pos]
        elif keep is not None and name not in keep:
            continue
        # one transformation per distinct (type, subtype, masking) of each source column, as
        # the official integration: a column read both raw and hashed is both
        by_src: dict[SourceField, set[tuple[str, str, bool]]] = {}
        for src, t, st, m in lineage:
            by_src.setdefault(src, set()).add((t, st, m))
        if not dataset_lineage and lineage:   # as the official: not into a field with no inputs
            for src, st in result.dataset:
                by_src.setdefault(src, set()).add(("INDIRECT", st, False))
        input_fields = []
        for (ds, col), kinds in sorted(by_src.items()):
            ns, ds_name = datasets[ds]
            transformations = [{"type": t, "subtype": st, "masking": m} for t, st, m in sorted(kinds, key=_order)]
            input_fields.append({"namespace": ns, "name": ds_name, "field": col, "transformations": transformations})
        if input_fields:
            fields[name] = {"inputFields": input_fields}
    dataset_level: list[dict] = []
    grouped: dict[SourceField, list[str]] = {}
    for src, st in (result.dataset if dataset_lineage else ()):
        grouped.setdefault(src, []).append(st)
    for (ds, col), subtypes in sorted(grouped.items()):
        ns, ds_name = datasets[ds]
        dataset_level.append({"namespace": ns, "name": ds_name, "field": col,
                              "transformations": [{"type": "INDIRECT", "subtype": s, "masking": False}
                                                  for s in sorted(subtypes)]})
    return fields, dataset_level
