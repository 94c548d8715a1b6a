"""An analysed plan's JSON over py4j, and its size estimated in the JVM before the JSON is built.

The plan crosses py4j once, as ``TreeNode.toJSON``'s exact text (read in pieces that py4j
returns without a stall, :func:`producer.spark.batched_reads.read_text`), or not at all when it is too large:
:func:`plan_json` never sends a plan whose estimate (:func:`estimate_plan_chars`) or whose
JSON's own length is above the caller's limit, and reports its size instead. With the batched
reads (:mod:`producer.spark.batched_reads`) the same answer comes from one py4j call.
"""

from __future__ import annotations

import logging
from typing import Any

from py4j.protocol import Py4JJavaError

from producer.spark import batched_reads
from producer.spark.java_objects import per_gateway, untracked

log = logging.getLogger("producer.spark")

#: Text up to this length is read in pieces (:data:`producer.spark.batched_reads.PIECE_CHARS`);
#: above it, at once (one stall costs less than that many round trips).
_PIECED_UP_TO = 400_000


def _json_tools(gateway: Any) -> tuple[Any, Any]:
    """json4s' Jackson mapper and the StringWriter class, looked up once per gateway (each
    ``gateway.jvm.a.b.C`` lookup is a py4j round trip per dotted name)."""
    def build(gateway: Any) -> tuple[Any, Any]:
        with untracked():  # kept across actions
            module = getattr(getattr(gateway.jvm.org.json4s.jackson, "JsonMethods$"), "MODULE$")
            return module.mapper(), gateway.jvm.java.io.StringWriter

    return per_gateway(_JSON_TOOLS, gateway, build)


_JSON_TOOLS: dict[int, tuple[Any, tuple[Any, Any]]] = {}


#: The plan's size, estimated in the driver JVM before its JSON is built: a walk of the plan's
#: nodes and expressions (and of subquery plans) in Java, compiled once per gateway with the
#: Janino compiler Spark ships for its own code generation (no jar to install). It charges each
#: node about what it adds to ``toJSON``'s text at least (its class, child count, an attribute's
#: name and type, a literal's value, an ``InSet``'s elements: about 0.6 of the real length), plus
#: what Spark's JSON writer spends finding a node's children in its fields (``children.indexOf``
#: per child: k*(k-1)/2 comparisons for k children, ~15 ns each against ~40 ns per character
#: written, so charged half a character each), which makes ``isin`` over 20,000 values take
#: seconds though its text is 5 MB. The walk stops as soon as the total passes the limit, so it
#: costs in proportion to the limit at most (a few ms), and a plan above it is never turned into
#: JSON at all.
ESTIMATOR_SOURCE = """
public static long estimate(Object root, long limit) {
    java.util.ArrayDeque todo = new java.util.ArrayDeque();
    todo.push(root);
    long total = 0;
    while (!todo.isEmpty()) {
        Object o = todo.pop();
        if (!(o instanceof org.apache.spark.sql.catalyst.trees.TreeNode)) continue;
        org.apache.spark.sql.catalyst.trees.TreeNode node = (org.apache.spark.sql.catalyst.trees.TreeNode) o;
        total += 48 + node.nodeName().length();
        long k = 0;
        scala.collection.Iterator it = node.children().iterator();
        while (it.hasNext()) { todo.push(it.next()); k++; }
        total += k * (k - 1) / 4;
        if (o instanceof org.apache.spark.sql.catalyst.plans.QueryPlan) {
            it = ((org.apache.spark.sql.catalyst.plans.QueryPlan) o).expressions().iterator();
            while (it.hasNext()) todo.push(it.next());
        }
        if (o instanceof org.apache.spark.sql.catalyst.expressions.AttributeReference) {
            total += 120 + ((org.apache.spark.sql.catalyst.expressions.AttributeReference) o).name().length();
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.Literal) {
            Object v = ((org.apache.spark.sql.catalyst.expressions.Literal) o).value();
            total += 24 + (v instanceof org.apache.spark.unsafe.types.UTF8String
                    ? ((org.apache.spark.unsafe.types.UTF8String) v).numBytes() : 4);
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.InSet) {
            total += 4L * ((org.apache.spark.sql.catalyst.expressions.InSet) o).hset().size();
        } else if (o instanceof org.apache.spark.sql.catalyst.expressions.SubqueryExpression) {
            todo.push(((org.apache.spark.sql.catalyst.expressions.SubqueryExpression) o).plan());
        }
        if (total > limit) return total;
    }
    return total;
}
"""
_ESTIMATOR: dict[int, tuple[Any, Any]] = {}


def _estimator(gateway: Any, plan: Any) -> Any:
    """An instance of the compiled estimator class, once per gateway; None when it cannot be
    compiled (another Spark's classes): then the JSON is built unestimated, as before."""
    def build(gateway: Any) -> Any:
        try:
            with untracked():  # kept across actions
                evaluator = gateway.jvm.org.codehaus.janino.ClassBodyEvaluator()
                evaluator.setParentClassLoader(plan.getClass().getClassLoader())
                evaluator.cook(ESTIMATOR_SOURCE)
                cls = evaluator.getClazz()
                return cls.getDeclaredConstructor(gateway.new_array(gateway.jvm.java.lang.Class, 0)).newInstance(
                    gateway.new_array(gateway.jvm.java.lang.Object, 0))
        except Exception as err:  # noqa: BLE001 - no estimate: the JSON's own length decides
            log.warning("lineage: cannot estimate plan sizes (%s); plans are serialised before their size is known",
                        err)
            return None

    return per_gateway(_ESTIMATOR, gateway, build)


def estimate_plan_chars(gateway: Any, plan: Any, max_chars: int) -> int | None:
    """A lower bound of ``plan.toJSON()``'s cost in characters (see :data:`ESTIMATOR_SOURCE`),
    counted no further than just past ``max_chars``: one py4j call (after the estimator's
    compilation, once per gateway); None when it cannot be estimated."""
    estimator = _estimator(gateway, plan)
    if estimator is None:
        return None
    try:
        return int(estimator.estimate(plan, max_chars))
    except Py4JJavaError:
        raise
    except Exception:  # noqa: BLE001 - not the estimator's class (py4j-level): unestimated
        return None


def plan_json(gateway: Any, plan: Any, max_chars: int) -> tuple[str | None, int]:
    """``plan.toJSON()`` (the same text) and its length; None when it exceeds ``max_chars``
    (then it is never sent over py4j). A plan whose estimate (:func:`estimate_plan_chars`)
    is already above ``max_chars`` is not turned into JSON at all: its estimate is returned
    as its length. A failure of Spark's JSON writer (an ``OutOfMemoryError``, say) raises,
    never retried: only when json4s' tools cannot be looked up is ``toJSON`` called instead.
    With the batched reads (:mod:`producer.spark.batched_reads`): all of it in one py4j call,
    the text deflated on the way."""
    helper = batched_reads.helper(gateway, plan)
    if helper is not None:
        answer = helper.planJson(plan, max_chars, batched_reads.PIECE_CHARS, _PIECED_UP_TO)
        return batched_reads.plan_answer(batched_reads.read_text(answer))
    estimate = estimate_plan_chars(gateway, plan, max_chars)
    if estimate is not None and estimate > max_chars:
        return None, estimate
    try:
        mapper, string_writer = _json_tools(gateway)
    except Exception:  # noqa: BLE001 - another json4s: the plain call, stall and all
        whole = plan.toJSON()
        return (whole if len(whole) <= max_chars else None), len(whole)
    writer = string_writer()
    mapper.writeValue(writer, plan.jsonValue())
    text = writer.getBuffer()
    length = text.length()
    if length > max_chars:
        return None, length
    if length <= batched_reads.PIECE_CHARS or length > _PIECED_UP_TO:
        return text.toString(), length
    return batched_reads.read_text(text), length
