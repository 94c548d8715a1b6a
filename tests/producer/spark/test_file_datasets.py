"""File reads and writes are named as the official OpenLineage Spark integration names them,
so lineage from this capture and from the JVM integration joins on the same datasets:

* several files of one directory (a list of paths, or a glob that Spark expands into its
  matches) are one dataset, the directory; a single file read alone is that file;
* what it costs does not grow with the number of files read;
* a ``save()`` path is absolute and qualified like any other file write's, whatever the
  user typed (a relative path names nothing another job could find).
"""

from __future__ import annotations

import pytest

from producer.spark import disable_lineage, enable_lineage
from tests.producer.spark.support import Recorder, drain

pytestmark = pytest.mark.spark


@pytest.fixture
def captured(spark):
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="fd", app_name="fd")
    try:
        yield recorder
    finally:
        drain(spark)
        disable_lineage(spark)


def _files(directory, names):
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text("id,v\n1,a\n")
    return [str(directory / name) for name in names]


def _completed(spark, recorder: Recorder, action) -> dict:
    """The COMPLETE event of the one action ``action`` runs."""
    since = len(recorder.events)
    action()
    drain(spark)
    ends = [e for e in recorder.events[since:] if e["eventType"] == "COMPLETE" and e["job"]["name"] != "fd"]
    assert len(ends) == 1, [e["job"]["name"] for e in recorder.events[since:]]
    return ends[0]


def _names(datasets: list[dict]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_files_of_one_directory_are_one_dataset_the_directory(spark, tmp_path, captured):
    a, b = _files(tmp_path / "in", ["a.csv", "b.csv"])
    other = _files(tmp_path / "other", ["c.csv"])[0]
    out = str(tmp_path / "out")

    def write(paths):
        return lambda: spark.read.csv(paths, header=True).write.mode("overwrite").parquet(out)

    listed = _completed(spark, captured, write([a, b]))
    globbed = _completed(spark, captured, write(str(tmp_path / "in" / "*.csv")))
    with_dir = _completed(spark, captured, write([a, str(tmp_path / "in")]))
    two_dirs = _completed(spark, captured, write([a, b, other]))

    directory = ("file", str(tmp_path / "in"))
    assert _names(listed["inputs"]) == [directory]
    assert _names(globbed["inputs"]) == [directory]
    assert _names(with_dir["inputs"]) == [directory]
    assert _names(two_dirs["inputs"]) == [directory, ("file", str(tmp_path / "other"))]
    assert _names(listed["outputs"]) == [("file", out)]


def test_a_single_file_read_alone_is_named_by_the_file(spark, tmp_path, captured):
    # As in the official integration (its "single-file datasets" fix): two different files
    # of one directory, read by different jobs, are not one dataset.
    a = _files(tmp_path / "in", ["a.csv", "b.csv"])[0]
    done = _completed(spark, captured,
                      lambda: spark.read.csv(a, header=True).write.mode("overwrite").parquet(str(tmp_path / "out")))
    assert _names(done["inputs"]) == [("file", a)]


def test_naming_many_files_costs_no_more_py4j_calls_than_naming_two(spark, tmp_path, captured, py4j_calls):
    few = _files(tmp_path / "few", ["a.csv", "b.csv"])
    many = _files(tmp_path / "many", [f"f{i}.csv" for i in range(40)])
    costs = []
    # The first action of a session also builds the capture's readers (scans, job details):
    # a first write, not counted, leaves the comparison to what naming the files costs.
    for paths in (few, few, many):
        df = spark.read.csv(paths, header=True)
        drain(spark)
        py4j_calls.clear()
        done = _completed(spark, captured, lambda: df.write.mode("overwrite").parquet(str(tmp_path / "out")))
        costs.append(len(py4j_calls))
        assert len(done["inputs"]) == 1
    assert costs[2] == costs[1], costs


def test_a_save_path_is_named_absolute_and_qualified_like_other_file_writes(spark, tmp_path, captured):
    """A source that is not a file format (Delta, say) gets the path as typed; Spark's console
    sink takes the same route (a SaveIntoDataSourceCommand) and writes no files."""
    df = spark.createDataFrame([(1, "a")], "id INT, v STRING")
    working_dir = spark._jvm.java.lang.System.getProperty("user.dir")  # the JVM's, where Hadoop resolves

    relative = _completed(spark, captured, lambda: df.write.format("console").mode("append").save("out/t"))
    absolute = _completed(spark, captured,
                          lambda: df.write.format("console").mode("append").save(str(tmp_path / "t")))
    qualified = _completed(spark, captured,
                           lambda: df.write.format("console").mode("append").save(f"file:{tmp_path}/q"))

    assert _names(relative["outputs"]) == [("file", f"{working_dir}/out/t")]
    assert _names(absolute["outputs"]) == [("file", str(tmp_path / "t"))]
    assert _names(qualified["outputs"]) == [("file", f"{tmp_path}/q")]
    # A file format's save() was already qualified by Spark itself.
    parquet = _completed(spark, captured,
                         lambda: df.write.format("parquet").mode("overwrite").save(str(tmp_path / "p")))
    assert _names(parquet["outputs"]) == [("file", str(tmp_path / "p"))]


@pytest.fixture
def v2_file_sources(spark):
    """File reads through Spark's DataSourceV2 file tables (ParquetTable, CSVTable...): what
    ``spark.sql.sources.useV1SourceList`` without the formats gives (the session is shared)."""
    key = "spark.sql.sources.useV1SourceList"
    before = spark.conf.get(key)
    spark.conf.set(key, "")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def test_a_read_through_a_v2_file_source_is_named_as_through_v1(spark, tmp_path, captured, v2_file_sources):
    """Such a read was named ``spark_catalog`` / ``parquet file:/<path>`` (the table's
    name), so it never joined the write of the same files."""
    written = str(tmp_path / "in")
    spark.range(3).write.mode("overwrite").parquet(written)
    drain(spark)  # its own events before the reads
    a, b = _files(tmp_path / "csv", ["a.csv", "b.csv"])
    out = str(tmp_path / "out")
    parquet = _completed(spark, captured, lambda: spark.read.parquet(written).write.mode("overwrite").parquet(out))
    assert _names(parquet["inputs"]) == [("file", written)]
    csv = _completed(spark, captured, lambda: spark.read.csv([a, b], header=True).write.mode("overwrite").parquet(out))
    assert _names(csv["inputs"]) == [("file", str(tmp_path / "csv"))]


def test_a_read_of_several_directories_credits_each_with_the_columns_and_schema(spark, tmp_path, captured):
    """``spark.read.parquet(d1, d2)``: one leaf, two datasets. Both hold the columns read, so
    both are in each column's lineage and both get the schema facet (the first alone had
    them: the second looked unused)."""
    from tests.support.spec import validator

    df = spark.createDataFrame([(1, "x")], "id INT, name STRING")
    d1, d2, out = str(tmp_path / "d1"), str(tmp_path / "d2"), str(tmp_path / "out")
    df.write.parquet(d1)
    df.write.parquet(d2)
    drain(spark)
    done = _completed(spark, captured, lambda: spark.read.parquet(d1, d2).write.mode("overwrite").parquet(out))
    assert _names(done["inputs"]) == [("file", d1), ("file", d2)]
    for dataset in done["inputs"]:
        assert [f["name"] for f in dataset["facets"]["schema"]["fields"]] == ["id", "name"]
    fields = done["outputs"][0]["facets"]["columnLineage"]["fields"]
    for column in ("id", "name"):
        assert sorted((i["name"], i["field"]) for i in fields[column]["inputFields"]) == [(d1, column), (d2, column)]
    validator().validate(done)


def test_a_directory_named_with_a_hash_or_question_mark_keeps_its_name(spark, tmp_path, captured):
    """Hadoop paths have no fragment and no query: ``run#1`` was named ``run`` (and ``q?x=1``
    ``q``), another directory."""
    df = spark.createDataFrame([(1,)], "id INT")
    for name in ("run#1", "q?x=1"):
        path = str(tmp_path / name)
        done = _completed(spark, captured, lambda: df.write.mode("overwrite").parquet(path))
        assert _names(done["outputs"]) == [("file", path)]


def test_an_ignored_write_reports_no_lifecycle_change(spark, tmp_path, captured):
    """mode("ignore") on an existing path writes nothing: it was reported as a CREATE."""
    df = spark.createDataFrame([(1,)], "id INT")
    path = str(tmp_path / "e")
    df.write.parquet(path)
    drain(spark)
    done = _completed(spark, captured, lambda: df.write.mode("ignore").parquet(path))
    assert _names(done["outputs"]) == [("file", path)]
    assert "lifecycleStateChange" not in done["outputs"][0]["facets"]
