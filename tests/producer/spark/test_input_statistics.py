"""The ``inputStatistics`` facet of a batch action's inputs, on real PySpark: the rows, files
and bytes its scans read (after partition pruning), on COMPLETE only, each input its own,
in one py4j call per action (none without an input at rest); and the rules that leave the
facet out rather than guess (pure)."""

from __future__ import annotations

import glob
import os

import pytest

from producer.spark import disable_lineage, enable_lineage, jvm
from producer.spark.input_stats import input_statistics
from producer.spark.scans import Scan, parse_scans
from tests.producer.spark.support import Recorder, drain
from tests.support.spec import validator

APP = "input_stats_app"


def _files(directory) -> list[str]:
    return glob.glob(os.path.join(str(directory), "**", "part-*"), recursive=True)


def _stats(directory) -> dict:
    files = _files(directory)
    return {"fileCount": len(files), "size": sum(os.path.getsize(f) for f in files)}


def _run(spark, action) -> Recorder:
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name=APP)
    try:
        action()
        drain(spark)
    finally:
        disable_lineage(spark)
    checker = validator()
    for event in recorder.events:
        checker.validate(event)
    return recorder


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
def test_reading_what_the_scans_read_costs_one_py4j_call_per_action_and_none_without_an_input(
        spark, tmp_path, py4j_calls, monkeypatch):
    costs: list[int] = []
    original = jvm.read_scans

    def counted(*args):
        before = len(py4j_calls)
        try:
            return original(*args)
        finally:
            costs.append(len(py4j_calls) - before)
    monkeypatch.setattr(jvm, "read_scans", counted)
    src = tmp_path / "src"
    spark.range(5).write.parquet(str(src))

    def actions():
        for i in range(3):
            spark.read.parquet(str(src)).write.parquet(str(tmp_path / f"read{i}"))
        spark.range(3).write.parquet(str(tmp_path / "no_input"))
    recorder = _run(spark, actions)
    assert costs[1:] == [1, 1], f"the first builds the reader, kept: {costs}"
    assert len(costs) == 3, "an action that reads no data at rest does not ask"
    completes = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["job"]["name"] != APP]
    assert ["inputFacets" in d for e in completes for d in e["inputs"]] == [True, True, True]


# -- the rules, on plain data ------------------------------------------------------------------
def _file_scan(ids, rows, files, size, kind="FileSourceScanExec") -> Scan:
    return Scan(kind, frozenset(ids), {"numOutputRows": rows, "numFiles": files, "filesSize": size, "scanTime": 9})


def test_scans_are_matched_to_the_leaves_whose_attributes_they_output():
    scans = [_file_scan({1, 2}, 10, 2, 200), _file_scan({5}, 7, 1, 50), Scan("LocalTableScanExec", frozenset({9}))]
    stats = input_statistics(scans, [frozenset({1, 2, 3}), frozenset({5, 6}), frozenset()], [(0,), (1,), ()])
    assert stats == {0: {"rowCount": 10, "size": 200, "fileCount": 2}, 1: {"rowCount": 7, "size": 50, "fileCount": 1}}


def test_a_dataset_read_by_two_leaves_sums_them_and_a_reused_exchange_adds_nothing():
    leaves, datasets = [frozenset({1}), frozenset({2}), frozenset({3})], [(0,), (0,), (0,)]
    scans = [_file_scan({1}, 10, 2, 200), _file_scan({2}, 5, 1, 100), Scan("ReusedExchangeExec", frozenset({3}))]
    assert input_statistics(scans, leaves, datasets) == {0: {"rowCount": 15, "size": 300, "fileCount": 3}}


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
    text = ("FileSourceScanExec\u001e4\u001d5\u001enumFiles=2\u001dfilesSize=99"
            "\u001fReusedExchangeExec\u001e6\u001e")
    assert parse_scans(text) == [Scan("FileSourceScanExec", frozenset({4, 5}), {"numFiles": 2, "filesSize": 99}),
                                 Scan("ReusedExchangeExec", frozenset({6}), {})]
    assert parse_scans("") == []
    assert parse_scans("FileSourceScanExec\u001e4\u001enumFiles: 2") is None
    assert parse_scans("FileSourceScanExec\u001e4") is None
