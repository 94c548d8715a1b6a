"""What one action's snapshot reads from the driver JVM, in a few py4j calls instead of ~60.

Each py4j round trip costs 0.1-0.3 ms on Spark's listener thread (more when the job keeps
both cores busy), and the plain reads (:mod:`producer.spark.plain_reads`) took one per
method: a write's target, the plan's start time, SQL text, schema, executed node name and
metrics, each input leaf's paths. A small Java class (:data:`HELPER_SOURCE`), compiled once per
gateway with the Janino compiler Spark ships for its own code generation (no jar to install),
reads them inside the JVM and answers with one text per call. The texts are exactly what the
plain reads would have returned (``toString``, ``mkString``, ``json``), so the parsing
(:mod:`producer.spark.jvm` and the modules it reads with) is the same for both routes.

Guarantees:

* When the class cannot be compiled (another Spark, another Scala), :func:`helper` returns None
  (logged once per gateway) and the snapshot reads as before, call by call.
* A read that fails inside the JVM comes back as a :class:`Failed` field, never as an
  exception for the whole answer: the caller decides what the plain read would have done
  (most fall back to nothing, a schema's failure is asked again so that it raises as before).
* An answer longer than :data:`PIECE_CHARS` comes back as a Java ``StringBuilder`` read in
  pieces (:func:`read_text`, which the plain reads' plan JSON uses too); a plan's JSON is
  deflated first (15 KB of JSON is ~2 KB deflated: one answer instead of five).
* An answer that cannot be parsed (:func:`fields` raises ValueError) is not half read: that
  action is read call by call, as without the helper (logged, WARNING).
"""

from __future__ import annotations

import base64
import logging
import zlib
from dataclasses import dataclass
from typing import Any

from producer.spark.java_objects import compiled, per_gateway

log = logging.getLogger("producer.spark")

#: py4j answers with one message written through an 8 KiB buffer; a longer answer stalls
#: ~40 ms on loopback (Nagle's algorithm on the JVM's side meets the delayed ACK on ours).
#: Long text is therefore read in pieces of at most this many UTF-16 units (:func:`read_text`):
#: py4j doubles backslashes, so 8,000 bytes at most for ASCII JSON.
PIECE_CHARS = 4000
#: A plan's JSON above this many characters is sent as is, in one answer (deflating it would
#: cost more than the one stall).
PACKED_UP_TO = 400_000

#: The plan-size estimate (see ``producer.spark.plan_reads.ESTIMATOR_SOURCE``, which it is) and the
#: batched reads. Field encoding: ``<n>:<text>`` (``n`` in code points, as Python counts),
#: ``!<n>:<error>`` for a read that failed, ``-`` for one not asked.
HELPER_SOURCE = r"""
private static void field(StringBuilder out, String value) {
    if (value == null) { out.append('-'); return; }
    out.append(value.codePointCount(0, value.length())).append(':').append(value);
}

private static void failed(StringBuilder out, Throwable err) {
    out.append('!');
    field(out, String.valueOf(err));
}

private static Object answer(StringBuilder out, int pieceChars) {
    return out.length() <= pieceChars ? (Object) out.toString() : (Object) out;
}

/** A Scala map as its mkString(sep) is: "k -> v" entries. */
private static String joinedMap(Object map, String sep) {
    scala.collection.Iterator it = ((scala.collection.Map) map).iterator();
    StringBuilder out = new StringBuilder();
    while (it.hasNext()) {
        scala.Tuple2 entry = (scala.Tuple2) it.next();
        if (out.length() > 0) out.append(sep);
        out.append(String.valueOf(entry._1())).append(" -> ").append(String.valueOf(entry._2()));
    }
    return out.toString();
}

private static String joinedSeq(Object seq, String sep) {
    scala.collection.Iterator it = ((scala.collection.Iterable) seq).iterator();
    StringBuilder out = new StringBuilder();
    boolean first = true;
    while (it.hasNext()) {
        if (!first) out.append(sep);
        first = false;
        out.append(String.valueOf(it.next()));
    }
    return out.toString();
}

/** An InsertIntoHadoopFsRelationCommand's target: catalog table defined (1/0), output path,
 *  file format, save mode. Raises as the plain reads would. */
public Object fileWrite(Object command, int pieceChars) {
    org.apache.spark.sql.execution.datasources.InsertIntoHadoopFsRelationCommand c =
        (org.apache.spark.sql.execution.datasources.InsertIntoHadoopFsRelationCommand) command;
    StringBuilder out = new StringBuilder();
    field(out, c.catalogTable().isDefined() ? "1" : "0");
    field(out, c.outputPath().toString());
    field(out, c.fileFormat().toString());
    field(out, c.mode().toString());
    return answer(out, pieceChars);
}

/** Per leaf of plan.collectLeaves(): "H<fileFormat>\u001e<root paths joined by sep>" for a
 *  LogicalRelation over a HadoopFsRelation, "" for any other leaf (asked call by call). */
public Object leaves(Object plan, String sep, int pieceChars) {
    scala.collection.Iterator it = ((scala.collection.Iterable)
        ((org.apache.spark.sql.catalyst.trees.TreeNode) plan).collectLeaves()).iterator();
    StringBuilder out = new StringBuilder();
    while (it.hasNext()) {
        Object leaf = it.next();
        String entry = "";
        try {
            if (leaf instanceof org.apache.spark.sql.execution.datasources.LogicalRelation) {
                Object relation = ((org.apache.spark.sql.execution.datasources.LogicalRelation) leaf).relation();
                if (relation instanceof org.apache.spark.sql.execution.datasources.HadoopFsRelation) {
                    org.apache.spark.sql.execution.datasources.HadoopFsRelation fs =
                        (org.apache.spark.sql.execution.datasources.HadoopFsRelation) relation;
                    entry = "H" + fs.fileFormat().toString() + "\u001e" + joinedSeq(fs.location().rootPaths(), sep);
                }
            }
        } catch (Throwable err) {
            entry = "";
        }
        field(out, entry);
    }
    return answer(out, pieceChars);
}

/** The action's queryId, its tracker's phases, the query's SQL text (Option's toString), its
 *  schema's JSON (when asked), the executed plan's node name (a codegen stage's child's), its
 *  metrics (when asked; through adaptive plans and query stages) and what the scan reader
 *  answers for it (when given). */
public Object facts(Object execution, Object query, boolean schema, boolean metrics, Object scanReader,
                    String sep, int pieceChars) {
    org.apache.spark.sql.execution.QueryExecution qe = (org.apache.spark.sql.execution.QueryExecution) execution;
    StringBuilder out = new StringBuilder();
    try { field(out, qe.queryId().toString()); } catch (Throwable err) { failed(out, err); }
    try { field(out, joinedMap(qe.tracker().phases(), sep)); } catch (Throwable err) { failed(out, err); }
    try {
        field(out, ((org.apache.spark.sql.catalyst.trees.TreeNode) query).origin().sqlText().toString());
    } catch (Throwable err) { failed(out, err); }
    if (schema) {
        try {
            field(out, ((org.apache.spark.sql.catalyst.plans.QueryPlan) query).schema().json());
        } catch (Throwable err) { failed(out, err); }
    } else out.append('-');
    org.apache.spark.sql.execution.SparkPlan executed = null;
    try {
        org.apache.spark.sql.execution.SparkPlan plan = qe.executedPlan();
        String name = plan.nodeName();
        if (name.startsWith("WholeStageCodegen")) {
            name = ((org.apache.spark.sql.execution.WholeStageCodegenExec) plan).child().nodeName();
        }
        field(out, name);
        executed = plan;
    } catch (Throwable err) { failed(out, err); }
    if (metrics && executed != null) {
        try {
            Object plan = executed;
            for (int i = 0; i < 4; i++) {
                String kind = plan.getClass().getSimpleName();
                if (kind.equals("AdaptiveSparkPlanExec")) {
                    plan = ((org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec) plan).executedPlan();
                } else if (kind.endsWith("QueryStageExec")) {
                    plan = ((org.apache.spark.sql.execution.adaptive.QueryStageExec) plan).plan();
                } else break;
            }
            field(out, joinedMap(((org.apache.spark.sql.execution.SparkPlan) plan).metrics(), sep));
        } catch (Throwable err) { failed(out, err); }
    } else out.append('-');
    if (scanReader != null && executed != null) {
        try {
            field(out, String.valueOf(((scala.Function1) scanReader).apply(executed)));
        } catch (Throwable err) { failed(out, err); }
    } else out.append('-');
    return answer(out, pieceChars);
}

/** The plan's JSON (exactly toJSON's text): "!<n>" when its estimate or length n is above
 *  limit; "=<length>:<text>" above packedUpTo; else "z<length>:<base64 of its deflated UTF-8>"
 *  (length: the text's, in UTF-16 units as Java counts). */
public Object planJson(Object plan, long limit, int pieceChars, int packedUpTo) {
    long estimate = estimate(plan, limit);
    if (estimate > limit) return "!" + estimate;
    // In the JVM, toJSON's one String is no cost (it is its transfer over py4j that stalls).
    String text = ((org.apache.spark.sql.catalyst.trees.TreeNode) plan).toJSON();
    if (text.length() > limit) return "!" + text.length();
    StringBuilder out = new StringBuilder();
    if (text.length() > packedUpTo) {
        return answer(out.append('=').append(text.length()).append(':').append(text), Integer.MAX_VALUE);
    }
    byte[] raw = text.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    java.util.zip.Deflater deflater = new java.util.zip.Deflater(1);
    java.io.ByteArrayOutputStream packed = new java.io.ByteArrayOutputStream(raw.length / 4 + 64);
    try {
        deflater.setInput(raw);
        deflater.finish();
        byte[] chunk = new byte[8192];
        while (!deflater.finished()) packed.write(chunk, 0, deflater.deflate(chunk));
    } finally {
        deflater.end();
    }
    out.append('z').append(text.length()).append(':')
       .append(java.util.Base64.getEncoder().encodeToString(packed.toByteArray()));
    return answer(out, pieceChars);
}
"""


@dataclass(frozen=True)
class Failed:
    """A read that raised inside the JVM (its exception's text)."""

    error: str


#: A field that was not asked for.
NOT_ASKED = None

_HELPERS: dict[int, tuple[Any, Any]] = {}


def helper(gateway: Any, plan: Any) -> Any:
    """The compiled helper of ``gateway`` (its class loaded beside ``plan``'s class), compiled
    on first use; None when it cannot be compiled here."""
    from producer.spark.plan_reads import ESTIMATOR_SOURCE  # here: plan_reads imports this module

    def build(gateway: Any) -> Any:
        try:
            return compiled(gateway, ESTIMATOR_SOURCE + HELPER_SOURCE, plan.getClass().getClassLoader())
        except Exception as err:  # noqa: BLE001 - another Spark or Scala: the plain reads
            log.warning("lineage: cannot compile the batched reads (%s); actions are read call by call", err)
            return None

    return per_gateway(_HELPERS, gateway, build)


def read_text(answer: Any) -> str:
    """A helper's answer, or any Java text: a Python str when short, else a Java
    ``CharSequence`` read in pieces of at most :data:`PIECE_CHARS` UTF-16 units, the exact
    text whatever it holds. A piece never ends inside a surrogate pair (an emoji, any
    character above U+FFFF): py4j would send each half alone, as ``?``."""
    if isinstance(answer, str):
        return answer
    length = int(answer.length())
    pieces, start = [], 0
    while start < length:
        end = min(length, start + PIECE_CHARS)
        piece = str(answer.substring(start, end))
        # A pair's high half last comes back as "?" (or a lone surrogate): one more call,
        # only then, tells it from a real "?"; the pair starts the next piece instead.
        if (end < length and end - 1 > start and piece and (piece[-1] == "?" or "\ud800" <= piece[-1] <= "\udbff")
                and int(answer.codePointAt(end - 1)) > 0xFFFF):
            piece, end = piece[:-1], end - 1
        pieces.append(piece)
        start = end
    return "".join(pieces)


def fields(text: str, count: int | None = None) -> list[str | Failed | None]:
    """The fields of an answer (see :data:`HELPER_SOURCE`): a str, a :class:`Failed`, or None
    for one not asked. Raises ValueError when ``text`` is not in that format or (``count``
    given) does not hold exactly ``count`` fields: a damaged answer is never half read, the
    caller reads that action call by call instead."""
    out: list[str | Failed | None] = []
    i, end = 0, len(text)
    while i < end:
        if text[i] == "-":
            out.append(NOT_ASKED)
            i += 1
            continue
        failure = text[i] == "!"
        if failure:
            i += 1
        colon = text.find(":", i)
        digits = text[i:colon]
        if colon < 0 or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"answer is not a field at character {i}")
        n = int(digits)
        value = text[colon + 1:colon + 1 + n]
        if len(value) != n:
            raise ValueError("truncated answer")
        i = colon + 1 + n
        out.append(Failed(value) if failure else value)
    if count is not None and len(out) != count:
        raise ValueError(f"answer has {len(out)} fields, not {count}")
    return out


def plan_answer(text: str) -> tuple[str | None, int]:
    """:meth:`planJson`'s answer as ``producer.spark.plan_reads.plan_json`` returns it."""
    if text.startswith("!"):
        return None, int(text[1:])
    length, _, body = text[1:].partition(":")
    if text.startswith("="):
        return body, int(length)
    return zlib.decompress(base64.b64decode(body)).decode("utf-8"), int(length)
