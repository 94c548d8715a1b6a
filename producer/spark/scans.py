"""An action's scans as its executed plan ran them: each leaf's kind, output attributes and
SQL metrics, read in one py4j call (:func:`read_scans`); plain data out (:class:`Scan`).

Why one call: walking the physical plan from Python costs a round trip per node, per
method, per metric (under adaptive execution the scans sit inside query stages). Instead, a
``scala.Function1`` is assembled once per gateway from ``java.lang.invoke`` method handles
(no Java code is shipped): given the executed plan, it collects its leaves through adaptive
plans and query stages (Spark's ``ExplainUtils.collectLeaves``) and returns one string
holding, per leaf, its class, its output attributes' ids and its metrics (``name=value``). When that function
cannot be built (another Spark or Scala), :func:`read_scans` returns None and costs nothing.

Not seen: scans inside subquery expressions (``IN (SELECT ...)``) and inside a cached
DataFrame's plan; a reused exchange or subquery is a leaf of its own (kind
``ReusedExchangeExec``), so a scan is never seen twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from producer.spark.java_objects import per_gateway, untracked

log = logging.getLogger("producer.spark")

LEAF_SEP = "\u001f"   # between leaves
PART_SEP = "\u001e"   # between a leaf's class, ids and metrics
ITEM_SEP = "\u001d"   # between the ids, between the metrics


@dataclass(frozen=True)
class Scan:
    """One leaf of the executed plan."""

    kind: str                       # its class's simple name: FileSourceScanExec, BatchScanExec...
    expr_ids: frozenset[int]        # its output attributes' ids: those of the analysed plan's leaf
    metrics: dict[str, int] = field(default_factory=dict)


def read_scans(gateway: Any, executed: Any) -> list[Scan] | None:
    """The leaves of ``executed`` (a finished action's executed plan) with their metrics, in
    one py4j call; None when the reader cannot be built here or the answer is unreadable."""
    reader = per_gateway(_READERS, gateway, _build_reader)
    if reader is None:
        return None
    return parse_scans(str(reader.apply(executed)))


def parse_scans(text: str) -> list[Scan] | None:
    """The reader's answer as :class:`Scan` s; None when it is not in the reader's format."""
    scans: list[Scan] = []
    for leaf in text.split(LEAF_SEP) if text else []:
        parts = leaf.split(PART_SEP)
        if len(parts) != 3:
            return None
        kind, ids, metrics = parts
        try:
            expr_ids = frozenset(int(i) for i in ids.split(ITEM_SEP) if i)
            values = {name: int(value) for name, _, value in
                      (entry.rpartition("=") for entry in metrics.split(ITEM_SEP) if entry)}
        except ValueError:
            return None
        scans.append(Scan(kind, expr_ids, values))
    return scans


_READERS: dict[int, tuple[Any, Any]] = {}


def _build_reader(gateway: Any) -> Any:
    """The ``scala.Function1`` of :func:`read_scans`, or None (logged once per gateway)."""
    try:
        with untracked():  # kept across actions
            return _Handles(gateway).reader()
    except Exception as err:  # noqa: BLE001 - another Spark/Scala: no input statistics
        log.info("lineage: input statistics unavailable here (could not build the scan reader: %s)", err)
        return None


class _Handles:
    """Method handles over py4j: each step one or two calls, paid once per gateway."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        jvm = gateway.jvm
        self.invoke = jvm.java.lang.invoke
        self.handles = self.invoke.MethodHandles
        self.lookup = self.handles.publicLookup()
        self.java_class, self.java_object = jvm.java.lang.Class, jvm.java.lang.Object
        self.handle_class, self.proxies = self.invoke.MethodHandle, self.invoke.MethodHandleProxies
        self.class_of = self.java_class.forName
        self.string = self.class_of("java.lang.String")
        self.function1 = self.class_of("scala.Function1")
        self.string_concat = self.method(self.string, "concat", self.string)

    def classes(self, *names: Any) -> Any:
        array = self.gateway.new_array(self.java_class, len(names))
        for i, name in enumerate(names):
            array[i] = self.class_of(name) if isinstance(name, str) else name
        return array

    def method(self, owner: Any, name: str, *params: Any) -> Any:
        """``owner.name(params)`` as a handle (the receiver its first parameter)."""
        owner = self.class_of(owner) if isinstance(owner, str) else owner
        return self.lookup.unreflect(owner.getMethod(name, self.classes(*params)))

    def then(self, first: Any, second: Any) -> Any:
        """``second(first(x))``, ``first``'s result cast to what ``second`` takes."""
        first = first.asType(first.type().changeReturnType(second.type().parameterType(0)))
        return self.handles.filterReturnValue(first, second)

    def bound(self, target: Any, position: int, value: Any) -> Any:
        values = self.gateway.new_array(self.java_object, 1)
        values[0] = value
        return self.handles.insertArguments(target, position, values)

    def function(self, target: Any) -> Any:
        return self.proxies.asInterfaceInstance(self.function1, target)

    def joined(self, over: Any, each: Any, sep: str) -> Any:
        """``over(x).iterator().map(each).mkString(sep)``; ``over`` returns a Scala collection."""
        iterator = self.method(over.type().returnType(), "iterator")
        mapped = self.bound(self.method(iterator.type().returnType(), "map", "scala.Function1"), 1, self.function(each))
        to_text = self.bound(self.method(mapped.type().returnType(), "mkString", self.string), 1, sep)
        return self.then(self.then(self.then(over, iterator), mapped), to_text)

    def concat(self, first: Any, second: Any, sep: str) -> Any:
        """``first(x) + sep + second(x)`` for one argument ``x``."""
        concat = self.string_concat
        second = second.asType(second.type().changeParameterType(0, first.type().parameterType(0)))
        pair = self.handles.filterArguments(concat, 0, self._array([self.then(first, self.bound(concat, 1, sep)),
                                                                     second]))
        order = self.gateway.new_array(self.gateway.jvm.int, 2)  # both from the one argument
        return self.handles.permuteArguments(pair, first.type().changeReturnType(self.string), order)

    def _array(self, handles: list[Any]) -> Any:
        array = self.gateway.new_array(self.handle_class, len(handles))
        for i, handle in enumerate(handles):
            array[i] = handle
        return array

    def reader(self) -> Any:
        plan = self.class_of("org.apache.spark.sql.execution.SparkPlan")
        helper_class = self.class_of("org.apache.spark.sql.execution.ExplainUtils$")
        helper = helper_class.getField("MODULE$").get(None)
        leaves = self.method(helper_class, "collectLeaves", plan).bindTo(helper)
        value_of = self.method(self.string, "valueOf", "java.lang.Object")
        kind = self.then(self.method("java.lang.Object", "getClass"), self.method("java.lang.Class", "getSimpleName"))
        expressions = "org.apache.spark.sql.catalyst.expressions"
        expr_id = self.then(self.then(self.method(f"{expressions}.NamedExpression", "exprId"),
                                      self.method(f"{expressions}.ExprId", "id")), value_of)
        ids = self.joined(self.method(plan, "output"), expr_id, ITEM_SEP)
        # Each metric as name=value (SQLMetric.toString would be ~100 bytes a metric, and an
        # answer over 8 KiB stalls; see producer.spark.jvm._PIECE_CHARS).
        entry = self.concat(self.then(self.method("scala.Tuple2", "_1"), value_of),
                            self.then(self.then(self.method("scala.Tuple2", "_2"), self.method(
                                "org.apache.spark.sql.execution.metric.SQLMetric", "value")), value_of), "=")
        metrics = self.joined(self.method(plan, "metrics"), entry, ITEM_SEP)
        leaf = self.concat(self.concat(kind.asType(kind.type().changeParameterType(0, plan)), ids, PART_SEP),
                           metrics, PART_SEP)
        return self.function(self.joined(leaves, leaf, LEAF_SEP))
