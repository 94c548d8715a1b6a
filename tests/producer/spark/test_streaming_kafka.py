"""Kafka in Structured Streaming lineage: a ``SubscribePattern`` source is named by the topics
its progress shows offsets for, and a Kafka sink by the ``topic`` of the writer's options.

The Kafka connector (spark-sql-kafka) is not on this machine (Maven is out of reach), so the
py4j read of the writer's options runs against a real query of this session with a ``noop``
sink given the same options, and the capture's handling of a Kafka query against fakes that
return what Spark describes for one (``KafkaV2[SubscribePattern[...]]``, ``...$KafkaTable@...``,
offsets keyed by topic)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import orjson
import pytest

from producer.spark.capture import CaptureSettings, DatasetRef
from producer.spark.listener import SparkLineage
from producer.spark.streaming import StreamingLineage, _kafka_sink, _QueryListener
from producer.spark.streaming_names import datasets, offset_topics
from tests.producer.spark.support import Recorder
from tests.support.spec import validator

RUN = "6b2f1c1e-0000-4000-8000-0000000000c1"
KAFKA_TABLE = "org.apache.spark.sql.kafka010.KafkaSourceProvider$KafkaTable@1a2b3c"
PATTERN = "KafkaV2[SubscribePattern[orders-.*]]"
WRITTEN = orjson.dumps({"type": "struct", "fields": [
    {"name": "key", "type": "binary", "nullable": True, "metadata": {}},
    {"name": "value", "type": "string", "nullable": True, "metadata": {}},
    {"name": "headers", "type": {"type": "struct", "fields": [{"name": "trace", "type": "string", "nullable": True,
                                                                "metadata": {}}]}, "nullable": True, "metadata": {}},
]}).decode()


def _names(refs):
    return [(r.namespace, r.name) for r in refs]


@pytest.mark.parametrize(("progress", "topics"), [
    ({"endOffset": {"orders-us": {"0": 4}, "orders-eu": {"0": 2, "1": 0}}}, ["orders-eu", "orders-us"]),
    ({"startOffset": {"a": {"0": 1}}, "endOffset": '{"b":{"0":5},"a":{"0":3}}'}, ["a", "b"]),  # text, as Spark may give
    ({"startOffset": {"a": {"0": 1}}, "endOffset": None}, ["a"]),
    ({"startOffset": None, "endOffset": "not json"}, []),
    ({"endOffset": {}}, []),
    ({}, []),
])
def test_the_topics_a_kafka_source_read_come_from_its_offsets(progress, topics):
    assert offset_topics(progress) == topics


def test_a_pattern_source_is_named_by_the_topics_it_matched_and_a_kafka_sink_by_its_topic():
    sink = DatasetRef("kafka://b1:9092", "orders-clean")
    inputs, outputs, left_out = datasets([PATTERN, "KafkaV2[Subscribe[refunds]]"], KAFKA_TABLE, "b1:9092,b2:9092",
                                         source_topics=[["orders-eu", "orders-us"], ["refunds"]], kafka_sink=sink)
    assert _names(inputs) == [("kafka://b1:9092", "orders-eu"), ("kafka://b1:9092", "orders-us"),
                              ("kafka://b1:9092", "refunds")]
    assert _names(outputs) == [("kafka://b1:9092", "orders-clean")]
    assert left_out == []


def test_what_cannot_be_named_is_left_out_with_the_reason():
    inputs, outputs, left_out = datasets([PATTERN], KAFKA_TABLE, "b1:9092", source_topics=[[]],
                                         kafka_sink="no topic option: each row names its topic (its topic column)")
    assert (inputs, outputs) == ([], [])
    assert left_out == [f"source {PATTERN}: no topic has matched the pattern yet; left out",
                        f"sink {KAFKA_TABLE}: no topic option: each row names its topic (its topic column); left out"]
    # Matched topics but no servers: named as for any Kafka source.
    assert "bootstrap servers" in datasets([PATTERN], None, None, source_topics=[["a"]])[2][0]
    # A sink not read yet (the run's START) says nothing: it is read at the first progress.
    assert datasets([], KAFKA_TABLE, None) == ([], [], [])


class _Options:
    """A Scala ``Map[String, String]`` as py4j shows it: ``get`` returns an Option."""

    def __init__(self, values: dict[str, str], calls: list[str]) -> None:
        self.values, self.calls = values, calls

    def get(self, key):
        self.calls.append(f"get {key}")
        value = self.values.get(key)
        return NS(isDefined=lambda: value is not None, get=lambda: value)

    def keysIterator(self):  # noqa: N802 - Scala
        self.calls.append("keysIterator")
        keys = iter(list(self.values))
        box = {"next": next(keys, None)}

        def take():
            value, box["next"] = box["next"], next(keys, None)
            return value
        return NS(hasNext=lambda: box["next"] is not None, next=take)


def _kafka_query(options: dict[str, str], calls: list[str]):
    def servers_plan():
        leaf = NS(getClass=lambda: NS(getSimpleName=lambda: "StreamingRelationV2"),
                  extraOptions=lambda: {"kafka.bootstrap.servers": "SASL_SSL://in1:9092,in2:9092"})
        leaves = iter([leaf])
        box = {"next": next(leaves, None)}

        def take():
            value, box["next"] = box["next"], next(leaves, None)
            return value
        return NS(collectLeaves=lambda: NS(iterator=lambda: NS(hasNext=lambda: box["next"] is not None, next=take)),
                  schema=lambda: NS(json=lambda: WRITTEN))

    def logical_plan():
        calls.append("logicalPlan")
        return NS(writeOptions=lambda: _Options(options, calls))
    return NS(sink=lambda: NS(toString=lambda: KAFKA_TABLE), analyzedPlan=servers_plan, logicalPlan=logical_plan)


def _capture(query):
    recorder, clock = Recorder(), NS(now=1000.0)
    spark = NS(sparkContext=NS(_jsc=None, _gateway=None),
               _jsparkSession=NS(streams=lambda: NS(get=lambda _id: NS(streamingQuery=lambda: query))))
    lineage = SparkLineage(spark, recorder, CaptureSettings(namespace="st", app_job_name="st"))
    streaming = lineage._streaming = StreamingLineage(lineage, read_interval_s=30.0, clock=lambda: clock.now)
    return recorder, clock, _QueryListener(streaming)


def _uuid(text):
    return NS(toString=lambda: text)


def _progress(listener, end_offset):
    progress = {"runId": RUN, "timestamp": "2026-11-28T10:00:01.000Z",
                "sources": [{"description": PATTERN, "startOffset": None, "endOffset": end_offset}],
                "sink": {"description": KAFKA_TABLE}}
    listener.onQueryProgress(NS(progress=lambda: NS(json=lambda: orjson.dumps(progress).decode())))


def _facts(event):
    errors = event["run"]["facets"].get("extractionError", {}).get("errors", [])
    return (event["eventType"], [d["name"] for d in event["inputs"]], [d["name"] for d in event["outputs"]],
            [e["errorMessage"] for e in errors])


def test_a_kafka_to_kafka_query_names_its_pattern_topics_as_they_match_and_its_sink_topic():
    calls: list[str] = []
    recorder, clock, listener = _capture(_kafka_query({"topic": "orders-clean", "checkpointLocation": "/ck",
                                                       "kafka.bootstrap.servers": "out1:9092,out2:9092"}, calls))
    listener.onQueryStarted(NS(runId=lambda: _uuid(RUN), id=lambda: _uuid(RUN), name=lambda: None,
                               timestamp=lambda: "2026-11-28T10:00:00.000Z"))
    assert calls == []  # the plan is never touched on the query's thread at its start
    _progress(listener, {})                                    # the pattern matches nothing yet
    clock.now += 31
    _progress(listener, {"orders-us": {"0": 10}})
    clock.now += 31
    _progress(listener, {"orders-us": {"0": 12}, "orders-eu": {"0": 3}})   # a topic created since
    listener.onQueryTerminated(NS(runId=lambda: _uuid(RUN), exception=lambda: NS(isDefined=lambda: False)))

    events = recorder.runs()[RUN]
    for event in events:
        validator().validate(event)
    assert [e["outputs"][0]["namespace"] for e in events if e["outputs"]] == ["kafka://out1:9092"] * 4
    assert {d["namespace"] for e in events for d in e["inputs"]} == {"kafka://in1:9092"}
    assert [_facts(e) for e in events] == [
        ("START", [], [], []),   # a Kafka sink is not an error before its options are read
        ("RUNNING", [], ["orders-clean"], [f"source {PATTERN}: no topic has matched the pattern yet; left out"]),
        ("RUNNING", ["orders-us"], ["orders-clean"], []),   # what was left out is as of the last read
        ("RUNNING", ["orders-eu", "orders-us"], ["orders-clean"], []),
        ("COMPLETE", ["orders-eu", "orders-us"], ["orders-clean"], []),
    ]
    assert events[0]["job"]["name"] == "st.streaming.kafka_table"
    # The schema the query writes, read once with the sink's topic: on every event naming the output.
    assert [e["outputs"][0]["facets"]["schema"]["fields"] for e in events if e["outputs"]] == [[
        {"name": "key", "type": "binary"}, {"name": "value", "type": "string"},
        {"name": "headers", "type": "struct", "fields": [{"name": "trace", "type": "string"}]}]] * 4
    assert calls == ["logicalPlan", "get topic", "get kafka.bootstrap.servers"]  # read once a run


@pytest.mark.parametrize(("options", "found", "walks"), [
    ({"topic": "t", "kafka.bootstrap.servers": "b:1"}, DatasetRef("kafka://b:1", "t"), 0),
    ({"Topic": "t", "KAFKA.bootstrap.servers": "PLAINTEXT://b:1"}, DatasetRef("kafka://b:1", "t"), 2),
    ({"kafka.bootstrap.servers": "b:1"}, "no topic option: each row names its topic (its topic column)", 1),
    ({"topic": "t"}, "no kafka.bootstrap.servers option", 1),
])
def test_the_sink_topic_is_read_from_the_writer_options_in_any_case(options, found, walks):
    calls: list[str] = []
    assert _kafka_sink(_kafka_query(options, calls)) == found
    assert calls.count("keysIterator") == walks


def test_a_kafka_sink_whose_options_cannot_be_read_is_named_in_the_runs_extraction_error():
    def broken():
        raise RuntimeError("py4j: no such method writeOptions")
    query = NS(sink=lambda: NS(toString=lambda: KAFKA_TABLE), logicalPlan=broken,
               analyzedPlan=lambda: NS(collectLeaves=lambda: NS(iterator=lambda: NS(hasNext=lambda: False))))
    recorder, _, listener = _capture(query)
    listener.onQueryStarted(NS(runId=lambda: _uuid(RUN), id=lambda: _uuid(RUN), name=lambda: "enrich",
                               timestamp=lambda: "2026-11-28T10:00:00.000Z"))
    _progress(listener, {"orders-us": {"0": 1}})   # no dataset known: no RUNNING
    listener.onQueryTerminated(NS(runId=lambda: _uuid(RUN), exception=lambda: NS(isDefined=lambda: False)))
    assert [e["eventType"] for e in recorder.runs()[RUN]] == ["START", "COMPLETE"]
    terminal = recorder.runs()[RUN][-1]
    validator().validate(terminal)
    assert terminal["job"]["name"] == "st.streaming.enrich"
    errors = [e["errorMessage"] for e in terminal["run"]["facets"]["extractionError"]["errors"]]
    assert any("could not read the topic from the writer's options" in e and "no such method" in e for e in errors)
    assert any("bootstrap servers not found" in e for e in errors), errors


@pytest.mark.spark
@pytest.mark.parametrize("keys", [("topic", "kafka.bootstrap.servers"), ("TOPIC", "Kafka.Bootstrap.Servers")])
def test_the_writer_options_are_read_from_a_real_querys_plan(spark, tmp_path, keys):
    """The py4j path on Spark's own objects: a finished query keeps its plan, whose write node
    holds the writer's options as given (the ``noop`` sink takes any option, as Kafka's would)."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text('{"id": 1}\n')
    topic_key, servers_key = keys
    query = (spark.readStream.schema("id BIGINT").json(str(source)).writeStream.format("noop")
             .option(topic_key, "orders-clean").option(servers_key, "SASL_SSL://b1:9092,b2:9092")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    execution = query._jsq.streamingQuery()
    assert _kafka_sink(execution) == DatasetRef("kafka://b1:9092", "orders-clean")

    plain = (spark.readStream.schema("id BIGINT").json(str(source)).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    assert plain.awaitTermination(120)
    assert _kafka_sink(plain._jsq.streamingQuery()) == "no topic option: each row names its topic (its topic column)"
