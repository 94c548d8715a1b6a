"""An action's scans as its executed plan ran them: each leaf's kind, one output attribute id,
identity and the metrics inputStatistics uses, read in one py4j call (:func:`read_scans`);
plain data out (:class:`Scan`).

Why one call: walking the physical plan from Python costs a round trip per node, per
method, per metric (under adaptive execution the scans sit inside query stages). Instead, a
``scala.Function1`` is assembled from ``java.lang.invoke`` method handles (no Java code is
shipped), once per gateway: given the executed plan, it collects its leaves through adaptive
plans and query stages (Spark's ``ExplainUtils.collectLeaves``) and returns one string
holding, per leaf, its class, the id of its first output attribute, its identity hash, for
a ``ReusedExchangeExec`` the identity hashes of the leaves under the exchange it reuses, and
the :data:`METRICS` values. The answer stays small whatever the width of the input (a py4j
answer over 8 KiB stalls ~40 ms, see ``producer.spark.batched_reads.PIECE_CHARS``): ~100 bytes a leaf.

When that function cannot be built (another Spark or Scala), :func:`read_scans` returns None
and costs nothing; it is built again after :data:`RETRY_AFTER` more actions, at most
:data:`BUILDS` times per gateway in all (a transient py4j error does not turn the facet off
for the life of the process; a Spark it cannot be built for pays a bounded cost).

Not seen: scans inside subquery expressions (``IN (SELECT ...)``, dynamic partition
pruning's) and inside a cached DataFrame's plan; a reused exchange is a leaf of its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from producer.spark.java_objects import per_gateway, untracked

log = logging.getLogger("producer.spark")

LEAF_SEP = "\u001f"   # between leaves
PART_SEP = "\u001e"   # between a leaf's parts
ITEM_SEP = "\u001d"   # between the items of a part
#: The SQL metrics read, in the answer's order (those ``producer.spark.input_stats`` counts).
METRICS = ("numOutputRows", "numFiles", "filesSize")
#: A reader that could not be built is tried again after this many actions...
RETRY_AFTER = 100
#: ...this many builds per gateway in all.
BUILDS = 3


@dataclass(frozen=True)
class Scan:
    """One leaf of the executed plan."""

    kind: str                       # its class's simple name: FileSourceScanExec, BatchScanExec...
    # Its output attributes' ids, as the analysed plan's leaf has them; the reader sends one
    # (every attribute a scan outputs is its analysed leaf's), none for a scan outputting none.
    expr_ids: frozenset[int]
    metrics: dict[str, int] = field(default_factory=dict)
    identity: int | None = None     # System.identityHashCode of the leaf
    # A ReusedExchangeExec: the identities of the leaves under the exchange it reuses.
    reuses: frozenset[int] = frozenset()


def read_scans(gateway: Any, executed: Any) -> list[Scan] | None:
    """The leaves of ``executed`` (a finished action's executed plan) with their metrics, in
    one py4j call; None when the reader cannot be built here or the answer is unreadable."""
    reader = scan_reader(gateway)
    if reader is None:
        return None
    return parse_scans(str(reader.apply(executed)))


def scan_reader(gateway: Any) -> Any:
    """The ``scala.Function1`` that :func:`read_scans` applies (its answer: :func:`parse_scans`),
    for a caller that applies it in the JVM; None when it cannot be built here (yet)."""
    return per_gateway(_READERS, gateway, lambda _: _ReaderSlot()).get(gateway)


def parse_scans(text: str) -> list[Scan] | None:
    """The reader's answer as :class:`Scan` s; None when it is not in the reader's format."""
    scans: list[Scan] = []
    for leaf in text.split(LEAF_SEP) if text else []:
        parts = leaf.split(PART_SEP)
        if len(parts) != 5:
            return None
        kind, first_id, identity, reuses, values = parts
        items = values.split(ITEM_SEP)
        if len(items) != len(METRICS):
            return None
        try:
            expr_id = _option(first_id)
            metrics = {name: value for name, item in zip(METRICS, items) if (value := _option(item)) is not None}
            scans.append(Scan(kind, frozenset() if expr_id is None else frozenset({expr_id}), metrics,
                              int(identity), frozenset(int(i) for i in reuses.split(ITEM_SEP) if i)))
        except ValueError:
            return None
    return scans


def _option(text: str) -> int | None:
    """A Scala ``Option``'s ``toString``: ``Some(12)`` or ``None``; raises ValueError otherwise."""
    if text == "None":
        return None
    if text.startswith("Some(") and text.endswith(")"):
        return int(text[5:-1])
    raise ValueError(text)


_READERS: dict[int, tuple[Any, Any]] = {}


class _ReaderSlot:
    """A gateway's reader, built on first use; after a failed build, built again after
    :data:`RETRY_AFTER` actions, :data:`BUILDS` times in all."""

    def __init__(self) -> None:
        self.reader: Any = None
        self.builds = 0
        self.waited = 0
        self._lock = threading.Lock()  # listener threads of several sessions share a gateway

    def get(self, gateway: Any) -> Any:
        with self._lock:
            if self.reader is not None or self.builds >= BUILDS:
                return self.reader
            if self.builds and self.waited < RETRY_AFTER:
                self.waited += 1
                return None
            self.builds, self.waited = self.builds + 1, 0
            self.reader = _build_reader(gateway, self.builds)
            return self.reader


def _build_reader(gateway: Any, attempt: int = 1) -> Any:
    """The ``scala.Function1`` of :func:`read_scans`, or None (logged)."""
    try:
        with untracked():  # kept across actions
            return _Handles(gateway).reader()
    except Exception as err:  # noqa: BLE001 - another Spark/Scala, or py4j trouble: no input statistics
        then = (f"tried again after {RETRY_AFTER} actions" if attempt < BUILDS else "not tried again")
        log.info("lineage: input statistics unavailable (could not build the scan reader, try %d of %d, %s): %s",
                 attempt, BUILDS, then, err)
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
        self.value_of = self.method(self.string, "valueOf", "java.lang.Object")

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

    def taking(self, target: Any, param: Any) -> Any:
        """``target`` with its one parameter typed ``param`` (a cast when narrower)."""
        return target.asType(target.type().changeParameterType(0, param))

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

    def optional(self, over: Any, each: Any) -> Any:
        """``String.valueOf(over(x).map(each))``: ``Some(<each>)`` or ``None``; ``over``
        returns a ``scala.Option``."""
        mapped = self.bound(self.method("scala.Option", "map", "scala.Function1"), 1, self.function(each))
        return self.then(self.then(over, mapped), self.value_of)

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
        kind = self.taking(self.then(self.method("java.lang.Object", "getClass"),
                                     self.method("java.lang.Class", "getSimpleName")), plan)
        expressions = "org.apache.spark.sql.catalyst.expressions"
        expr_id = self.then(self.then(self.method(f"{expressions}.NamedExpression", "exprId"),
                                      self.method(f"{expressions}.ExprId", "id")), self.value_of)
        # One id: a scan's attributes all come from one analysed leaf (all of them would make
        # the answer of a 3,000-column input ~18 KB).
        first_id = self.optional(self.then(self.method(plan, "output"),
                                           self.method("scala.collection.immutable.Seq", "headOption")), expr_id)
        identity = self.then(self.method("java.lang.System", "identityHashCode", "java.lang.Object"), self.value_of)
        # The leaves under the exchange a ReusedExchangeExec reuses ("" for any other leaf):
        # counted only if they were seen (see producer.spark.input_stats).
        reused_class = self.class_of("org.apache.spark.sql.execution.exchange.ReusedExchangeExec")
        is_reused = self.taking(self.bound(self.method("java.lang.Class", "isInstance", "java.lang.Object"),
                                           0, reused_class), plan)
        originals = self.taking(self.joined(self.then(self.method(reused_class, "child"), leaves),
                                            identity, ITEM_SEP), plan)
        nothing = self.handles.dropArguments(self.handles.constant(self.string, ""), 0, self.classes(plan))
        reuses = self.handles.guardWithTest(is_reused, originals, nothing)
        metric = self.then(self.method("org.apache.spark.sql.execution.metric.SQLMetric", "value"), self.value_of)
        metrics = self.method(plan, "metrics")
        get = self.method(metrics.type().returnType(), "get", "java.lang.Object")
        values = [self.optional(self.then(metrics, self.bound(get, 1, name)), metric) for name in METRICS]
        parts = [first_id, self.taking(identity, plan), reuses, values[0]]
        leaf = kind
        for part in parts:
            leaf = self.concat(leaf, part, PART_SEP)
        for value in values[1:]:
            leaf = self.concat(leaf, value, ITEM_SEP)
        return self.function(self.joined(leaves, leaf, LEAF_SEP))
