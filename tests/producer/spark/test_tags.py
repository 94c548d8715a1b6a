"""``spark.openlineage.job.tags``, ``spark.openlineage.run.tags`` and
``spark.openlineage.job.owners.<type>``: read as the official Spark integration reads them
(its ArgumentParser's documented cases), put on every event of the application and its runs
as the ``tags`` job and run facets and the ``ownership`` job facet."""

from __future__ import annotations

import pytest

from producer.spark.capture import CaptureSettings, engine_facets, job_facets
from producer.spark.settings import SparkSettings
from producer.spark.tags import parse_tags


@pytest.mark.parametrize(("raw", "expected"), [
    # bare key, key:value, key:value:source, parts after the third ignored
    ("tag;key:value;k:v:s;this:will:get:skipped",
     [("tag", "true", "CONFIG"), ("key", "value", "CONFIG"), ("k", "v", "s"), ("this", "will", "get")]),
    ("otherTag;otherKey:otherValue", [("otherTag", "true", "CONFIG"), ("otherKey", "otherValue", "CONFIG")]),
    # escaped separators are literal
    ("escaped\\:key:escaped\\;value;other:notescaped:tag",
     [("escaped:key", "escaped;value", "CONFIG"), ("other", "notescaped", "tag")]),
    ("\\;startkey\\;:endvalue\\;", [(";startkey;", "endvalue;", "CONFIG")]),
    # no key: skipped; an empty value at the end counts as none
    ("a:;:b", [("a", "true", "CONFIG")]),
    (";;:; : ;", []),
    ("", []),
    (None, []),
    # blanks around parts (as written by hand in a spark-submit line)
    (" env : production ; team:data ", [("env", "production", "CONFIG"), ("team", "data", "CONFIG")]),
    # a backslash before anything else stays
    ("path:C\\dir", [("path", "C\\dir", "CONFIG")]),
])
def test_tags_are_read_as_the_official_integration_reads_them(raw, expected):
    assert list(parse_tags(raw)) == expected


def test_owners_are_one_per_type_key_and_a_blank_name_or_type_is_ignored():
    conf = {"spark.openlineage.job.owners.team": "MyTeam", "spark.openlineage.job.owners.person": "John Smith",
            "spark.openlineage.job.owners.empty": " ", "spark.openlineage.job.owners.": "nobody",
            "spark.openlineage.job.ownersX": "not an owner", "spark.app.name": "x"}
    assert SparkSettings(conf).owners() == (("person", "John Smith"), ("team", "MyTeam"))


def test_facets_carry_them_and_nothing_is_added_without_them():
    settings = CaptureSettings(job_tags=parse_tags("env:prod;pii"), run_tags=parse_tags("set:up:SERVICE"),
                               owners=(("team", "data"),))
    job = job_facets(settings, "SQL_JOB")
    assert [(t["key"], t["value"], t["source"]) for t in job["tags"]["tags"]] == [
        ("env", "prod", "CONFIG"), ("pii", "true", "CONFIG")]
    assert job["tags"]["_schemaURL"].endswith("TagsJobFacet.json#/$defs/TagsJobFacet")
    assert job["ownership"]["owners"] == [{"name": "data", "type": "team"}]
    assert job["ownership"]["_schemaURL"].endswith("OwnershipJobFacet.json#/$defs/OwnershipJobFacet")
    run = engine_facets(settings)
    assert run["tags"]["tags"] == [{"key": "set", "value": "up", "source": "SERVICE"}]
    assert run["tags"]["_schemaURL"].endswith("TagsRunFacet.json#/$defs/TagsRunFacet")
    plain = CaptureSettings()
    assert set(job_facets(plain, "SQL_JOB")) == {"jobType"} and "tags" not in engine_facets(plain)


@pytest.mark.spark
def test_every_event_of_the_application_and_its_runs_carries_the_configured_tags_and_owners(
        spark, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain
    from tests.support.spec import validator

    real = spark.sparkContext.getConf().getAll()
    monkeypatch.setattr(spark.sparkContext, "getConf", lambda: SimpleNamespace(getAll=lambda: [
        *real, ("spark.openlineage.job.tags", "spark;key:value"), ("spark.openlineage.run.tags", "run;set:up:SERVICE"),
        ("spark.openlineage.job.owners.team", "MyTeam"), ("spark.openlineage.job.owners.person", "John Smith")]))
    recorder = Recorder()
    lineage = enable_lineage(spark, producer=recorder, app_name="tagged")
    try:
        spark.range(4).selectExpr("id", "id * 2 AS doubled").write.parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
        lineage.end()
    kinds = {(e["job"]["name"] == "tagged", e["eventType"]) for e in recorder.events}
    assert {(True, "START"), (True, "COMPLETE"), (False, "START"), (False, "COMPLETE")} <= kinds
    v = validator()
    for event in recorder.events:
        v.validate(event)
        assert [(t["key"], t["value"], t["source"]) for t in event["job"]["facets"]["tags"]["tags"]] == [
            ("spark", "true", "CONFIG"), ("key", "value", "CONFIG")], event["eventType"]
        assert event["job"]["facets"]["ownership"]["owners"] == [
            {"name": "John Smith", "type": "person"}, {"name": "MyTeam", "type": "team"}]
        assert [(t["key"], t["value"], t["source"]) for t in event["run"]["facets"]["tags"]["tags"]] == [
            ("run", "true", "CONFIG"), ("set", "up", "SERVICE")]


@pytest.mark.parametrize(("raw", "expected"), [
    ("[env:prod;pii]", [("env", "prod", "CONFIG"), ("pii", "true", "CONFIG")]),   # a list, as the official
    ("env: ;team:data", [("team", "data", "CONFIG")]),   # a blank value skips the tag
    ("a::s;b:v", [("b", "v", "CONFIG")]),
    ("a:v: ;b:v", [("b", "v", "CONFIG")]),               # a blank source too
    ("a\\\\;b", [("a\\\\", "true", "CONFIG"), ("b", "true", "CONFIG")]),   # an escaped backslash escapes no ';'
])
def test_the_official_parsers_edge_cases(raw, expected):
    assert list(parse_tags(raw)) == expected


def test_the_newer_ownership_keys_win_over_owners():
    conf = {"spark.openlineage.job.ownership.team": "NewTeam", "spark.openlineage.job.owners.team": "Old",
            "spark.openlineage.job.owners.person": "Someone"}
    assert SparkSettings(conf).owners() == (("team", "NewTeam"),)
    assert SparkSettings({"spark.openlineage.job.owners.person": "Someone"}).owners() == (("person", "Someone"),)
