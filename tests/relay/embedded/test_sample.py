"""The sample stream is what the demo, the tests and the benchmarks feed the relay: it must
be valid OpenLineage, keyed like the official Kafka transports, reproducible, and its
injected faults (duplicates, terminal-before-START) must be exactly as many as asked."""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime

import orjson
import pytest

from relay.embedded.sample import (
    CUSTOM_RUN_FACET_SCHEMA_URL,
    DATASET_EVENT_SCHEMA_URL,
    JOB_EVENT_SCHEMA_URL,
    PRODUCER_URI,
    SCHEMA_URL,
    dataset_event,
    job_event,
    message_key,
    sample_stream,
    spark_run,
)
from tests.support.spec import facets_in, validator

START = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
TERMINAL = {"COMPLETE", "FAIL", "ABORT"}


def decoded(stream: list[tuple[bytes, bytes]]) -> list[tuple[str, dict]]:
    return [(key.decode(), orjson.loads(value)) for key, value in stream]


def positions_by_run(stream: list[tuple[bytes, bytes]]) -> dict[str, list[tuple[int, str]]]:
    """runId -> [(index in stream, eventType)] in stream order."""
    runs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for index, (_, event) in enumerate(decoded(stream)):
        runs[event["run"]["runId"]].append((index, event["eventType"]))
    return runs


@pytest.fixture(scope="module")
def stream() -> list[tuple[bytes, bytes]]:
    return sample_stream(60, seed=11)


# --- validity --------------------------------------------------------------------------


def test_every_event_in_a_stream_is_valid_openlineage(stream):
    faulty = sample_stream(40, seed=5, duplicate_ratio=0.2, out_of_order_ratio=0.2, running_per_run=(0, 4), columns=2)
    for _, event in decoded(stream) + decoded(faulty):
        validator().validate(event)


def test_spark_run_events_are_valid_in_every_variant():
    rng = random.Random(1)
    parent = ("airflow", "dag.task", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
    for fail in (False, True):
        for columns in (0, 1, 30):
            events = spark_run("spark", "app.cmd.t", start=START, rng=rng, columns=columns, fail=fail, parent=parent)
            for event in events:
                validator().validate(event)


def test_dataset_and_job_events_are_valid():
    for event in (
        dataset_event("s3://raw", "orders", event_time=START),
        job_event("spark", "app.job", event_time=START, inputs=[("s3://raw", "orders")], outputs=[("s3://wh", "o")]),
        job_event("spark", "app.job", event_time=START, sql="SELECT 1"),
    ):
        validator().validate(event)
    assert dataset_event("s3://raw", "orders", event_time=START)["schemaURL"] == DATASET_EVENT_SCHEMA_URL
    assert job_event("spark", "app.job", event_time=START)["schemaURL"] == JOB_EVENT_SCHEMA_URL


def test_every_facet_names_its_real_schema(stream):
    schemas = validator().facet_schemas
    seen = set()
    for _, event in decoded(stream):
        assert event["producer"] == PRODUCER_URI and event["schemaURL"] == SCHEMA_URL
        for path, site, name, facet in facets_in(event):
            expected = schemas.get((site, name), CUSTOM_RUN_FACET_SCHEMA_URL)
            assert (facet["_producer"], facet["_schemaURL"]) == (PRODUCER_URI, expected), path
            seen.add(name)
    assert {"processing_engine", "jobType", "schema", "dataSource", "columnLineage", "outputStatistics"} <= seen
    assert {"parent", "errorMessage", "spark_properties"} <= seen


# --- one Spark action ------------------------------------------------------------------


def test_spark_run_emits_start_running_then_terminal():
    events = spark_run("spark", "app.cmd.t", start=START, rng=random.Random(3), with_running=3)
    assert [e["eventType"] for e in events] == ["START", "RUNNING", "RUNNING", "RUNNING", "COMPLETE"]
    assert len({e["run"]["runId"] for e in events}) == 1
    assert uuid.UUID(events[0]["run"]["runId"]).version == 4
    times = [e["eventTime"] for e in events]
    assert times[0] == "2024-05-01T02:00:00.000Z"
    assert all(t.endswith("Z") for t in times) and times == sorted(set(times))  # strictly increasing
    assert events[0]["inputs"] and not events[0]["outputs"]
    (output,) = events[-1]["outputs"]
    assert {"schema", "dataSource", "columnLineage"} <= output["facets"].keys()
    assert output["outputFacets"]["outputStatistics"]["rowCount"] > 0


def test_spark_run_failure_and_options():
    rng = random.Random(4)
    events = spark_run("spark", "app.cmd.t", run_id="r", start=START, rng=rng, with_running=False, fail=True, columns=3)
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    assert events[-1]["run"]["facets"]["errorMessage"]["programmingLanguage"] == "JAVA"
    assert {e["run"]["runId"] for e in events} == {"r"}
    assert len(events[0]["inputs"][0]["facets"]["schema"]["fields"]) == 3
    assert len(spark_run("s", "j", start=START, rng=rng, with_running=True)) == 3


def test_spark_run_parent_is_on_every_event():
    parent = ("airflow", "dag.task", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
    root = ("airflow", "dag", "1a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
    events = spark_run("spark", "app.cmd.t", start=START, rng=random.Random(5), parent=parent, root=root)
    for event in events:
        facet = event["run"]["facets"]["parent"]
        assert facet["job"] == {"namespace": "airflow", "name": "dag.task"}
        assert facet["root"]["run"]["runId"] == root[2]
        assert message_key(event) == "run:airflow/dag"


def test_spark_run_is_deterministic_for_an_rng_state():
    def build(seed: int) -> list[dict]:
        return spark_run("spark", "app.cmd.t", start=START, rng=random.Random(seed), with_running=2)

    assert build(7) == build(7)
    assert build(7)[0]["run"]["runId"] != build(8)[0]["run"]["runId"]


# --- the stream ------------------------------------------------------------------------


def test_same_seed_same_bytes():
    args = {"duplicate_ratio": 0.2, "out_of_order_ratio": 0.3}
    assert sample_stream(30, seed=3, **args) == sample_stream(30, seed=3, **args)
    assert sample_stream(30, seed=3, **args) != sample_stream(30, seed=4, **args)


def test_keys_follow_the_openlineage_kafka_transport(stream):
    keys_per_run = defaultdict(set)
    with_parent = 0
    for key, event in decoded(stream):
        parent = event["run"]["facets"].get("parent")
        job = parent["root"]["job"] if parent else event["job"]
        assert key == f"run:{job['namespace']}/{job['name']}"
        keys_per_run[event["run"]["runId"]].add(key)
        with_parent += parent is not None
    assert with_parent > 0, "the stream should contain runs triggered by a parent"
    assert all(len(keys) == 1 for keys in keys_per_run.values()), "a run's events share one key"


def test_message_key_for_dataset_and_job_events():
    assert message_key(dataset_event("s3://raw", "orders", event_time=START)) == "dataset:s3://raw/orders"
    assert message_key(job_event("spark", "app.job", event_time=START)) == "job:spark/app.job"


def test_values_are_compact_json(stream):
    for _, value in stream:
        assert value == orjson.dumps(orjson.loads(value))


def test_runs_are_interleaved_in_order_without_faults(stream):
    assert len(set(stream)) == len(stream)
    runs = positions_by_run(stream)
    assert len(runs) == 60
    for positions in runs.values():
        types = [t for _, t in positions]
        assert types[0] == "START" and types[-1] in TERMINAL and set(types[1:-1]) <= {"RUNNING"}
    # Interleaved: some run starts before another run has finished.
    spans = sorted((p[0][0], p[-1][0]) for p in runs.values())
    assert any(later_start < end for (_, end), (later_start, _) in zip(spans, spans[1:]))


def test_running_per_run_bounds():
    runs = positions_by_run(sample_stream(40, seed=2, running_per_run=(2, 2)))
    assert all([t for _, t in p].count("RUNNING") == 2 for p in runs.values())


@pytest.mark.parametrize("ratio", [0.1, 0.25, 1.0])
def test_duplicates_are_exact_copies_a_few_records_later(ratio: float):
    clean = sample_stream(50, seed=9)
    noisy = sample_stream(50, seed=9, duplicate_ratio=ratio)
    counts = Counter(noisy)
    assert set(counts) == set(clean), "duplicates are byte-identical copies of real records"
    assert max(counts.values()) == 2
    assert len(noisy) - len(clean) == round(len(clean) * ratio)
    first_seen: dict[tuple[bytes, bytes], int] = {}
    originals = []  # stream positions of first occurrences
    for index, record in enumerate(noisy):
        if record in first_seen:
            between = sum(1 for p in originals if p > first_seen[record])
            assert between <= 4, f"copy of record {first_seen[record]} arrived {between} records later"
        else:
            first_seen[record] = index
            originals.append(index)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.0])
def test_out_of_order_puts_the_terminal_event_before_start(ratio: float):
    runs = positions_by_run(sample_stream(40, seed=13, out_of_order_ratio=ratio))
    overtaken = [
        run
        for run, positions in runs.items()
        if next(i for i, t in positions if t in TERMINAL) < next(i for i, t in positions if t == "START")
    ]
    assert len(overtaken) == round(40 * ratio)
    for run, positions in runs.items():
        non_terminal = [t for _, t in positions if t not in TERMINAL]
        assert non_terminal[0] == "START", "only the terminal event moves"


def test_out_of_order_and_duplicates_keep_every_event_valid():
    for _, event in decoded(sample_stream(10, seed=21, duplicate_ratio=0.5, out_of_order_ratio=0.5)):
        validator().validate(event)


@pytest.mark.parametrize(
    "kwargs",
    [{"duplicate_ratio": 1.5}, {"out_of_order_ratio": -0.1}, {"running_per_run": (3, 1)}],
)
def test_bad_knobs_are_rejected(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        sample_stream(5, seed=1, **kwargs)
