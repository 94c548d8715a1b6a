"""How a streaming query's sources and sink become OpenLineage datasets and its job name:
pure functions of Spark's descriptions of them (``FileSink[file:/x]``,
``KafkaV2[Subscribe[a, b]]``...), for :mod:`producer.spark.streaming`, whose docstring says
what is named how."""

from __future__ import annotations

import re

from producer.spark import capture, naming
from producer.spark.capture import DatasetRef

_NOT_DATASETS = frozenset({
    "RateStreamV2", "RateStream", "RatePerMicroBatchStream", "TextSocketV2", "TextSocketSource",
    "TextSocketMicroBatchStream", "MemoryStream", "MemorySink", "ConsoleTable", "ConsoleSink",
    "ForeachBatchSink", "ForeachWriterTable", "ForeachSink", "NoopTable"})
_PATH_KINDS = frozenset({"FileStreamSource", "FileSink", "DeltaSink", "DeltaSource"})
KAFKA_SOURCES = frozenset({"KafkaV2", "KafkaSourceV1"})
_GLOB = re.compile(r"[*?\[{]")


def source_kind(description: str) -> tuple[str, str]:
    """(simple class name, bracketed argument) of a description: ``FileSink[file:/x]`` ->
    (``FileSink``, ``file:/x``); ``a.b.ConsoleTable$@5b41`` -> (``ConsoleTable``, ``""``).
    Spark cuts some descriptions short (``RateStreamV2[rowsPerSecond=5, ...`` has no ``]``)."""
    head, bracket, rest = description.partition("[")
    head = head.split("@", 1)[0].rsplit(".", 1)[-1]
    head = next((part for part in reversed(head.split("$")) if part), head)
    return head, rest.removesuffix("]") if bracket else ""


def _path_ref(path: str) -> DatasetRef:
    parts = path.split("/")
    for i, part in enumerate(parts):
        if _GLOB.search(part) and i > 0:
            path = "/".join(parts[:i])
            break
    ns, name = naming.from_path(naming.redact_uri(path))
    return DatasetRef(ns, name)


def _kafka_topics(argument: str) -> list[str] | None:
    """Topics of ``Subscribe[a, b]`` / ``Assign[a-0, b-1]``; None for a pattern or anything else."""
    strategy, _, inner = argument.partition("[")
    names = [t.strip() for t in inner.rstrip("]").split(",") if t.strip()]
    if strategy == "Subscribe":
        return list(dict.fromkeys(names))
    if strategy == "Assign":
        return list(dict.fromkeys(t.rsplit("-", 1)[0] for t in names))
    return None


def kafka_namespace(servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server (naming spec), any ``PROTOCOL://`` dropped."""
    first = servers.split(",")[0].strip()
    return f"kafka://{first.split('://', 1)[-1]}"


def datasets(sources: list[str], sink: str | None, kafka_servers: str | None) -> tuple[
        list[DatasetRef], list[DatasetRef], list[str]]:
    """(inputs, outputs, what was left out and why) of a query from Spark's descriptions."""
    inputs: list[DatasetRef] = []
    errors: list[str] = []
    for description in sources:
        kind, argument = source_kind(description)
        found: list[DatasetRef] = []
        if kind in _NOT_DATASETS:
            continue
        if kind in _PATH_KINDS and argument:
            found = [_path_ref(argument)]
        elif kind in KAFKA_SOURCES:
            topics = _kafka_topics(argument)
            if topics is None:
                errors.append(f"source {description}: no topic names (a pattern?); left out")
            elif not kafka_servers:
                errors.append(f"source {description}: kafka bootstrap servers not found in the query's plan; "
                              "left out")
            else:
                found = [DatasetRef(kafka_namespace(kafka_servers), topic) for topic in topics]
        else:
            errors.append(f"source {description}: not a known dataset; left out")
        inputs.extend(r for r in found if not any((r.namespace, r.name) == (i.namespace, i.name) for i in inputs))
    outputs: list[DatasetRef] = []
    if sink:
        kind, argument = source_kind(sink)
        if kind in _PATH_KINDS and argument:
            outputs.append(_path_ref(argument))
        elif kind not in _NOT_DATASETS:
            errors.append(f"sink {sink}: not a known dataset (a Kafka sink names no topic); left out")
    return inputs, outputs, errors


def job_name(app_job_name: str, sink: str | None, query_name: str | None) -> str:
    """``<app>.streaming.<target>``; see the module's docstring."""
    outputs = datasets([], sink, None)[1] if sink else []
    if outputs:
        target = capture.slug("/".join(outputs[0].name.rstrip("/").split("/")[-2:]))
    else:
        target = capture.slug(query_name or "") or (capture.snake(source_kind(sink)[0]) if sink else "") or "query"
    return f"{app_job_name}.streaming.{target}"
