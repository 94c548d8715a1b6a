"""One action's facts and write target read call by call over py4j (no compiled helper).

These are the reads :func:`producer.spark.jvm.snapshot` makes when the batched reads
(:mod:`producer.spark.batched_reads`) cannot be compiled, and those it always makes (a created
table's location, a ``save()``'s job-name suffix). The text parsers (:func:`parsed_metrics`,
:data:`ANALYSIS_PHASE`) serve both routes: the helper answers with the same ``mkString`` text.
Each read costs a few py4j calls: metrics and the analysis phase's start one ``mkString`` each,
asked item by item only when that text is not in the expected format (another Spark).
"""

from __future__ import annotations

import re
from typing import Any

from producer.spark.job_names import trim_path
from producer.spark.relations import SEP, Relation, opt


def node_name(plan: Any) -> str:
    """The executed plan's root node name (``Execute InsertIntoHadoopFsRelationCommand``,
    ``AdaptiveSparkPlan``), a whole-stage-codegen stage's child's: one py4j call, two for
    a codegen stage."""
    name = str(plan.nodeName())
    return str(plan.child().nodeName()) if name.startswith("WholeStageCodegen") else name


def save_suffix(source: str, path: str | None, options: Any, output: Relation | None) -> str | None:
    """A ``SaveIntoDataSourceCommand``'s job-name suffix as the official visitor gives it:
    a Delta path as written (its last two segments); a JDBC table; a ``kustotable`` or
    ``table`` option; else the first option whose key holds ``table`` (Snowflake's and
    Redshift's ``dbtable``, Hudi's ``hoodie.table.name``), in the options' order; else none."""
    if "DeltaDataSource" in source and path is not None:
        return trim_path(path)
    if output is not None and output.jdbc_url is not None:
        return output.jdbc_table
    for key in ("kustotable", "table"):
        if (value := opt(options.get(key))) is not None:
            return value
    for key in str(options.keys().mkString(SEP)).split(SEP):
        if "table" in key.lower():
            return opt(options.get(key))
    return None


def table_location(session: Any, table: Any) -> str | None:
    """A catalog table's storage location as the session's catalog has it; None when it has
    none (a failed CTAS leaves no table)."""
    try:
        meta = session.sessionState().catalog().getTableMetadata(table.identifier())
        return meta.location().toString()
    except Exception:  # noqa: BLE001 - the table may not exist (failed CTAS)
        return None


def plan_metrics(plan: Any, names: tuple[str, ...] = ("numOutputRows", "numOutputBytes", "numFiles")) -> dict[str, int]:
    """The ``names`` metrics of an executed plan's write (those it has; raises what py4j raises)."""
    # Adaptive query execution wraps the write (DataWritingCommandExec) in its final plan
    # and a result query stage.
    for _ in range(4):
        kind = plan.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            plan = plan.executedPlan()
        elif kind.endswith("QueryStageExec"):
            plan = plan.plan()
        else:
            break
    metrics = plan.metrics()
    # All of them in one call, as "name -> SQLMetric(id: 1, name: Some(...), value: 42)"
    # (four round trips per metric otherwise); another format: one by one.
    return parsed_metrics(str(metrics.mkString(SEP)), names) or _metrics_one_by_one(metrics, names)


def parsed_metrics(joined: str, names: tuple[str, ...] = ("numOutputRows", "numOutputBytes", "numFiles")
                   ) -> dict[str, int]:
    """The ``names`` metrics of a plan's ``metrics.mkString(SEP)``."""
    out: dict[str, int] = {}
    for entry in joined.split(SEP):
        match = _METRIC.fullmatch(entry)
        if match is not None and match.group(1) in names:
            out[match.group(1)] = int(match.group(2))
    return out


def _metrics_one_by_one(metrics: Any, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        metric = opt(metrics.get(name))
        if metric is not None:
            out[name] = int(metric.value())
    return out


_METRIC = re.compile(r"(\w+) -> SQLMetric\(.*value: (-?\d+)\)", re.DOTALL)
#: "analysis -> PhaseSummary(<start ms>, <end ms>)" among the tracker's phases.
ANALYSIS_PHASE = re.compile(r"(?:^|\u001f)analysis -> PhaseSummary\((\d+), ?-?\d+\)")


def started_ms(qe: Any) -> int | None:
    """When the action's analysis phase started (epoch ms); None when this Spark does not say."""
    try:
        phases = qe.tracker().phases()
        match = ANALYSIS_PHASE.search(phases.mkString(SEP))  # one call, not four
        return int(match.group(1)) if match is not None else _analysis_start_asked(phases)
    except Exception:  # noqa: BLE001 - older/other Spark: the caller falls back to the duration
        return None


def _analysis_start_asked(phases: Any) -> int | None:
    summary = opt(phases.get("analysis"))
    return int(summary.startTimeMs()) if summary is not None else None


def sql_text(plan: Any) -> str | None:
    """The SQL text ``plan`` was parsed from (its ``origin``'s, set by Spark's parser for every
    node of a ``spark.sql`` statement and kept by the analyser), None for a DataFrame built
    in code: three py4j calls. ``Option.toString`` is ``Some(<text>)`` or ``None``."""
    text = str(plan.origin().sqlText().toString())
    return text[5:-1] if text.startswith("Some(") and text.endswith(")") else None
