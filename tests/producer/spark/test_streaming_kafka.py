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
from producer.spark.streaming import StreamingLineage, _kafka_sink, _text
from producer.spark.streaming_listener import _QueryListener
from producer.spark.streaming_names import datasets, offset_topics
from tests.producer.spark.support import Recorder
from tests.support.spec import validator

RUN = "6b2f1c1e-0000-4000-8000-0000000000c1"
KAFKA_TABLE = "org.apache.spark.sql.kafka010.KafkaSourceProvider$KafkaTable@1a2b3c"
#: A Kafka query's logical plan as ``toJSON`` gives it, cut to its streaming leaf and its output.
KAFKA_PLAN = orjson.dumps([
    {"class": "org.apache.spark.sql.execution.streaming.sources.WriteToMicroBatchDataSource", "num-children": 1},
    {"class": "org.apache.spark.sql.execution.datasources.v2.StreamingDataSourceV2ScanRelation", "num-children": 0,
     "output": [[{"class": "org.apache.spark.sql.catalyst.expressions.AttributeReference", "name": name,
                  "dataType": kind, "nullable": True, "exprId": {"id": i}}]
                for i, (name, kind) in enumerate([("key", "binary"), ("value", "binary"), ("topic", "string"),
                                                  ("partition", "integer"), ("offset", "long"),
                                                  ("timestamp", "timestamp"), ("timestampType", "integer")])]},
]).decode()
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
    """A Scala ``Map[String, String]`` as py4j shows it: ``get`` returns an Option. Every call
    made on it or on what it returns (each a py4j call on Spark's objects) goes to ``calls``."""

    def __init__(self, values: dict[str, str], calls: list[str]) -> None:
        self.values, self.calls = values, calls

    def _called(self, name, fn):
        def call(*args):
            self.calls.append(name)
            return fn(*args)
        return call

    def get(self, key):
        self.calls.append(f"get {key}")
        value = self.values.get(key)
        return NS(isDefined=self._called("isDefined", lambda: value is not None),
                  get=self._called("Option.get", lambda: value))

    def keysIterator(self):  # noqa: N802 - Scala
        self.calls.append("keysIterator")
        keys = iter(list(self.values))
        box = {"next": next(keys, None)}

        def take():
            value, box["next"] = box["next"], next(keys, None)
            return value
        return NS(hasNext=self._called("hasNext", lambda: box["next"] is not None), next=self._called("next", take))


def _kafka_query(options: dict[str, str], calls: list[str], *, node="WriteToMicroBatchDataSource", last=None):
    def servers_plan():
        calls.append("analyzedPlan")
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
        recorded = _Options({}, calls)._called
        return NS(getClass=recorded("getClass", lambda: NS(getSimpleName=recorded("getSimpleName", lambda: node))),
                  writeOptions=recorded("writeOptions", lambda: _Options(options, calls)),
                  toJSON=recorded("toJSON", lambda: KAFKA_PLAN))

    def last_progress():
        calls.append("lastProgress")
        return None if last is None else NS(json=lambda: orjson.dumps(last).decode())

    def recent_progress():
        calls.append("recentProgress")
        return [NS(json=_Options({}, calls)._called("json", lambda p=p: orjson.dumps(p).decode()))
                for p in query.posted]
    query = NS(sink=lambda: NS(toString=lambda: KAFKA_TABLE), analyzedPlan=servers_plan, logicalPlan=logical_plan,
               lastProgress=last_progress, recentProgress=recent_progress, posted=[] if last is None else [last])
    return query


def _capture(query):
    recorder, clock = Recorder(), NS(now=1000.0)
    spark = NS(sparkContext=NS(_jsc=None, _gateway=None),
               _jsparkSession=NS(streams=lambda: NS(get=lambda _id: NS(streamingQuery=lambda: query))))
    lineage = SparkLineage(spark, recorder, CaptureSettings(namespace="st", app_job_name="st"))
    streaming = lineage._streaming = StreamingLineage(lineage, read_interval_s=30.0, clock=lambda: clock.now)
    return recorder, clock, _QueryListener(streaming)


def _uuid(text):
    return NS(toString=lambda: text)


def _progress_data(end_offset, batch=0, rows=0):
    return {"runId": RUN, "timestamp": "2026-11-28T10:00:01.000Z", "batchId": batch,
            "sources": [{"description": PATTERN, "startOffset": None, "endOffset": end_offset, "numInputRows": rows}],
            "sink": {"description": KAFKA_TABLE, "numOutputRows": rows}}


def _progress(listener, end_offset, rows=0):
    query = listener.owner._runs[RUN].query
    progress = _progress_data(end_offset, batch=len(query.posted), rows=rows)
    query.posted.append(progress)
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
    _progress(listener, {"orders-us": {"0": 10}}, rows=10)
    clock.now += 1                                             # not due: counted at the next read
    _progress(listener, {"orders-us": {"0": 11}}, rows=1)
    clock.now += 30
    _progress(listener, {"orders-us": {"0": 12}, "orders-eu": {"0": 3}}, rows=4)   # a topic created since
    _progress(listener, {"orders-us": {"0": 12}, "orders-eu": {"0": 5}}, rows=2)   # after the last read
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
    # Rows written by every micro-batch so far (0 at the first read, 10 at the second, 1+4 by the third,
    # 2 after it): the batches between two reads counted at the next. Rows read: those the one topic
    # gave while the source named only it; a source of two topics has no count per topic.
    assert [e["outputs"][0].get("outputFacets", {}).get("outputStatistics", {}).get("rowCount") for e in events
            if e["outputs"]] == [0, 10, 15, 17]
    assert [[d.get("inputFacets", {}).get("inputStatistics", {}).get("rowCount") for d in e["inputs"]]
            for e in events] == [[], [], [10], [None, None], [None, None]]
    # Kafka's own schema on each topic it reads, from the plan once the inputs are known.
    assert [[d["facets"]["schema"]["fields"][:3] for d in e["inputs"]] for e in events][2:] == [
        [[{"name": "key", "type": "binary"}, {"name": "value", "type": "binary"}, {"name": "topic", "type": "string"}]]
    ] + [[[{"name": "key", "type": "binary"}, {"name": "value", "type": "binary"},
           {"name": "topic", "type": "string"}]] * 2] * 2
    # Each py4j call counted. Once a run: the servers, the sink's topic (ten calls), the schema it
    # writes, the plan (at the first read, for the data at rest it reads: none here; kept for the
    # schemas its sources read, once they are named). At each read (and at the end) its recent
    # progress, newest first down to the last batch counted (two calls, then one per progress: its JSON).
    assert calls == ["analyzedPlan", "logicalPlan", "getClass", "getSimpleName", "writeOptions",
                     "get topic", "isDefined", "Option.get", "get kafka.bootstrap.servers", "isDefined", "Option.get",
                     "analyzedPlan", "logicalPlan", "toJSON", "recentProgress", "json",
                     "recentProgress", "json", "json",
                     "recentProgress", "json", "json", "json",
                     "recentProgress", "json", "json"]


def _started(listener, name=None):
    listener.onQueryStarted(NS(runId=lambda: _uuid(RUN), id=lambda: _uuid(RUN), name=lambda: name,
                               timestamp=lambda: "2026-11-28T10:00:00.000Z"))


def _terminated(listener):
    listener.onQueryTerminated(NS(runId=lambda: _uuid(RUN), exception=lambda: NS(isDefined=lambda: False)))


def test_a_pattern_source_keeps_every_topic_it_matched_in_the_run():
    recorder, clock, listener = _capture(_kafka_query({"topic": "out", "kafka.bootstrap.servers": "o:1"}, []))
    _started(listener)
    _progress(listener, {"orders-us": {"0": 10}})
    clock.now += 31
    _progress(listener, {"orders-eu": {"0": 3}})   # orders-us deleted meanwhile: this run still read it
    _terminated(listener)
    assert [_facts(e)[:2] for e in recorder.runs()[RUN]] == [
        ("START", []), ("RUNNING", ["orders-us"]), ("RUNNING", ["orders-eu", "orders-us"]),
        ("COMPLETE", ["orders-eu", "orders-us"])]


def test_a_kafka_sink_run_first_read_at_its_end_names_its_datasets_in_its_terminal():
    """A query idle until it stopped: its last progress is read at its end, the sink's topic with it."""
    calls: list[str] = []
    query = _kafka_query({"topic": "orders-clean", "kafka.bootstrap.servers": "out1:9092"}, calls,
                         last=_progress_data({"orders-us": {"0": 10}}))
    recorder, _, listener = _capture(query)
    _started(listener, name="enrich")
    _terminated(listener)
    events = recorder.runs()[RUN]
    for event in events:
        validator().validate(event)
    assert [_facts(e) for e in events] == [("START", [], [], []), ("COMPLETE", ["orders-us"], ["orders-clean"], [])]
    assert events[1]["outputs"][0]["namespace"] == "kafka://out1:9092"
    assert events[1]["outputs"][0]["facets"]["schema"]["fields"][0] == {"name": "key", "type": "binary"}
    assert events[0]["job"]["name"] == events[1]["job"]["name"] == "st.streaming.enrich"
    # Its last progress once, the plan once for the sink's topic and once for the schemas it reads.
    assert calls.count("lastProgress") == 1 and calls.count("logicalPlan") == 2 and calls.count("toJSON") == 1
    assert events[1]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 0


def test_a_plan_whose_write_node_holds_no_options_is_a_reason_not_an_error():
    calls: list[str] = []
    found = _kafka_sink(_kafka_query({"topic": "t"}, calls, node="WriteToContinuousDataSource"))
    assert found == "the query's plan is a WriteToContinuousDataSource, which holds no writer options"
    assert "writeOptions" not in calls


def test_an_errors_text_is_its_type_and_first_line_and_a_java_errors_its_exceptions():
    class Py4JJavaError(Exception):  # as py4j's: str() gives its own text, then the Java trace
        java_exception = NS(toString=lambda: "java.lang.IllegalStateException: no plan yet\n\tat a.B.c(B.scala:1)")
    assert _text(Py4JJavaError("An error occurred while calling o91.logicalPlan.\n: java.lang...")) == (
        "Py4JJavaError: java.lang.IllegalStateException: no plan yet")
    assert _text(RuntimeError("first line\n\tat org.apache.Foo(Foo.java:1)")) == "RuntimeError: first line"
    assert _text(RuntimeError()) == "RuntimeError"

    class Gone(Exception):
        def __init__(self):
            super().__init__("py4j text\nmore")
            self.java_exception = NS(toString=self._fail)

        @staticmethod
        def _fail():
            raise ConnectionError("gateway closed")
    assert _text(Gone()) == "Gone: py4j text"


@pytest.mark.parametrize(("options", "found", "walks", "py4j_calls"), [
    ({"topic": "t", "kafka.bootstrap.servers": "b:1"}, DatasetRef("kafka://b:1", "t"), 0, 10),
    # each key not found as given: 2 + a walk (1, 2 per key looked at, 1 when none matches) + 2 when found
    ({"Topic": "t", "KAFKA.bootstrap.servers": "PLAINTEXT://b:1"}, DatasetRef("kafka://b:1", "t"), 2, 4 + 7 + 9),
    ({"kafka.bootstrap.servers": "b:1"}, "no topic option: each row names its topic (its topic column)", 1, 4 + 6 + 3),
    ({"topic": "t"}, "no kafka.bootstrap.servers option", 1, 4 + 3 + 6),
])
def test_the_sink_topic_is_read_from_the_writer_options_in_any_case(options, found, walks, py4j_calls):
    calls: list[str] = []
    assert _kafka_sink(_kafka_query(options, calls)) == found
    assert calls.count("keysIterator") == walks
    assert len(calls) == py4j_calls, calls


def test_a_kafka_sink_whose_options_cannot_be_read_is_named_in_the_runs_extraction_error():
    def broken():
        raise RuntimeError("py4j: no such method writeOptions\n\tat org.apache.spark.Foo(Foo.scala:1)")
    query = NS(sink=lambda: NS(toString=lambda: KAFKA_TABLE), logicalPlan=broken, posted=[],
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
    assert (f"sink {KAFKA_TABLE}: could not read the topic from the writer's options: RuntimeError: py4j: no such "
            "method writeOptions; left out") in errors
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

    # A V1 sink (a file sink): its write node is the V1 form, whose options are read the same way.
    files = (spark.readStream.schema("id BIGINT").json(str(source)).writeStream.format("parquet")
             .option(topic_key, "t").option(servers_key, "b3:9092").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck3")).trigger(availableNow=True).start())
    assert files.awaitTermination(120)
    execution = files._jsq.streamingQuery()
    assert execution.logicalPlan().getClass().getSimpleName() == "WriteToMicroBatchDataSourceV1"
    assert _kafka_sink(execution) == DatasetRef("kafka://b3:9092", "t")


def _leaves_plan(leaves):
    """An analysed plan whose ``collectLeaves`` are ``leaves`` (simple class name, servers or None)."""
    def leaf(kind, servers):
        return NS(getClass=lambda: NS(getSimpleName=lambda: kind),
                  extraOptions=lambda: {} if servers is None else {"kafka.bootstrap.servers": servers})
    items = [leaf(kind, servers) for kind, servers in leaves]

    def iterator():
        rest = iter(items)
        box = {"next": next(rest, None)}

        def take():
            value, box["next"] = box["next"], next(rest, None)
            return value
        return NS(hasNext=lambda: box["next"] is not None, next=take)
    return NS(collectLeaves=lambda: NS(iterator=iterator),
              schema=lambda: NS(json=lambda: '{"type":"struct","fields":[]}'))


def test_each_kafka_source_is_named_in_its_own_cluster():
    """A query reading two clusters (a union of two Kafka sources, a file source between them and
    a batch table joined in): each topic in its own source's servers, not the first's."""
    plan = _leaves_plan([("StreamingRelationV2", "SSL://eu-broker:9092,eu2:9092"), ("StreamingRelation", None),
                         ("LogicalRelation", None), ("StreamingRelationV2", "us-broker:9092")])
    progress = {"runId": RUN, "timestamp": "2026-11-28T10:00:01.000Z", "batchId": 0,
                "sources": [{"description": "KafkaV2[Subscribe[orders]]", "numInputRows": 1},
                            {"description": "FileStreamSource[file:/landing/orders]", "numInputRows": 1},
                            {"description": "KafkaV2[Subscribe[refunds, orders]]", "numInputRows": 1}],
                "sink": {"description": "MemorySink", "numOutputRows": 3}}
    query = NS(sink=lambda: NS(toString=lambda: "MemorySink"), analyzedPlan=lambda: plan,
               logicalPlan=lambda: NS(toJSON=lambda: "[]"), lastProgress=lambda: None,
               recentProgress=lambda: [NS(json=lambda: orjson.dumps(progress).decode())])
    recorder, _, listener = _capture(query)
    listener.onQueryStarted(NS(runId=lambda: _uuid(RUN), id=lambda: _uuid(RUN), name=lambda: "q",
                               timestamp=lambda: "2026-11-28T10:00:00.000Z"))
    listener.onQueryProgress(NS(progress=lambda: NS(json=lambda: orjson.dumps(progress).decode())))
    listener.onQueryTerminated(NS(runId=lambda: _uuid(RUN), exception=lambda: None))
    running, complete = [e for e in recorder.events if e["eventType"] in ("RUNNING", "COMPLETE")]
    for event in (running, complete):
        validator().validate(event)
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
            ("kafka://eu-broker:9092", "orders"), ("file", "/landing/orders"),
            ("kafka://us-broker:9092", "refunds"), ("kafka://us-broker:9092", "orders")]
        errors = event["run"]["facets"].get("extractionError", {}).get("errors", [])
        assert not [e for e in errors if "kafka" in e["errorMessage"]]   # (the fake plan has no input schemas)


@pytest.mark.parametrize(("leaves", "sources", "paired", "reason"), [
    # One leaf per source: by position.
    (["a:1", None, "b:1"], ["KafkaV2[Subscribe[x]]", "FileStreamSource[file:/f]", "KafkaV2[Subscribe[y]]"],
     ["a:1", None, "b:1"], None),
    # A source read twice (a self-union: one progress source, two leaves); one cluster.
    (["a:1", "a:1"], ["KafkaV2[Subscribe[x]]"], ["a:1"], None),
    # As many Kafka leaves as Kafka sources, other leaves unpaired.
    (["a:1", None, None, "b:1"], ["KafkaV2[Subscribe[x]]", "FileStreamSource[file:/f]", "KafkaV2[Subscribe[y]]"],
     ["a:1", None, "b:1"], None),
    # Two clusters that cannot be told apart: none, and why.
    (["a:1", "b:1", "a:1"], ["KafkaV2[Subscribe[x]]", "KafkaV2[Subscribe[y]]"], [None, None],
     "could not pair the plan's 3 streaming sources with the progress's 2: no kafka bootstrap servers"),
    (None, ["KafkaV2[Subscribe[x]]"], [None], None),
    (["a:1"], ["FileStreamSource[file:/f]"], [None], None),
])
def test_kafka_servers_pair_with_the_progress_sources(leaves, sources, paired, reason):
    from producer.spark.streaming_names import pair_servers
    assert pair_servers(leaves, sources) == (paired, reason)
