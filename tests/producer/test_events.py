"""The event builders: what the capture code and the job API rely on."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from producer import events
from producer.facet_urls import FACET_SCHEMA_URLS
from tests.support.spec import default_spec_dir, validator


def _facet_table_from_spec() -> dict[str, str]:
    out = {}
    for path in sorted((default_spec_dir() / "facets").glob("*.json")):
        doc = json.loads(path.read_text())
        for name, definition in doc["$defs"].items():
            refs = [part.get("$ref", "") for part in definition.get("allOf", [])]
            if any(r.startswith("https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/")
                   and r.endswith("Facet") for r in refs):
                out[name] = f"{doc['$id']}#/$defs/{name}"
    return out


def test_facet_url_table_matches_the_spec():
    expected = _facet_table_from_spec()
    assert FACET_SCHEMA_URLS == expected, (
        "producer/facet_urls.py is stale; replace FACET_SCHEMA_URLS with:\n"
        + json.dumps(expected, indent=4)
    )


def test_builders_produce_spec_valid_events_of_every_kind():
    v = validator()
    run_id = events.new_run_id()
    parent = events.parent_facet("airflow", "dag.task", events.new_run_id(),
                                 root=("airflow", "dag", events.new_run_id()))
    schema = events.facet("SchemaDatasetFacet", {"fields": [{"name": "id", "type": "bigint"}]})
    stats = events.facet("OutputStatisticsOutputDatasetFacet", {"rowCount": 10, "size": 1024})
    nominal = events.facet("NominalTimeRunFacet", {"nominalStartTime": events.utc_now_iso()})
    custom = events.custom_facet({"anything": [1, {"x": None}]}, schema_url="https://example.com/x.json")
    for event_type in sorted(events.EVENT_TYPES):
        v.validate(events.run_event(
            event_type, run_id=run_id, job_namespace="ns", job_name="job",
            inputs=[events.dataset("s3://bucket", "in", {"schema": schema})],
            outputs=[events.dataset("postgres://db:5432", "public.out", output_facets={"outputStatistics": stats})],
            run_facets={"parent": parent, "nominalTime": nominal, "custom": custom},
            job_facets={"jobType": events.facet("JobTypeJobFacet", {
                "processingType": "BATCH", "integration": "PYTHON", "jobType": "JOB"})},
        ))
    v.validate(events.dataset_event(events.dataset("s3://bucket", "in", {"schema": schema})))
    v.validate(events.job_event(job_namespace="ns", job_name="job",
                                outputs=[events.dataset("s3://bucket", "out")]))


def test_facet_carries_the_spec_schema_url_and_producer():
    got = events.facet("SchemaDatasetFacet", {"fields": []})
    assert got == {
        "fields": [],
        "_producer": events.PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-2-0/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet",
    }
    with pytest.raises(ValueError, match="unknown standard facet 'SchemaFacet'"):
        events.facet("SchemaFacet", {})


def test_run_ids_are_uuid7_and_strictly_increasing():
    ids = [events.new_run_id() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122 and str(parsed) == ids[0]
    # The first 48 bits are the creation time in milliseconds.
    millis = int(ids[0].replace("-", "")[:12], 16)
    assert abs(millis / 1000 - datetime.now(timezone.utc).timestamp()) < 60


def test_times_are_utc_microseconds_with_z():
    aware = datetime(2026, 11, 22, 11, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert events.iso(aware) == "2026-11-22T10:00:00.123456Z"
    assert events.iso(0) == "1970-01-01T00:00:00.000000Z"
    assert events.utc_now_iso().endswith("Z") and len(events.utc_now_iso()) == 27
    with pytest.raises(ValueError, match="no timezone"):
        events.iso(datetime(2026, 1, 1))


def test_builders_reject_what_users_get_wrong():
    with pytest.raises(ValueError, match="event_type"):
        events.run_event("DONE", run_id=events.new_run_id(), job_namespace="n", job_name="j")
    with pytest.raises(ValueError, match="run_id must be a UUID"):
        events.run_event("START", run_id="run-1", job_namespace="n", job_name="j")
    with pytest.raises(ValueError, match="schema_url"):
        events.custom_facet({}, schema_url="")


def test_parse_parent_id_keeps_slashes_in_the_job_name():
    run_id = events.new_run_id()
    assert events.parse_parent_id(f"airflow/dag/task/{run_id}") == ("airflow", "dag/task", run_id)
    with pytest.raises(ValueError):
        events.parse_parent_id("airflow/task")


@pytest.mark.parametrize("written", ["0190f1b26c1e7a319c553f1e2d4c5b6a", "{0190F1B2-6C1E-7A31-9C55-3F1E2D4C5B6A}",
                                     "urn:uuid:0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"])
def test_run_ids_are_emitted_in_canonical_form(written):
    canonical = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"
    event = events.run_event("START", run_id=written, job_namespace="ns", job_name="j",
                             run_facets={"parent": events.parent_facet("a", "b", written, root=("a", "r", written))})
    assert event["run"]["runId"] == canonical
    parent = event["run"]["facets"]["parent"]
    assert parent["run"]["runId"] == parent["root"]["run"]["runId"] == canonical
    assert events.parse_parent_id(f"airflow/dag.task/{written}")[2] == canonical


def test_event_time_must_carry_a_timezone_and_is_written_as_a_spec_date_time():
    """A timezone-less event_time (string or naive datetime) fails the spec's date-time: the
    builders refuse it (construction-time misuse); an aware one is written as iso() writes it."""
    v = validator()
    run_id = events.new_run_id()
    builders = (
        lambda t: events.run_event("START", run_id=run_id, job_namespace="n", job_name="j", event_time=t),
        lambda t: events.dataset_event(events.dataset("s3://b", "d"), event_time=t),
        lambda t: events.job_event(job_namespace="n", job_name="j", event_time=t),
    )
    for build in builders:
        for naive in ("2024-01-01T00:00:00", datetime(2024, 1, 1)):
            with pytest.raises(ValueError, match="no UTC offset|no timezone"):
                build(naive)
        for junk in ("yesterday", "", 1700000000):
            with pytest.raises(ValueError, match="event_time|ISO 8601"):
                build(junk)
        for aware, written in (
                ("2024-01-01T01:00:00+01:00", "2024-01-01T00:00:00.000000Z"),
                ("2024-01-01T00:00:00.5Z", "2024-01-01T00:00:00.500000Z"),
                (datetime(2024, 1, 1, tzinfo=timezone.utc), "2024-01-01T00:00:00.000000Z")):
            event = build(aware)
            assert event["eventTime"] == written
            v.validate(json.loads(json.dumps(event)))


def test_years_before_1000_are_zero_padded():
    early = datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    assert events.iso(early) == "0999-01-02T03:04:05.000006Z"
    event = events.run_event("START", run_id=events.new_run_id(), job_namespace="n", job_name="j", event_time=early)
    validator().validate(event)
