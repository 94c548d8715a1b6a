"""``enable_lineage`` in setups where capture cannot or must not run: it returns None and
leaves nothing behind. The sessions are small fakes of PySpark's (no JVM needed)."""

from __future__ import annotations

import logging
import sys
import threading
from types import SimpleNamespace

import pytest

from producer.errors import ConfigError
from producer.spark import _ACTIVE, disable_lineage, enable_lineage
from tests.producer.spark.support import Recorder


class _Method:
    def __init__(self, name, calls):
        self._name, self._calls = name, calls

    def getName(self):  # noqa: N802 - Java reflection API
        return self._name

    def getParameterCount(self):  # noqa: N802
        return 1

    def invoke(self, manager, holder):
        self._calls.append((self._name, holder))


class FakeSession:
    """What enable_lineage touches of a classic SparkSession and its py4j gateway."""

    version = "3.5.0"

    def __init__(self, conf: dict[str, str]) -> None:
        self.calls: list[tuple[str, object]] = []
        methods = [_Method("register", self.calls), _Method("unregister", self.calls)]
        manager = SimpleNamespace(getClass=lambda: SimpleNamespace(getMethods=lambda: methods))
        self._jsparkSession = SimpleNamespace(listenerManager=lambda: manager)
        pool = SimpleNamespace(lock=threading.Lock(), dict={})
        gateway = SimpleNamespace(
            _callback_server=object(),   # "already started" for ensure_callback_server_started
            jvm=SimpleNamespace(java=SimpleNamespace(util=SimpleNamespace(ArrayList=_ArrayList))),
            gateway_property=SimpleNamespace(pool=pool))
        self.sparkContext = SimpleNamespace(getConf=lambda: SimpleNamespace(getAll=lambda: list(conf.items())),
                                            _gateway=gateway, stop=self._stop)

    def _stop(self):
        pass

    def registered(self) -> int:
        return sum(1 if name == "register" else -1 for name, _ in self.calls)


class _ArrayList(list):
    def add(self, item):
        self.append(item)

    def toArray(self):  # noqa: N802
        return tuple(self)


def test_a_spark_connect_session_is_not_captured(caplog):
    connect = SimpleNamespace(version="3.5.0")   # pyspark.sql.connect: no _jsparkSession, no sparkContext
    caplog.set_level(logging.WARNING, "producer.spark")
    assert enable_lineage(connect) is None
    assert "Spark Connect" in caplog.text


@pytest.mark.parametrize("transport", ["http", "console"])
def test_a_transport_for_the_jvm_integration_is_left_to_it(transport, caplog):
    spark = FakeSession({"spark.openlineage.transport.type": transport,
                         "spark.openlineage.transport.url": "http://marquez:5000"})
    caplog.set_level(logging.INFO, "producer.spark")
    assert enable_lineage(spark) is None
    assert f"transport.type={transport} is not ours" in caplog.text and spark.calls == []


def test_our_kafka_transport_misconfigured_still_fails_at_start(monkeypatch):
    monkeypatch.delenv("OPENLINEAGE_DISABLED", raising=False)
    spark = FakeSession({"spark.openlineage.transport.type": "kafka", "spark.openlineage.transport.topicName": "t"})
    with pytest.raises(ConfigError, match="bootstrap_servers: required"):
        enable_lineage(spark)


class _BrokenSender(Recorder):
    def emit(self, event: dict) -> None:
        raise RuntimeError("the START event cannot be sent")


def test_a_failed_start_unregisters_the_listener_and_undoes_the_hooks(caplog):
    spark = FakeSession({})
    stop, hook = spark.sparkContext.stop, sys.excepthook
    caplog.set_level(logging.WARNING, "producer.spark")
    assert enable_lineage(spark, producer=_BrokenSender()) is None
    assert [name for name, _ in spark.calls] == ["register", "unregister"] and spark.registered() == 0
    assert spark.sparkContext.stop == stop and sys.excepthook is hook
    assert id(spark._jsparkSession) not in _ACTIVE
    assert "could not start capture" in caplog.text


def test_the_metastore_is_found_in_the_hadoop_configuration_too(spark):
    """Clusters set hive.metastore.uris in hive-site.xml / core-site.xml, not in the Spark
    conf: table symlinks then named the warehouse instead of the metastore. It names the
    tables only of a Hive catalog (this session's is in-memory)."""
    from producer.spark import _hadoop_setting, _metastore_uris

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert _hadoop_setting(spark, "hive.metastore.uris") is None
    hadoop.set("hive.metastore.uris", "thrift://metastore:9083")
    try:
        assert _hadoop_setting(spark, "hive.metastore.uris") == "thrift://metastore:9083"
        assert _metastore_uris(spark, {"spark.sql.catalogImplementation": "hive"}) == "thrift://metastore:9083"
        lineage = enable_lineage(spark, producer=Recorder())
        try:
            assert lineage.settings.metastore_uris is None   # in-memory catalog
        finally:
            disable_lineage(spark)
    finally:
        hadoop.unset("hive.metastore.uris")


RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"


@pytest.mark.parametrize("parent_conf", [
    {"spark.openlineage.parentRunId": RUN_ID},                            # incomplete
    {"spark.openlineage.parentJobNamespace": "airflow", "spark.openlineage.parentJobName": "dag.task",
     "spark.openlineage.parentRunId": "{{ run_id }}"},                    # an unrendered template
])
def test_an_unusable_spark_parent_costs_the_parent_facet_not_the_capture(monkeypatch, caplog, parent_conf):
    """As the official integration: the parent facet is omitted, the job and its lineage go on."""
    from producer import parents

    monkeypatch.delenv("OPENLINEAGE_PARENT_ID", raising=False)
    monkeypatch.setattr(parents, "_warned", set())
    caplog.set_level(logging.WARNING, "producer.config")
    spark, sender = FakeSession(parent_conf), Recorder()
    lineage = enable_lineage(spark, producer=sender)
    try:
        assert lineage is not None
        [start] = sender.events
        assert start["eventType"] == "START" and "parent" not in start["run"]["facets"]
        assert "event=parent_ignored key" in caplog.text and "spark.openlineage.parentRunId" in caplog.text
    finally:
        disable_lineage(spark)


def test_disabled_facets_are_left_out_as_the_official_integration_does():
    spark, sender = FakeSession({"spark.openlineage.facets.disabled": "[processing_engine;spark_properties]",
                                 "spark.openlineage.facets.spark_properties.disabled": "false",
                                 "spark.openlineage.facets.jobType.disabled": "true",
                                 "spark.app.name": "app"}), Recorder()
    lineage = enable_lineage(spark, producer=sender)
    try:
        [start] = sender.events
        assert "processing_engine" not in start["run"]["facets"] and "spark_properties" in start["run"]["facets"]
        assert "jobType" not in start["job"].get("facets", {})
    finally:
        disable_lineage(spark)
    assert lineage is not None


def test_disabled_facets_are_left_out_of_datasets_too():
    from producer import events

    schema = events.facet("SchemaDatasetFacet", {"fields": []})
    stats = events.facet("OutputStatisticsOutputDatasetFacet", {"rowCount": 1})
    event = events.run_event(
        "COMPLETE", run_id=RUN_ID, job_namespace="ns", job_name="j",
        inputs=[events.dataset("s3://b", "in", {"schema": schema})],
        outputs=[events.dataset("s3://b", "out", {"schema": schema}, output_facets={"outputStatistics": stats})])
    out = events.without_facets(event, frozenset({"schema", "outputStatistics"}))
    assert out["inputs"] == [{"namespace": "s3://b", "name": "in", "facets": {}}]
    assert out["outputs"] == [{"namespace": "s3://b", "name": "out", "facets": {}, "outputFacets": {}}]
    assert event["inputs"][0]["facets"] == {"schema": schema}   # the event given is left as it was


@pytest.mark.parametrize("disabled", [
    {"spark.openlineage.facets.disabled": "[columnLineage]"},
    {"spark.openlineage.facets.columnLineage.disabled": "true"},
])
def test_a_disabled_column_lineage_facet_is_not_computed(spark, tmp_path, monkeypatch, disabled):
    """Tracing a plan's columns costs the listener thread; a facet that is left out must not be traced."""
    from producer.spark import columns
    from tests.producer.spark.support import drain

    traced: list[object] = []
    real_trace = columns.trace

    def counting(*args, **kwargs):
        traced.append(args[0])
        return real_trace(*args, **kwargs)
    monkeypatch.setattr(columns, "trace", counting)
    real_conf = spark.sparkContext.getConf().getAll()
    src = spark.range(5).selectExpr("id", "id * 2 AS twice")
    for conf, expect_traced in ((disabled, False), ({}, True)):
        monkeypatch.setattr(spark.sparkContext, "getConf", lambda conf=conf: SimpleNamespace(
            getAll=lambda: [*real_conf, *conf.items()]))
        sender, traced[:] = Recorder(), []
        enable_lineage(spark, producer=sender, app_name="cols")
        try:
            src.write.mode("overwrite").parquet(str(tmp_path / "out"))
            drain(spark)
        finally:
            disable_lineage(spark)
        outputs = [o for e in sender.events for o in e.get("outputs", [])]
        assert outputs, "the write is reported"
        assert bool(traced) is expect_traced
        assert any("columnLineage" in o.get("facets", {}) for o in outputs) is expect_traced
