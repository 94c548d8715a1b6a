"""The custom facets the capture emits point, with ``_schemaURL``, at a JSON schema this
repository ships (``spec/facets/``), at the release the ``_producer`` URI names, and they
validate against it (a dead link was all a consumer had to read them by)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from producer.events import PRODUCER_URI
from producer.spark import details
from producer.spark.capture import CaptureSettings, engine_facets
from tests.support.spec import default_spec_dir

ROOT = Path(__file__).resolve().parents[3]


def _shipped_validator(facet: dict):
    """A validator of ``facet``'s ``_schemaURL``, which must name a schema in this repository, at
    the release its ``_producer`` names."""
    release = PRODUCER_URI.split("/tree/", 1)[1].split("/", 1)[0]
    prefix = f"https://raw.githubusercontent.com/lineage-relay/lineage-relay/{release}/"
    assert facet["_schemaURL"].startswith(prefix), facet["_schemaURL"]
    shipped = ROOT / facet["_schemaURL"].removeprefix(prefix)
    assert shipped.is_file(), f"{shipped} is not in the repository"
    schema = json.loads(shipped.read_text())
    assert schema["$id"] == facet["_schemaURL"]
    core = json.loads((default_spec_dir() / "OpenLineage.json").read_text())
    registry = Registry().with_resources([(core["$id"], Resource.from_contents(core)),
                                          (schema["$id"], Resource.from_contents(schema))])
    return Draft202012Validator(schema, registry=registry)


def test_spark_properties_points_at_a_shipped_schema_it_validates_against():
    facet = engine_facets(CaptureSettings(spark_version="4.0.0", captured_properties={
        "spark.master": "local[2]", "spark.app.name": "orders"}))["spark_properties"]
    validator = _shipped_validator(facet)
    validator.validate({"spark_properties": facet})
    broken = {**facet, "properties": {"spark.master": 2}}
    assert list(validator.iter_errors({"spark_properties": broken})), "the schema checks the values"


APPLICATION = {"master": "yarn", "appName": "orders_etl", "applicationId": "application_1700000000000_0042",
               "userName": "etl", "uiWebUrl": "http://10.0.0.5:4040", "spark.submit.deployMode": "cluster",
               "spark.driver.host": "10.0.0.5", "spark.yarn.historyServer.address": "history:18080"}


@pytest.mark.parametrize(("name", "facet", "broken"), [
    ("spark_applicationDetails", details.application_facet(APPLICATION), {"deployMode": "remote"}),
    ("spark_applicationDetails", details.application_facet({**APPLICATION, "uiWebUrl": None}), {"master": None}),
    ("spark_jobDetails", details.job_facet({"jobId": 7, "jobDescription": "nightly", "jobGroup": "etl"}),
     {"jobId": "7"}),
    ("spark_jobDetails", details.job_facet({"jobId": 0, "jobDescription": None, "jobGroup": None}),
     {"jobGroup": 3}),
])
def test_spark_details_point_at_shipped_schemas_they_validate_against(name, facet, broken):
    validator = _shipped_validator(facet)
    validator.validate({name: facet})
    assert list(validator.iter_errors({name: {**facet, **broken}})), "the schema checks the values"
