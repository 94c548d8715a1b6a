"""The offline OpenLineage validator: it accepts every official example and rejects broken
events with the JSON path of each problem, so other tests can trust "valid" from it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.spec import (
    OpenLineageValidator,
    SpecUnavailable,
    SpecViolation,
    default_spec_dir,
    format_checker,
    validator,
)

EXAMPLES_DIR = default_spec_dir() / "examples"
EXAMPLE_FILES = sorted(EXAMPLES_DIR.rglob("*.json"))
PRODUCER = "https://github.com/acme/pipelines/tree/v1"
RUN_ID = "3f5e7a2c-1b4d-4e8f-9a6b-0c2d4e6f8a1b"


def _facet(schema_url: str, **fields: Any) -> dict[str, Any]:
    return {"_producer": PRODUCER, "_schemaURL": schema_url, **fields}


def run_event() -> dict[str, Any]:
    """A valid RunEvent touching every facet place: run, job, dataset, input, output."""
    facets = "https://openlineage.io/spec/facets"
    return {
        "eventTime": "2024-05-01T10:00:00.123Z",
        "eventType": "COMPLETE",
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {
            "runId": RUN_ID,
            "facets": {
                "parent": _facet(
                    f"{facets}/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet",
                    run={"runId": "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"},
                    job={"namespace": "airflow", "name": "dag.task"},
                ),
                "custom_thing": _facet("https://example.com/custom.json", anything=[1, 2]),
            },
        },
        "job": {
            "namespace": "spark",
            "name": "app.job",
            "facets": {
                "jobType": _facet(f"{facets}/2-0-4/JobTypeJobFacet.json", processingType="BATCH", integration="SPARK")
            },
        },
        "inputs": [
            {
                "namespace": "s3://raw",
                "name": "orders",
                "facets": {
                    "schema": _facet(
                        f"{facets}/1-2-0/SchemaDatasetFacet.json",
                        fields=[{"name": "id", "type": "long"}, {"name": "amount", "type": "decimal"}],
                    )
                },
            }
        ],
        "outputs": [
            {
                "namespace": "s3://curated",
                "name": "orders_daily",
                "outputFacets": {
                    "outputStatistics": _facet(f"{facets}/1-0-2/OutputStatisticsOutputDatasetFacet.json", rowCount=10)
                },
            }
        ],
    }


def errors_of(event: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecViolation) as caught:
        validator().validate(event)
    assert caught.value.errors, "a SpecViolation lists its errors"
    assert all(error in str(caught.value) for error in caught.value.errors)
    return caught.value.errors


# --- the official examples ------------------------------------------------------------


def test_spec_folder_ships_examples():
    assert (EXAMPLES_DIR / "example_full_event.json").is_file(), f"spec examples missing under {EXAMPLES_DIR}"
    assert len(EXAMPLE_FILES) >= 40


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=str(p.relative_to(EXAMPLES_DIR))) for p in EXAMPLE_FILES]
    or [pytest.param(None, id="no-examples-found")],
)
def test_every_official_example_is_valid(path: Path | None):
    assert path is not None, f"no examples under {EXAMPLES_DIR}"
    doc = json.loads(path.read_text())
    if "eventTime" in doc:  # a whole event
        validator().validate(doc)
        return
    # A facet example: {facet name: facet}, in a folder named after its facet file.
    schema_file = f"/{path.parent.name}.json#"
    for name, facet in doc.items():
        sites = [site for (site, n), uri in validator().facet_schemas.items() if n == name and schema_file in uri]
        assert sites, f"{path.parent.name}.json does not define a facet named {name!r}"
        attempts = [validator().facet_errors(name, facet, site) for site in sites]
        assert [] in attempts, attempts
        validator().validate_facet(name, facet)


def test_the_base_event_is_valid():
    validator().validate(run_event())


# --- broken events are rejected, naming the path ---------------------------------------


def test_bad_run_id_is_not_a_uuid():
    event = run_event()
    event["run"]["runId"] = "run-42"
    assert errors_of(event) == ["$.run.runId: 'run-42' is not a 'uuid'"]


def test_missing_producer():
    event = run_event()
    del event["producer"]
    assert errors_of(event) == ["$: 'producer' is a required property"]


def test_bad_event_type():
    event = run_event()
    event["eventType"] = "FINISHED"
    (error,) = errors_of(event)
    assert error.startswith("$.eventType: 'FINISHED' is not one of")


@pytest.mark.parametrize(
    "when",
    ["2024-02-30T10:00:00Z", "2024-05-01 10:00:00Z", "2024-05-01T10:00:00", "2024-05-01T25:00:00Z", "yesterday"],
)
def test_bad_event_time(when: str):
    event = run_event()
    event["eventTime"] = when
    assert errors_of(event) == [f"$.eventTime: {when!r} is not a 'date-time'"]


def test_producer_must_be_a_uri():
    event = run_event()
    event["producer"] = "my laptop"
    assert errors_of(event) == ["$.producer: 'my laptop' is not a 'uri'"]


def test_custom_facet_missing_producer():
    event = run_event()
    del event["run"]["facets"]["custom_thing"]["_producer"]
    assert errors_of(event) == ["$.run.facets.custom_thing: '_producer' is a required property"]


def test_standard_facet_missing_producer_is_reported_once():
    event = run_event()
    del event["inputs"][0]["facets"]["schema"]["_producer"]
    assert errors_of(event) == ["$.inputs[0].facets.schema: '_producer' is a required property"]


def test_schema_facet_field_missing_name():
    event = run_event()
    del event["inputs"][0]["facets"]["schema"]["fields"][1]["name"]
    assert errors_of(event) == ["$.inputs[0].facets.schema.fields[1]: 'name' is a required property"]


def test_standard_facets_are_held_to_their_own_schema():
    event = run_event()
    del event["job"]["facets"]["jobType"]["processingType"]
    event["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] = "ten"
    event["run"]["facets"]["parent"]["run"]["runId"] = "nope"
    assert sorted(errors_of(event)) == [
        "$.job.facets.jobType: 'processingType' is a required property",
        "$.outputs[0].outputFacets.outputStatistics.rowCount: 'ten' is not of type 'integer'",
        "$.run.facets.parent.run.runId: 'nope' is not a 'uuid'",
    ]


def test_a_facet_name_is_only_standard_where_the_spec_puts_it():
    # "outputStatistics" is an output facet; as a run facet it is a custom facet (BaseFacet only).
    event = run_event()
    event["run"]["facets"]["outputStatistics"] = {"_producer": PRODUCER, "_schemaURL": PRODUCER, "rowCount": "x"}
    validator().validate(event)


def test_every_error_is_listed():
    event = run_event()
    event["run"]["runId"] = "x"
    event["eventTime"] = "later"
    del event["job"]["name"]
    assert sorted(errors_of(event)) == [
        "$.eventTime: 'later' is not a 'date-time'",
        "$.job: 'name' is a required property",
        "$.run.runId: 'x' is not a 'uuid'",
    ]


def test_a_broken_run_event_is_explained_as_a_run_event():
    # With this many problems a RunEvent "fails less" as a DatasetEvent; the report must
    # still be about the RunEvent it obviously is, not "'dataset' is a required property".
    event = run_event()
    event["run"]["runId"] = "x"
    event["eventType"] = "DONE"
    del event["job"]["namespace"]
    assert sorted(errors_of(event)) == [
        "$.eventType: 'DONE' is not one of ['START', 'RUNNING', 'COMPLETE', 'ABORT', 'FAIL', 'OTHER']",
        "$.job: 'namespace' is a required property",
        "$.run.runId: 'x' is not a 'uuid'",
    ]


def test_dataset_and_job_events():
    dataset_event = {
        "eventTime": "2024-05-01T10:00:00+02:00",
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent",
        "dataset": copy.deepcopy(run_event()["inputs"][0]),
    }
    validator().validate(dataset_event)
    dataset_event["dataset"]["facets"]["schema"]["fields"] = [{"type": "long"}]
    assert errors_of(dataset_event) == ["$.dataset.facets.schema.fields[0]: 'name' is a required property"]

    job_event = {key: value for key, value in run_event().items() if key not in ("run", "eventType")}
    validator().validate(job_event)
    job_event["job"]["facets"]["jobType"]["integration"] = 7
    assert errors_of(job_event) == ["$.job.facets.jobType.integration: 7 is not of type 'string'"]


def test_an_event_must_be_exactly_one_kind():
    # job + dataset and no run: a valid JobEvent and a valid DatasetEvent at once.
    event = {key: value for key, value in run_event().items() if key != "run"}
    event["dataset"] = {"namespace": "s3://raw", "name": "orders"}
    (error,) = errors_of(event)
    assert error.startswith("$: ") and "is valid under each of" in error


def test_validate_facet_on_its_own():
    schema = {"_producer": PRODUCER, "_schemaURL": PRODUCER, "fields": [{"name": "id"}, {"type": "int"}]}
    with pytest.raises(SpecViolation) as caught:
        validator().validate_facet("schema", schema)
    assert caught.value.errors == ["$.schema.fields[1]: 'name' is a required property"]
    # Unknown names are custom facets: only BaseFacet applies.
    validator().validate_facet("myCompany_quality", {"_producer": PRODUCER, "_schemaURL": PRODUCER, "x": 1})
    assert validator().facet_errors("myCompany_quality", {"_producer": PRODUCER}) == [
        "$.myCompany_quality: '_schemaURL' is a required property"
    ]


# --- how the validator is built ----------------------------------------------------------


def test_facet_map_is_derived_from_every_facet_file():
    schemas = validator().facet_schemas
    files = {json.loads(p.read_text())["$id"] for p in (default_spec_dir() / "facets").glob("*.json")}
    assert {uri.partition("#")[0] for uri in schemas.values()} == files
    assert schemas[("dataset", "schema")].endswith("SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet")
    assert schemas[("run", "processing_engine")].endswith("#/$defs/ProcessingEngineRunFacet")
    # One name, different facets depending on where it sits.
    assert schemas[("input", "subset")].endswith("#/$defs/InputSubsetInputDatasetFacet")
    assert schemas[("output", "subset")].endswith("#/$defs/OutputSubsetOutputDatasetFacet")
    assert schemas[("job", "ownership")] != schemas[("dataset", "ownership")]


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("uuid", ["3f5e7a2c-1b4d-4e8f-9a6b-0c2d4e6f8a1b", "3F5E7A2C-1B4D-4E8F-9A6B-0C2D4E6F8A1B"],
         ["3f5e7a2c1b4d4e8f9a6b0c2d4e6f8a1b", "{3f5e7a2c-1b4d-4e8f-9a6b-0c2d4e6f8a1b}", "3f5e7a2c-1b4d-4e8f-9a6b",
          "3f5e7a2c-1b4d-4e8f-9a6b-0c2d-4e6f8a1b"]),  # jsonschema's own uuid check accepts the last one
        ("date-time", ["2024-05-01T10:00:00Z", "2024-05-01T10:00:00.123456+05:30", "2016-12-31T23:59:60Z"],
         ["2024-05-01", "2024-13-01T10:00:00Z", "2024-05-01T10:00:00+2400", "２０２４-05-01T10:00:00Z"]),
        ("uri", ["https://openlineage.io/spec/x.json#/$defs/A", "s3://bucket/key", "urn:isbn:0451450523", "http://123"],
         ["no scheme", "/relative/path", "http://a b", "http://x/%zz", "https://a#b#c"]),
    ],
)
def test_formats_are_checked(fmt: str, good: list[str], bad: list[str]):
    checker = format_checker()
    assert [value for value in good if not checker.conforms(value, fmt)] == []
    assert [value for value in bad if checker.conforms(value, fmt)] == []


def test_missing_spec_folder_is_an_error_not_a_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENLINEAGE_SPEC_DIR", str(tmp_path / "nowhere"))
    assert default_spec_dir() == tmp_path / "nowhere"
    with pytest.raises(SpecUnavailable, match="OPENLINEAGE_SPEC_DIR"):
        OpenLineageValidator()


def test_the_repository_carries_its_own_copy_of_the_spec_and_it_is_the_teams():
    """A clone on its own (no ``../shared``) validates against ``tests/spec/openlineage-spec``;
    where the team's copy exists, both hold the same files, byte for byte (refresh the
    repository's from it when this fails)."""
    own = Path(__file__).resolve().parents[1] / "spec" / "openlineage-spec"
    example = json.loads((own / "examples" / "example_full_event.json").read_text())
    OpenLineageValidator(spec_dir=own).validate(example)
    shared = Path(__file__).resolve().parents[3] / "shared" / "openlineage-spec"
    if shared.is_dir():
        files = {p.relative_to(shared): p.read_bytes() for p in shared.rglob("*") if p.is_file()}
        copied = {p.relative_to(own): p.read_bytes() for p in own.rglob("*") if p.is_file()}
        assert files.keys() == copied.keys() and files == copied, \
            f"tests/spec/openlineage-spec differs from {shared}: copy it again"


def test_an_event_is_an_object():
    assert validator().errors([]) == ["$: an OpenLineage event is a JSON object, not list"]
