"""``spark.openlineage.columnLineage.datasetLineageEnabled``: where whole-dataset column
dependencies go in the columnLineage facet (pure: a traced result rendered both ways)."""

from __future__ import annotations

import pytest

from producer.errors import ConfigError
from producer.spark import columns
from producer.spark.columns import ColumnLineageResult

DATASETS = [("file", "/lake/orders"), ("file", "/lake/customers")]


def _result() -> ColumnLineageResult:
    """orders JOIN customers ON customer_id WHERE status = ..., writing (order_id, name, n)."""
    return ColumnLineageResult(
        columns=[("order_id", {((0, "id"), "DIRECT", "IDENTITY", False)}),
                 ("name", {((1, "name"), "DIRECT", "IDENTITY", False),
                           ((0, "status"), "INDIRECT", "CONDITIONAL", False)}),
                 ("n", set())],
        dataset={((0, "customer_id"), "JOIN"), ((1, "customer_id"), "JOIN"), ((0, "status"), "FILTER")})


def _entries(field: dict) -> list[tuple[str, str, list[str]]]:
    return [(f["name"], f["field"], [t["subtype"] for t in f["transformations"]]) for f in field["inputFields"]]


def test_by_default_whole_dataset_dependencies_go_in_the_dataset_member():
    fields, dataset = columns.facet_fields(_result(), DATASETS)
    assert _entries(fields["order_id"]) == [("/lake/orders", "id", ["IDENTITY"])]
    assert _entries(fields["name"]) == [("/lake/orders", "status", ["CONDITIONAL"]),
                                        ("/lake/customers", "name", ["IDENTITY"])]
    assert "n" not in fields
    assert [(d["name"], d["field"], [t["subtype"] for t in d["transformations"]]) for d in dataset] == [
        ("/lake/orders", "customer_id", ["JOIN"]), ("/lake/orders", "status", ["FILTER"]),
        ("/lake/customers", "customer_id", ["JOIN"])]


def test_disabled_they_go_into_every_output_field_and_the_dataset_member_is_empty():
    fields, dataset = columns.facet_fields(_result(), DATASETS, dataset_lineage=False)
    assert dataset == []
    join_filter = [("/lake/orders", "customer_id", ["JOIN"]), ("/lake/orders", "status", ["FILTER"]),
                   ("/lake/customers", "customer_id", ["JOIN"])]
    assert sorted(_entries(fields["order_id"])) == sorted([("/lake/orders", "id", ["IDENTITY"])] + join_filter)
    # A field's own INDIRECT dependency on the same column keeps its place beside the copied one.
    assert sorted(_entries(fields["name"])) == sorted(
        [("/lake/customers", "name", ["IDENTITY"]), ("/lake/orders", "status", ["CONDITIONAL", "FILTER"])]
        + [e for e in join_filter if e[1] != "status"])
    # A column computed from nothing (count(*)) gets none, as in the official integration.
    assert "n" not in fields
    for field in fields.values():
        for entry in field["inputFields"]:
            for t in entry["transformations"]:
                assert t["type"] in ("DIRECT", "INDIRECT") and t["masking"] is False


def test_the_setting_is_read_from_spark_conf_and_a_bad_value_is_refused():
    from producer.spark.settings import SparkSettings

    key = "spark.openlineage.columnLineage.datasetLineageEnabled"
    assert SparkSettings({}).flag("columnLineage.datasetLineageEnabled", True) is True
    assert SparkSettings({key: "FALSE"}).flag("columnLineage.datasetLineageEnabled", True) is False
    with pytest.raises(ConfigError, match=f"^{key}: expected true or false, got 'no' fix: set it to true or false"):
        SparkSettings({key: "no"}).flag("columnLineage.datasetLineageEnabled", True)


@pytest.mark.spark
@pytest.mark.parametrize("enabled", ["true", "false"])
def test_a_join_and_filter_write_renders_them_where_the_spark_conf_says(spark, tmp_path, monkeypatch, enabled):
    from types import SimpleNamespace

    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain

    orders, customers = str(tmp_path / "orders"), str(tmp_path / "customers")
    spark.range(6).selectExpr("id", "id % 3 AS cust", "id * 10 AS amount").write.parquet(orders)
    spark.range(3).selectExpr("id AS cust", "concat('c', id) AS name").write.parquet(customers)
    real = spark.sparkContext.getConf().getAll()
    monkeypatch.setattr(spark.sparkContext, "getConf", lambda: SimpleNamespace(
        getAll=lambda: [*real, ("spark.openlineage.columnLineage.datasetLineageEnabled", enabled)]))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name="dl")
    try:
        o, c = spark.read.parquet(orders), spark.read.parquet(customers)
        o.join(c, "cust").where("amount > 0").select("id", "name").write.parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
    [complete] = [e for e in recorder.events if e["eventType"] == "COMPLETE" and e["job"]["name"] != "dl"]
    [output] = complete["outputs"]
    facet = output["facets"]["columnLineage"]

    def subtypes(entries):
        return sorted((e["name"].rsplit("/", 1)[-1], e["field"], t["subtype"])
                      for e in entries for t in e["transformations"] if t["type"] == "INDIRECT")

    join_filter = [("customers", "cust", "JOIN"), ("orders", "amount", "FILTER"), ("orders", "cust", "JOIN")]
    if enabled == "true":
        assert subtypes(facet["dataset"]) == join_filter
        assert all(subtypes(f["inputFields"]) == [] for f in facet["fields"].values())
    else:
        assert not facet.get("dataset")
        assert set(facet["fields"]) == {"id", "name"}
        assert all(subtypes(f["inputFields"]) == join_filter for f in facet["fields"].values())
