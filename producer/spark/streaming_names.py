"""How a streaming query's sources and sink become OpenLineage datasets and its job name:
pure functions of Spark's descriptions of them (``FileSink[file:/x]``,
``KafkaV2[Subscribe[a, b]]``...), for :mod:`producer.spark.streaming`, whose docstring says
what is named how."""

from __future__ import annotations

import re

import orjson

from producer.spark import capture, naming
from producer.spark.capture import DatasetRef

_NOT_DATASETS = frozenset({
    "RateStreamV2", "RateStream", "RatePerMicroBatchStream", "TextSocketV2", "TextSocketSource",
    "TextSocketMicroBatchStream", "MemoryStream", "MemorySink", "ConsoleTable", "ConsoleSink",
    "ForeachBatchSink", "ForeachWriterTable", "ForeachSink", "NoopTable"})
_PATH_KINDS = frozenset({"FileStreamSource", "FileSink", "DeltaSink", "DeltaSource"})
KAFKA_SOURCES = frozenset({"KafkaV2", "KafkaSourceV1"})
#: Kafka sinks (micro-batch V2 and V1): their description names no topic, the writer's options do.
KAFKA_SINKS = frozenset({"KafkaTable", "KafkaSink"})
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


def offset_topics(source_progress: dict) -> list[str]:
    """Topics a Kafka source's progress shows offsets for: the keys of its ``endOffset``
    (``{"orders": {"0": 42}}``; Spark gives it as JSON data, or as text when it could not
    parse it), else of its ``startOffset``; sorted. What a ``SubscribePattern`` matched."""
    for key in ("endOffset", "startOffset"):
        offsets = source_progress.get(key)
        if isinstance(offsets, str):
            try:
                offsets = orjson.loads(offsets)
            except orjson.JSONDecodeError:
                continue
        if isinstance(offsets, dict) and offsets:
            return sorted(str(topic) for topic in offsets)
    return []


def kafka_namespace(servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server (naming spec), any ``PROTOCOL://`` dropped."""
    first = servers.split(",")[0].strip()
    return f"kafka://{first.split('://', 1)[-1]}"


def _kafka_source(description: str, argument: str, matched: list[str], servers: str | None,
                  errors: list[str]) -> list[DatasetRef]:
    """A Kafka source's topics as datasets (``matched``: those its progress shows offsets for),
    or [] with the reason in ``errors``."""
    topics = _kafka_topics(argument)
    if topics is None:
        if not argument.startswith("SubscribePattern["):
            errors.append(f"source {description}: no topic names; left out")
            return []
        if not matched:
            errors.append(f"source {description}: no topic has matched the pattern yet; left out")
            return []
        topics = matched
    if not servers:
        errors.append(f"source {description}: kafka bootstrap servers not found in the query's plan; left out")
        return []
    return [DatasetRef(kafka_namespace(servers), topic) for topic in topics]


def pair_servers(leaf_servers: list[str | None] | None, sources: list[str]) -> tuple[list[str | None], str | None]:
    """The Kafka bootstrap servers of each of a progress's ``sources`` (descriptions), from
    those of each streaming leaf of the query's analysed plan (:func:`producer.spark.streaming_query._kafka_servers`),
    and why a Kafka source has none (None: nothing to say). Spark lists a progress's sources
    in its plan's pre-order, each once: one leaf per source pairs by position; else (a source
    read twice) the Kafka leaves with the Kafka sources when as many; else one cluster for all
    when the leaves name only one; else none (the Kafka sources are left out, told why)."""
    kafka = [index for index, source in enumerate(sources) if source_kind(source)[0] in KAFKA_SOURCES]
    paired: list[str | None] = [None] * len(sources)
    if not kafka or not leaf_servers:
        return paired, None
    if len(leaf_servers) == len(sources):
        for index in kafka:
            paired[index] = leaf_servers[index]
        return paired, None
    named = [servers for servers in leaf_servers if servers]
    if len(named) == len(kafka):
        for index, servers in zip(kafka, named):
            paired[index] = servers
        return paired, None
    if len(set(named)) == 1:
        for index in kafka:
            paired[index] = named[0]
        return paired, None
    return paired, (f"could not pair the plan's {len(leaf_servers)} streaming sources with the progress's "
                    f"{len(sources)}: no kafka bootstrap servers")


def datasets(sources: list[str], sink: str | None, kafka_servers: str | list[str | None] | None, *,
             source_topics: list[list[str]] | None = None,
             kafka_sink: DatasetRef | str | None = None) -> tuple[list[DatasetRef], list[DatasetRef], list[str]]:
    """(inputs, outputs, what was left out and why) of a query from Spark's descriptions.
    ``kafka_servers``: the Kafka bootstrap servers of every source, or of each (a list beside
    ``sources``, :func:`pair_servers`).
    ``source_topics``, beside ``sources``: the topics each one's progress shows offsets for
    (:func:`offset_topics`), which name what a ``SubscribePattern`` matched. ``kafka_sink``:
    a Kafka sink's topic as read from the writer's options, or why it could not be (None: not
    read yet, nothing said)."""
    inputs: list[DatasetRef] = []
    errors: list[str] = []
    for index, description in enumerate(sources):
        kind, argument = source_kind(description)
        found: list[DatasetRef] = []
        if kind in _NOT_DATASETS:
            continue
        if kind in _PATH_KINDS and argument:
            found = [_path_ref(argument)]
        elif kind in KAFKA_SOURCES:
            matched = source_topics[index] if source_topics and index < len(source_topics) else []
            servers = (kafka_servers[index] if index < len(kafka_servers) else None) \
                if isinstance(kafka_servers, list) else kafka_servers
            found = _kafka_source(description, argument, matched, servers, errors)
        else:
            errors.append(f"source {description}: not a known dataset; left out")
        inputs.extend(r for r in found if not any((r.namespace, r.name) == (i.namespace, i.name) for i in inputs))
    outputs: list[DatasetRef] = []
    if sink:
        kind, argument = source_kind(sink)
        if kind in _PATH_KINDS and argument:
            outputs.append(_path_ref(argument))
        elif kind in KAFKA_SINKS:
            if isinstance(kafka_sink, DatasetRef):
                outputs.append(kafka_sink)
            elif kafka_sink:
                errors.append(f"sink {sink}: {kafka_sink}; left out")
        elif kind not in _NOT_DATASETS:
            errors.append(f"sink {sink}: not a known dataset; left out")
    return inputs, outputs, errors


def job_name(app_job_name: str, sink: str | None, query_name: str | None) -> str:
    """``<app>.streaming.<target>``; see the module's docstring."""
    outputs = datasets([], sink, None)[1] if sink else []
    if outputs:
        target = capture.slug("/".join(outputs[0].name.rstrip("/").split("/")[-2:]))
    else:
        target = capture.slug(query_name or "") or (capture.snake(source_kind(sink)[0]) if sink else "") or "query"
    return f"{app_job_name}.streaming.{target}"
