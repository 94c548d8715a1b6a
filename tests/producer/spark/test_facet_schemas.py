"""The custom facets the capture emits point, with ``_schemaURL``, at a JSON schema this
repository ships (``spec/facets/``), at the release the ``_producer`` URI names, and they
validate against it (a dead link was all a consumer had to read them by)."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from producer.events import PRODUCER_URI
from producer.spark.capture import CaptureSettings, engine_facets
from tests.support.spec import default_spec_dir

ROOT = Path(__file__).resolve().parents[3]


def test_spark_properties_points_at_a_shipped_schema_it_validates_against():
    facet = engine_facets(CaptureSettings(spark_version="4.0.0", captured_properties={
        "spark.master": "local[2]", "spark.app.name": "orders"}))["spark_properties"]
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
    validator = Draft202012Validator(schema, registry=registry)
    validator.validate({"spark_properties": facet})
    broken = {**facet, "properties": {"spark.master": 2}}
    assert list(validator.iter_errors({"spark_properties": broken})), "the schema checks the values"
