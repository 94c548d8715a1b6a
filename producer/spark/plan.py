"""Spark's ``TreeNode.toJSON()`` output as Python trees.

Spark serialises a plan (and every expression inside it) as a flat JSON array in
pre-order, each element carrying ``class`` and ``num-children``; fields that point at
children hold child indexes, and fields that hold other trees (a Project's
``projectList``, a Filter's ``condition``) hold nested flat arrays. :func:`parse_plan`
rebuilds the tree once, iteratively (plans thousands of nodes deep do not hit Python's
recursion limit), so that lineage analysis is plain Python over plain data: one py4j call
fetches the whole plan instead of one per node.

Contract: :class:`Node` keeps every field as Spark wrote it; :meth:`Node.exprs` parses a
field that holds expression trees on first use. Unknown node classes are kept, never an
error: the analysis treats them generically.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class Node:
    __slots__ = ("cls", "fields", "children", "_parsed")

    def __init__(self, cls: str, fields: dict[str, Any], children: list[Node]) -> None:
        self.cls = cls            # simple class name: "Project", "AttributeReference"
        self.fields = fields
        self.children = children
        self._parsed: dict[str, list[Node]] = {}

    def __repr__(self) -> str:
        return f"Node({self.cls}, {len(self.children)} children)"

    # -- expressions --------------------------------------------------------------------
    def exprs(self, name: str) -> list[Node]:
        """The expression trees held by field ``name`` (a list; empty when absent/null)."""
        cached = self._parsed.get(name)
        if cached is None:
            cached = _trees(self.fields.get(name))
            self._parsed[name] = cached
        return cached

    @property
    def expr_id(self) -> int | None:
        """``exprId.id`` of a named expression (AttributeReference, Alias), else None."""
        ref = self.fields.get("exprId")
        return ref.get("id") if isinstance(ref, dict) else None

    @property
    def name(self) -> str | None:
        value = self.fields.get("name")
        return value if isinstance(value, str) else None

    def walk(self) -> Iterator[Node]:
        """Pre-order over this node and its children (not into expression fields)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> list[Node]:
        """Nodes without children, in pre-order: the order Spark's ``collectLeaves`` uses."""
        return [n for n in self.walk() if not n.children]


def _simple(cls: str) -> str:
    return cls.rsplit(".", 1)[-1]


def parse_plan(nodes: list[dict[str, Any]]) -> Node:
    """Rebuild one tree from Spark's flat pre-order array. Raises ValueError when the
    array is not a well-formed tree."""
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("a plan is a non-empty JSON array")
    built: list[Node] = []
    # (node, children still to attach); children follow their parent in pre-order.
    pending: list[tuple[Node, int]] = []
    root: Node | None = None
    for raw in nodes:
        if not isinstance(raw, dict) or "class" not in raw:
            raise ValueError("a plan node is an object with a 'class'")
        n_children = int(raw.get("num-children", 0))
        fields = {k: v for k, v in raw.items() if k not in ("class", "num-children")}
        node = Node(_simple(raw["class"]), fields, [])
        built.append(node)
        if pending:
            parent, left = pending[-1]
            parent.children.append(node)
            if left == 1:
                pending.pop()
            else:
                pending[-1] = (parent, left - 1)
        elif root is None:
            root = node
        else:
            raise ValueError("the plan array holds more than one tree")
        if n_children:
            pending.append((node, n_children))
    if pending or root is None:
        raise ValueError("the plan array ends before every node has its children")
    return root


def _trees(value: Any) -> list[Node]:
    """A field holding one flat tree (``[{...}, ...]``) or several (``[[{...}], ...]``)."""
    if not isinstance(value, list) or not value:
        return []
    if isinstance(value[0], dict) and "class" in value[0]:
        return [parse_plan(value)]
    out: list[Node] = []
    for item in value:
        if isinstance(item, list) and item and isinstance(item[0], dict) and "class" in item[0]:
            out.append(parse_plan(item))
    return out
