"""decode_record and facets: every facets object the spec defines holds facet objects.

The spec's RunFacets, JobFacets, DatasetFacets, InputDatasetFacets and OutputDatasetFacets
are objects whose values are facets (objects). An event breaking that is refused at decode,
as the spec and a collector such as Marquez would refuse it later (by then from run state).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from relay.events import LineageEvent, Rejection
from relay.stages.decode import decode_record
from relay.stages.event_checks import WRONG_TYPE
from tests.support.spec import SpecViolation, validator

RUN_ID = "f69a6e9b-9bac-3c9a-9cf6-eacb70ecc9a9"
FACET = {"_producer": "https://example.com/producer", "_schemaURL": "https://example.com/Custom.json#/$defs/Custom"}


def dataset(name: str, own: str | None = None) -> dict:
    item = {"namespace": "s3://lake", "name": name, "facets": {"custom": dict(FACET)}}
    if own is not None:
        item[own] = {"custom": dict(FACET)}
    return item


def run_event() -> dict:
    return {
        "eventTime": "2024-05-01T10:15:30Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "eventType": "START",
        "run": {"runId": RUN_ID, "facets": {"custom": dict(FACET)}},
        "job": {"namespace": "spark-prod", "name": "etl", "facets": {"custom": dict(FACET)}},
        "inputs": [dataset("raw", "inputFacets")],
        "outputs": [dataset("clean", "outputFacets")],
    }


def job_event() -> dict:
    doc = run_event()
    del doc["run"], doc["eventType"]
    doc["schemaURL"] = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/JobEvent"
    return doc


def dataset_event() -> dict:
    return {
        "eventTime": "2024-05-01T10:15:30Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetEvent",
        "dataset": {"namespace": "s3://lake", "name": "raw", "facets": {"custom": dict(FACET)}},
    }


# (event, where its facets object is, how the detail names it): every place the spec has one.
SITES = [
    (run_event, ("run", "facets"), "run.facets"),
    (run_event, ("job", "facets"), "job.facets"),
    (run_event, ("inputs", 0, "facets"), "inputs[0].facets"),
    (run_event, ("inputs", 0, "inputFacets"), "inputs[0].inputFacets"),
    (run_event, ("outputs", 0, "facets"), "outputs[0].facets"),
    (run_event, ("outputs", 0, "outputFacets"), "outputs[0].outputFacets"),
    (job_event, ("job", "facets"), "job.facets"),
    (job_event, ("inputs", 0, "inputFacets"), "inputs[0].inputFacets"),
    (job_event, ("outputs", 0, "outputFacets"), "outputs[0].outputFacets"),
    (dataset_event, ("dataset", "facets"), "dataset.facets"),
]
SITE_IDS = [f"{make.__name__}:{path}" for make, _, path in SITES]
NOT_OBJECTS = [("a string", "a string"), (7, "a number"), (["x"], "an array"), (None, "null"), (True, "a boolean")]


def with_value(doc: dict, where: tuple[Any, ...], value: Any) -> dict:
    doc = copy.deepcopy(doc)
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    return doc


def decode(doc: dict) -> LineageEvent | Rejection:
    return decode_record(orjson.dumps(doc), max_bytes=1 << 20)


@pytest.mark.parametrize("make, where, path", SITES, ids=SITE_IDS)
def test_the_valid_events_pass_the_spec_and_decode(make, where, path) -> None:
    doc = make()
    validator().validate(doc)
    assert isinstance(decode(doc), LineageEvent)


@pytest.mark.parametrize("value, named", NOT_OBJECTS, ids=[n for _, n in NOT_OBJECTS])
@pytest.mark.parametrize("make, where, path", SITES, ids=SITE_IDS)
def test_a_facet_that_is_not_an_object_is_refused_naming_it(make, where, path, value, named) -> None:
    facets = {"custom": dict(FACET), "bad": value}
    doc = with_value(make(), where, facets)
    with pytest.raises(SpecViolation):
        validator().validate(doc)
    rejection = decode(doc)
    assert isinstance(rejection, Rejection)
    assert rejection.reason == WRONG_TYPE
    assert rejection.detail == f"`{path}.bad` must be an object (a facet), got {named}"


@pytest.mark.parametrize("value, named", NOT_OBJECTS[:4], ids=[n for _, n in NOT_OBJECTS[:4]])
@pytest.mark.parametrize("make, where, path", SITES, ids=SITE_IDS)
def test_a_facets_object_that_is_not_an_object_is_refused(make, where, path, value, named) -> None:
    doc = with_value(make(), where, value)
    with pytest.raises(SpecViolation):
        validator().validate(doc)
    rejection = decode(doc)
    assert isinstance(rejection, Rejection)
    assert (rejection.reason, rejection.detail) == (WRONG_TYPE, f"`{path}` must be an object, got {named}")


def test_facet_contents_are_left_to_the_collectors() -> None:
    # An object is all decode asks of a facet: an empty one, or one without the envelope
    # the spec requires, goes through for the collector to judge.
    doc = with_value(run_event(), ("run", "facets"), {"empty": {}, "bare": {"anything": [1, None]}})
    assert isinstance(decode(doc), LineageEvent)


def test_a_long_facet_name_is_cut_in_the_detail() -> None:
    name = "n" * 500
    rejection = decode(with_value(run_event(), ("run", "facets"), {name: 1}))
    assert rejection.reason == WRONG_TYPE
    assert len(rejection.detail) < 150 and "nnn..." in rejection.detail


def test_the_first_offending_facet_is_named() -> None:
    rejection = decode(with_value(run_event(), ("job", "facets"), {"ok": dict(FACET), "first": 1, "second": "x"}))
    assert rejection.detail == "`job.facets.first` must be an object (a facet), got a number"
