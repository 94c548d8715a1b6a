"""The ``inputStatistics`` facet of a batch action's inputs, on real PySpark: the rows, files
and bytes its scans read (after partition pruning), on COMPLETE only, each input its own,
in one py4j call per action (none without an input at rest); and the rules that leave the
facet out rather than guess (pure)."""

from __future__ import annotations

import glob
import os

import pytest

from producer.spark import jvm, scans
from producer.spark.input_stats import COUNTED, counts_its_run, input_statistics
from producer.spark.scans import Scan, parse_scans
from tests.producer.spark.support import Recorder, validated_capture

APP = "input_stats_app"


def _files(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), "**", "part-*"), recursive=True)


def _stats(directory) -> dict:
    files = _files(directory)
    return {"fileCount": len(files), "size": sum(os.path.getsize(f) for f in files)}


def _run(spark, action, read_only_actions: bool = False) -> Recorder:
    return validated_capture(spark, action, app_name=APP, read_only_actions=read_only_actions)


def _inputs(recorder: Recorder, kind: str) -> dict[str, dict]:
    events = [e for e in recorder.events if e["job"]["name"] != APP and e["eventType"] == kind]
    assert len(events) == 1, [e["eventType"] for e in recorder.events]
    return {d["name"]: d for d in events[0]["inputs"]}


@pytest.mark.spark
def test_a_parquet_read_reports_the_rows_files_and_bytes_it_read_on_complete_only(spark, tmp_path):
    src = tmp_path / "src"
    spark.range(100).selectExpr("id", "id * 2 AS v").repartition(4).write.parquet(str(src))
    assert len(_files(src)) == 4
    recorder = _run(spark, lambda: spark.read.parquet(str(src)).write.parquet(str(tmp_path / "out")))
    stats = _inputs(recorder, "COMPLETE")[str(src)]["inputFacets"]["inputStatistics"]
    assert {k: v for k, v in stats.items() if not k.startswith("_")} == {"rowCount": 100, **_stats(src)}
    assert "inputFacets" not in _inputs(recorder, "START")[str(src)], "START: nothing read yet"


@pytest.mark.spark
def test_a_read_pruned_to_one_partition_counts_only_the_files_it_read(spark, tmp_path):
    src = tmp_path / "parted"
    spark.range(90).selectExpr("id", "id % 3 AS p").repartition(2).write.partitionBy("p").parquet(str(src))
    read = spark.read.parquet(str(src)).filter("p = 1")
    recorder = _run(spark, lambda: read.write.parquet(str(tmp_path / "out")))
    stats = _inputs(recorder, "COMPLETE")[str(src)]["inputFacets"]["inputStatistics"]
    assert _stats(src / "p=1")["fileCount"] < _stats(src)["fileCount"]
    assert {k: v for k, v in stats.items() if not k.startswith("_")} == {"rowCount": 30, **_stats(src / "p=1")}


@pytest.mark.spark
def test_each_input_of_a_join_gets_its_own_numbers_and_a_dataset_read_twice_their_sum(spark, tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    spark.range(60).selectExpr("id", "id % 3 AS p").repartition(3).write.partitionBy("p").parquet(str(left))
    spark.range(40).selectExpr("id", "id * 10 AS v").repartition(2).write.parquet(str(right))
    a, b = spark.read.parquet(str(left)), spark.read.parquet(str(right))
    joined = a.filter("p = 0").join(b, "id")
    # The same dataset twice, other partitions each time: two scans, their reading summed.
    self_joined = a.filter("p = 1").selectExpr("id", "p AS p1").join(
        a.filter("p = 2").selectExpr("id", "p AS p2"), "id", "left")

    recorder = _run(spark, lambda: joined.write.parquet(str(tmp_path / "joined")))
    inputs = _inputs(recorder, "COMPLETE")
    assert _plain(inputs[str(left)]) == {"rowCount": 20, **_stats(left / "p=0")}
    assert _plain(inputs[str(right)]) == {"rowCount": 40, **_stats(right)}

    recorder = _run(spark, lambda: self_joined.write.parquet(str(tmp_path / "self")))
    both = {"fileCount": _stats(left / "p=1")["fileCount"] + _stats(left / "p=2")["fileCount"],
            "size": _stats(left / "p=1")["size"] + _stats(left / "p=2")["size"]}
    assert _plain(_inputs(recorder, "COMPLETE")[str(left)]) == {"rowCount": 40, **both}


def _plain(dataset: dict) -> dict:
    return {k: v for k, v in dataset["inputFacets"]["inputStatistics"].items() if not k.startswith("_")}


@pytest.mark.spark
def test_a_failed_action_and_an_input_read_only_in_a_subquery_carry_no_statistics(spark, tmp_path):
    src, keys = tmp_path / "src", tmp_path / "keys"
    spark.range(10).write.parquet(str(src))
    spark.range(3).write.parquet(str(keys))
    spark.read.parquet(str(src)).createOrReplaceTempView("input_stats_src")
    spark.read.parquet(str(keys)).createOrReplaceTempView("input_stats_keys")
    query = spark.sql("SELECT * FROM input_stats_src WHERE id >= (SELECT min(id) FROM input_stats_keys)")
    recorder = _run(spark, lambda: query.write.parquet(str(tmp_path / "sub")))
    inputs = _inputs(recorder, "COMPLETE")
    assert "inputFacets" not in inputs[str(keys)], "its scan runs inside the filter's scalar subquery: not seen"
    assert _plain(inputs[str(src)]) == {"rowCount": 10, **_stats(src)}

    failing = spark.read.parquet(str(src)).selectExpr("id", "CASE WHEN id = 7 THEN raise_error('boom') END AS x")

    def fail():
        with pytest.raises(Exception, match="boom"):
            failing.write.parquet(str(tmp_path / "failed"))
    recorder = _run(spark, fail)
    assert "inputFacets" not in _inputs(recorder, "FAIL")[str(src)], "a failed action's counts are partial"


@pytest.mark.spark
def test_reading_what_the_scans_read_costs_no_py4j_call_of_its_own_and_is_not_asked_without_an_input(
        spark, tmp_path, py4j_calls, monkeypatch):
    """The scan reader is built once; its answer comes with the action's other facts, in the
    batched reads' one call (producer.spark.batched_reads)."""
    costs: list[int] = []
    original = jvm.scan_reader

    def counted(*args):
        before = len(py4j_calls)
        try:
            return original(*args)
        finally:
            costs.append(len(py4j_calls) - before)
    monkeypatch.setattr(jvm, "scan_reader", counted)
    src = tmp_path / "src"
    spark.range(5).write.parquet(str(src))

    def actions():
        for i in range(3):
            spark.read.parquet(str(src)).write.parquet(str(tmp_path / f"read{i}"))
        spark.range(3).write.parquet(str(tmp_path / "no_input"))
    recorder = _run(spark, actions)
    assert costs[1:] == [0, 0], f"the first builds the reader, kept: {costs}"
    assert len(costs) == 3, "an action that reads no data at rest does not ask"
    completes = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["job"]["name"] != APP]
    assert ["inputFacets" in d for e in completes for d in e["inputs"]] == [True, True, True]


def _completes(recorder: Recorder) -> list[dict]:
    return [e for e in recorder.events if e["job"]["name"] != APP and e["eventType"] == "COMPLETE"]


def _read(event: dict, name: str) -> dict | None:
    dataset = next(d for d in event["inputs"] if d["name"] == name)
    return _plain(dataset) if "inputStatistics" in dataset.get("inputFacets", {}) else None


@pytest.mark.spark
def test_an_action_that_reruns_its_dataframes_plan_carries_no_statistics(spark, tmp_path):
    # collect, toLocalIterator, foreach, rdd... run the DataFrame's own QueryExecution each
    # time: its scans' metrics are the last run's, or zeros, or reset by the next run while
    # the listener reads them (Spark posts a file scan's file metrics at first planning only).
    src = tmp_path / "src"
    spark.range(300).selectExpr("id", "id % 3 AS k").repartition(3).write.parquet(str(src))
    df = spark.read.parquet(str(src))
    grouped = df.groupBy("k").count()  # adaptive: the 2nd collect reuses the 1st's shuffle stage

    def actions():
        df.collect()
        df.collect()
        grouped.collect()
        grouped.collect()
        list(df.toLocalIterator())
        df.foreach(lambda row: None)
        for _ in range(10):
            df.filter("id % 2 = 0").collect()
    recorder = _run(spark, actions, read_only_actions=True)
    completes = _completes(recorder)
    assert len(completes) >= 14, [e["job"]["name"] for e in completes]
    assert [_read(e, str(src)) for e in completes] == [None] * len(completes)


@pytest.mark.spark
def test_an_action_spark_plans_for_its_own_run_reports_each_runs_reading(spark, tmp_path):
    src = tmp_path / "src"
    spark.range(300).repartition(3).write.parquet(str(src))
    df = spark.read.parquet(str(src)).filter("id % 2 = 0")
    # show() runs Dataset.head, which plans anew each call: each run's own numbers, however
    # close together.
    recorder = _run(spark, lambda: [df.show(1000) for _ in range(10)], read_only_actions=True)
    completes = _completes(recorder)
    assert len(completes) == 10
    assert [_read(e, str(src)) for e in completes] == [{"rowCount": 300, **_stats(src)}] * 10


@pytest.mark.spark
def test_a_dataframe_converted_to_an_rdd_carries_no_statistics(spark, tmp_path):
    # Spark reports Dataset.rdd as an action ("rdd") before its scan has run.
    src = tmp_path / "csv"
    spark.range(200).repartition(3).write.csv(str(src))
    recorder = _run(spark, lambda: spark.read.option("inferSchema", "true").csv(str(src)), read_only_actions=True)
    by_job = {e["job"]["name"]: _read(e, str(src)) for e in _completes(recorder)}
    converted = [read for job, read in by_job.items() if job.endswith("deserialize_to_object")]
    assert converted == [None], by_job


@pytest.mark.spark
def test_a_scan_behind_a_reused_exchange_counts_only_when_its_original_was_seen(spark, tmp_path):
    """A dimension read twice, once by a join with dynamic partition pruning: without adaptive
    execution the pruning subquery keeps the original broadcast and the join a
    ReusedExchangeExec, whose scan is never seen: left out. With it, the join keeps the
    broadcast and both readings are counted."""
    fact, dim = tmp_path / "fact", tmp_path / "dim"
    spark.range(1000).selectExpr("id", "id % 4 AS p").repartition(3).write.partitionBy("p").parquet(str(fact))
    spark.range(4).selectExpr("id AS p", "id % 2 AS flag").repartition(2).write.parquet(str(dim))

    def query(out):
        f, d = spark.read.parquet(str(fact)), spark.read.parquet(str(dim))
        both = f.join(d.filter("flag = 1"), "p").select("p").union(d.filter("flag = 0").select("p"))
        return lambda: both.write.mode("overwrite").parquet(str(tmp_path / out))

    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        recorder = _run(spark, query("off"))
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert _read(_completes(recorder)[0], str(dim)) is None, "one of its two readings was not seen"

    recorder = _run(spark, query("on"))
    # Each reading as an action of its own reports it (Parquet skips row groups by the filter).
    alone = [_read(_completes(_run(spark, lambda flag=flag: spark.read.parquet(str(dim)).filter(f"flag = {flag}")
                                   .write.mode("overwrite").parquet(str(tmp_path / "alone"))))[0], str(dim))
             for flag in (0, 1)]
    assert _read(_completes(recorder)[0], str(dim)) == {
        "rowCount": alone[0]["rowCount"] + alone[1]["rowCount"],
        "fileCount": 2 * _stats(dim)["fileCount"], "size": 2 * _stats(dim)["size"]}


@pytest.mark.spark
@pytest.mark.parametrize("adaptive", ["true", "false"])
def test_an_exchange_reused_within_the_plan_counts_its_reading_once(spark, tmp_path, monkeypatch, adaptive):
    src = tmp_path / "src"
    spark.range(300).selectExpr("id", "id % 3 AS k").repartition(3).write.parquet(str(src))
    kinds: list[str] = []
    original = scans.parse_scans

    def parse(text):
        parsed = original(text)
        kinds.extend(scan.kind for scan in parsed or [])
        return parsed
    monkeypatch.setattr(scans, "parse_scans", parse)
    counts = spark.read.parquet(str(src)).groupBy("k").count()
    self_joined = counts.join(counts.withColumnRenamed("count", "c2"), "k")
    spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    try:
        recorder = _run(spark, lambda: self_joined.write.parquet(str(tmp_path / "out")))
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert "ReusedExchangeExec" in kinds, kinds
    assert _read(_completes(recorder)[0], str(src)) == {"rowCount": 300, **_stats(src)}


@pytest.mark.spark
def test_the_readers_answer_for_a_wide_input_fits_one_py4j_buffer(spark, tmp_path, monkeypatch):
    # An answer over 8 KiB stalls ~40 ms (see producer.spark.batched_reads.PIECE_CHARS).
    src = tmp_path / "wide"
    spark.range(5).selectExpr(*[f"id AS c{i}" for i in range(3000)]).write.parquet(str(src))
    answers: list[int] = []
    original = scans.parse_scans
    monkeypatch.setattr(scans, "parse_scans", lambda text: answers.append(len(text)) or original(text))
    recorder = _run(spark, lambda: spark.read.parquet(str(src)).write.parquet(str(tmp_path / "out")))
    assert answers and max(answers) < 1000, answers
    assert _plain(_inputs(recorder, "COMPLETE")[str(src)]) == {"rowCount": 5, **_stats(src)}


# -- the rules, on plain data ------------------------------------------------------------------
def _file_scan(ids, rows, files, size, kind="FileSourceScanExec", identity=None) -> Scan:
    return Scan(kind, frozenset(ids), {"numOutputRows": rows, "numFiles": files, "filesSize": size, "scanTime": 9},
                identity)


def test_scans_are_matched_to_the_leaves_whose_attributes_they_output():
    scans = [_file_scan({1, 2}, 10, 2, 200), _file_scan({5}, 7, 1, 50), Scan("LocalTableScanExec", frozenset({9}))]
    stats = input_statistics(scans, [frozenset({1, 2, 3}), frozenset({5, 6}), frozenset()], [(0,), (1,), ()])
    assert stats == {0: {"rowCount": 10, "size": 200, "fileCount": 2}, 1: {"rowCount": 7, "size": 50, "fileCount": 1}}


def test_a_dataset_read_by_two_leaves_sums_them_and_a_reused_exchange_adds_nothing():
    leaves, datasets = [frozenset({1}), frozenset({2}), frozenset({3})], [(0,), (0,), (0,)]
    scans = [_file_scan({1}, 10, 2, 200, identity=11), _file_scan({2}, 5, 1, 100, identity=12),
             Scan("ReusedExchangeExec", frozenset({3}), identity=13, reuses=frozenset({11}))]
    assert input_statistics(scans, leaves, datasets) == {0: {"rowCount": 15, "size": 300, "fileCount": 3}}


@pytest.mark.parametrize("reuses, why", [
    (frozenset(), "the exchange's leaves are not known"),
    (frozenset({99}), "the original exchange's scan was not seen (a pruning subquery's, without adaptive execution)"),
    (frozenset({11, 99}), "one of the original exchange's scans was not seen"),
    (frozenset({14}), "the original exchange's leaf is not a counted scan"),
])
def test_a_reused_exchange_whose_original_was_not_seen_leaves_its_dataset_out(reuses, why):
    leaves, datasets = [frozenset({1}), frozenset({3}), frozenset({4})], [(0,), (0,), (1,)]
    scans = [_file_scan({1}, 10, 2, 200, identity=11), Scan("ReusedExchangeExec", frozenset({3}), identity=13,
                                                             reuses=reuses),
             Scan("LocalTableScanExec", frozenset({4}), identity=14)]
    assert input_statistics(scans, leaves, datasets) == {}, why


@pytest.mark.parametrize("func, writes, counted", [
    ("save", True, True), ("collectToPython", True, True), ("head", False, True), ("count", False, True),
    ("collect", False, False), ("collectToPython", False, False), ("collectAsArrowToPython", False, False),
    ("toLocalIterator", False, False), ("foreachPartition", False, False), ("rdd", False, False),
    ("tailToPython", False, False), ("somethingNew", False, False),
])
def test_only_an_action_planned_for_its_own_run_is_counted(func, writes, counted):
    assert counts_its_run(func, writes) is counted


def test_every_counted_metric_is_one_the_reader_reads():
    assert {m for fields in COUNTED.values() for m in fields.values()} <= set(scans.METRICS)


def test_only_the_fields_every_scan_of_a_dataset_has_are_summed():
    scans = [_file_scan({1}, 10, 2, 200), Scan("BatchScanExec", frozenset({2}), {"numOutputRows": 4})]
    assert input_statistics(scans, [frozenset({1}), frozenset({2})], [(0,), (0,)]) == {0: {"rowCount": 14}}


@pytest.mark.parametrize("scans, leaves, datasets, why", [
    ([_file_scan({1}, 1, 1, 1)], [frozenset({1}), frozenset({2})], [(0,), (0,)],
     "the dataset's second leaf has no scan (a subquery's)"),
    ([_file_scan({1}, 1, 1, 1), Scan("InMemoryTableScanExec", frozenset({2}), {"numOutputRows": 3})],
     [frozenset({1}), frozenset({2})], [(0,), (0,)], "one leaf is read from a cache"),
    ([_file_scan({1}, 1, 1, 1)], [frozenset({1})], [(0, 1)], "the leaf stands for two datasets"),
])
def test_a_dataset_whose_reading_is_not_fully_seen_gets_nothing(scans, leaves, datasets, why):
    assert input_statistics(scans, leaves, datasets) == {}, why


@pytest.mark.parametrize("stray", [frozenset(), frozenset({1, 2}), frozenset({7})])
def test_a_counted_scan_that_matches_no_single_leaf_leaves_every_input_out(stray):
    scans = [_file_scan({1}, 1, 1, 1), _file_scan({2}, 1, 1, 1), _file_scan(stray, 5, 5, 5)]
    assert input_statistics(scans, [frozenset({1}), frozenset({2})], [(0,), (1,)]) == {}


def test_the_readers_answer_is_parsed_or_refused_whole():
    text = ("FileSourceScanExec\u001eSome(4)\u001e77\u001e\u001eSome(10)\u001dSome(2)\u001dSome(99)"
            "\u001fReusedExchangeExec\u001eSome(6)\u001e78\u001e77\u001d79\u001eNone\u001dNone\u001dNone"
            "\u001fLocalTableScanExec\u001eNone\u001e80\u001e\u001eSome(3)\u001dNone\u001dNone")
    assert parse_scans(text) == [
        Scan("FileSourceScanExec", frozenset({4}), {"numOutputRows": 10, "numFiles": 2, "filesSize": 99}, 77),
        Scan("ReusedExchangeExec", frozenset({6}), {}, 78, frozenset({77, 79})),
        Scan("LocalTableScanExec", frozenset(), {"numOutputRows": 3}, 80)]
    assert parse_scans("") == []
    assert parse_scans("FileSourceScanExec\u001eSome(4)\u001e77\u001e\u001eSome(1)\u001dSome(2)") is None
    assert parse_scans("FileSourceScanExec\u001e4\u001e77\u001e\u001eNone\u001dNone\u001dNone") is None
    assert parse_scans("FileSourceScanExec\u001eSome(4)") is None


# -- building the reader: a transient failure does not turn the facet off for good -------------
class _Reader:
    def apply(self, executed):
        return "FileSourceScanExec\u001eSome(4)\u001e77\u001e\u001eSome(10)\u001dSome(2)\u001dSome(99)"


def _builds(monkeypatch, outcomes: list) -> list:
    """``scans._Handles`` replaced by one whose build fails or succeeds as ``outcomes`` says
    (the fake of py4j's side); returns the builds made."""
    made: list = []

    class Handles:
        def __init__(self, gateway):
            pass

        def reader(self):
            made.append(1)
            if outcomes.pop(0):
                return _Reader()
            raise RuntimeError("py4j: connection reset")
    monkeypatch.setattr(scans, "_Handles", Handles)
    monkeypatch.setattr(scans, "_READERS", {})
    return made


def test_a_reader_that_failed_to_build_is_built_again_after_some_actions(monkeypatch):
    made = _builds(monkeypatch, [False, True])
    gateway = object()
    answers = [scans.read_scans(gateway, None) for _ in range(scans.RETRY_AFTER + 3)]
    assert answers[:scans.RETRY_AFTER + 1] == [None] * (scans.RETRY_AFTER + 1)
    assert answers[-1] == [Scan("FileSourceScanExec", frozenset({4}),
                                {"numOutputRows": 10, "numFiles": 2, "filesSize": 99}, 77)]
    assert len(made) == 2, "built once more, then kept"


def test_a_reader_that_never_builds_is_tried_a_bounded_number_of_times(monkeypatch):
    made = _builds(monkeypatch, [False] * 10)
    gateway = object()
    for _ in range(scans.RETRY_AFTER * (scans.BUILDS + 2)):
        assert scans.read_scans(gateway, None) is None
    assert len(made) == scans.BUILDS
