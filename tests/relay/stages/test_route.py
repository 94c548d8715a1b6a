"""Router: which events a collector receives, from its include/exclude rules."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import orjson
import pytest
from pydantic import ValidationError

from relay.embedded.sample import dataset_event, job_event, spark_run
from relay.events import LineageEvent
from relay.stages.decode import decode_record
from relay.stages.route import NOT_ROUTED, UNSUPPORTED_EVENT_KIND, RouteConfig, Router, compile_glob, glob_problem

START = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)


def decoded(doc: dict) -> LineageEvent:
    event = decode_record(orjson.dumps(doc), max_bytes=1 << 24)
    assert isinstance(event, LineageEvent), event
    return event


def run_events(namespace: str = "spark-prod", name: str = "orders_etl.insert.orders_daily") -> dict[str, LineageEvent]:
    """START (inputs from s3://acme-lake-raw, no outputs), RUNNING, COMPLETE (output in
    s3://acme-warehouse) of one Spark run, by event type."""
    docs = spark_run(namespace, name, start=START, rng=random.Random(7))
    return {doc["eventType"]: decoded(doc) for doc in docs}


def router(**config: object) -> Router:
    return Router(RouteConfig.model_validate(config))


def test_no_rules_routes_everything() -> None:
    r = router()
    assert r.routes_everything
    for event in run_events().values():
        assert r.accepts(event) is None
    assert r.accepts(decoded(dataset_event("s3://x", "t", event_time=START))) is None


def test_job_namespace_glob_is_case_sensitive() -> None:
    r = router(include=[{"job_namespace": "spark-*"}])
    assert not r.routes_everything
    assert r.accepts(run_events("spark-prod")["START"]) is None
    assert r.accepts(run_events("spark-analytics")["COMPLETE"]) is None
    assert r.accepts(run_events("airflow-prod")["START"]) == NOT_ROUTED
    assert r.accepts(run_events("Spark-prod")["START"]) == NOT_ROUTED


def test_exact_pattern_and_job_name_glob() -> None:
    r = router(include=[{"job_namespace": "spark-prod", "job_name": "billing_*.*"}])
    assert r.accepts(run_events("spark-prod", "billing_daily.insert.payments")["START"]) is None
    # Both fields must match.
    assert r.accepts(run_events("spark-prod", "orders_etl.insert.orders")["START"]) == NOT_ROUTED
    assert r.accepts(run_events("spark-prod-2", "billing_daily.insert.payments")["START"]) == NOT_ROUTED


def test_an_exact_pattern_holding_brackets_matches_itself() -> None:
    """An IPv6 host in a namespace (postgres://[fd00::1]:5432, per the naming spec) is text,
    not a character class; a glob still reads [[] as a literal [."""
    ipv6 = "postgres://[fd00::1]:5432"
    event = decoded(dataset_event(ipv6, "public.t", event_time=START))
    assert router(include=[{"dataset_namespace": ipv6}]).accepts(event) is None
    assert router(include=[{"dataset_namespace": "postgres://[[]fd00::1]:*"}]).accepts(event) is None
    assert router(include=[{"dataset_namespace": "postgres://[fd00::2]:5432"}]).accepts(event) == NOT_ROUTED
    assert router(include=[{"kinds": ["run"], "job_namespace": "spark-[pd]*"}]).accepts(
        run_events("spark-prod")["START"]) is None  # a class is still a class


def test_a_bracketed_ipv6_host_is_text_and_any_other_bracket_is_a_class() -> None:
    """One meaning per pattern, never both: brackets holding an IPv6 host (hex digits,
    ``.`` and two or more ``:``) are text (a pattern without ``*``/``?`` compares exactly;
    with them it is refused, see glob_problem); any other bracket is an fnmatch class."""
    exact = compile_glob("postgres://[fd00::1]:5432")
    assert exact("postgres://[fd00::1]:5432")
    assert not any(exact(v) for v in ("postgres://f:5432", "postgres://1:5432", "postgres://::5432"))
    cls = compile_glob("db[12]")
    assert cls("db1") and cls("db2") and not cls("db[12]") and not cls("db3")
    assert compile_glob("hdfs://nn[12]:8020")("hdfs://nn1:8020")
    negated = compile_glob("*[!:]*")
    assert negated("abc") and not negated(":")
    assert compile_glob("[[]fd00::1]:*")("[fd00::1]:5432")


@pytest.mark.parametrize("pattern", ["*[!:]*", "hdfs://nn[12]:8020/*", "s3://bucket-[0-9]*", "[[]fd00::1]:*",
                                     "postgres://[fd00::1]:5432", "x[a:b]*"])
def test_globs_with_a_class_that_is_no_ipv6_host_are_accepted(pattern: str) -> None:
    assert glob_problem(pattern) is None


@pytest.mark.parametrize("pattern", ["postgres://[fd00::1]:*", "postgres://[::1]:54?2", "*[2001:db8::a]*",
                                     "postgres://[fd00::1]:543[12]", "[fd00::1]/db[!x]"])
def test_a_glob_around_an_ipv6_host_is_refused_with_the_literal_fix(pattern: str) -> None:
    problem = glob_problem(pattern)
    assert problem is not None and "[[]" + pattern[pattern.index("[") + 1:pattern.index("]") + 1] in problem


def test_dataset_namespace_matches_any_input_or_output() -> None:
    events = run_events()
    raw = router(include=[{"dataset_namespace": "s3://acme-lake-*"}])
    # Every event of the run reads the raw bucket.
    assert all(raw.accepts(e) is None for e in events.values())
    warehouse = router(include=[{"dataset_namespace": "s3://acme-warehouse"}])
    # Only the COMPLETE event has the output.
    assert warehouse.accepts(events["COMPLETE"]) is None
    assert warehouse.accepts(events["START"]) == NOT_ROUTED
    assert warehouse.accepts(events["RUNNING"]) == NOT_ROUTED
    nowhere = router(include=[{"dataset_namespace": "postgres://*"}])
    assert all(nowhere.accepts(e) == NOT_ROUTED for e in events.values())


def test_event_types() -> None:
    r = router(include=[{"event_types": ["complete", "FAIL"]}])  # case-insensitive in config
    events = run_events()
    assert r.accepts(events["COMPLETE"]) is None
    assert r.accepts(events["START"]) == NOT_ROUTED
    assert r.accepts(events["RUNNING"]) == NOT_ROUTED
    # A DatasetEvent has no eventType, so an event_types rule never matches it.
    assert r.accepts(decoded(dataset_event("s3://x", "t", event_time=START))) == NOT_ROUTED


def test_include_then_exclude() -> None:
    r = router(
        include=[{"job_namespace": "spark-*"}, {"dataset_namespace": "s3://acme-warehouse"}],
        exclude=[{"job_name": "*.tmp_*"}, {"job_namespace": "spark-analytics", "event_types": ["RUNNING"]}],
    )
    assert r.accepts(run_events("spark-prod", "app.insert.orders")["START"]) is None
    # Excluded by name even though included by namespace.
    assert r.accepts(run_events("spark-prod", "app.insert.tmp_orders")["START"]) == NOT_ROUTED
    # Included by the second rule (output dataset) only on COMPLETE.
    other = run_events("flink-prod", "app.insert.orders")
    assert r.accepts(other["COMPLETE"]) is None
    assert r.accepts(other["START"]) == NOT_ROUTED
    # The second exclude needs both its fields.
    analytics = run_events("spark-analytics", "app.insert.orders")
    assert r.accepts(analytics["RUNNING"]) == NOT_ROUTED
    assert r.accepts(analytics["COMPLETE"]) is None


def test_exclude_only_routes_the_rest() -> None:
    r = router(exclude=[{"dataset_namespace": "s3://acme-lake-raw"}])
    assert r.accepts(run_events()["START"]) == NOT_ROUTED
    assert r.accepts(decoded(dataset_event("s3://acme-warehouse", "t", event_time=START))) is None


def test_dataset_event_routing() -> None:
    ds_event = decoded(dataset_event("s3://acme-warehouse", "warehouse/orders", event_time=START))
    by_dataset = router(include=[{"dataset_namespace": "s3://acme-*"}])
    assert by_dataset.accepts(ds_event) is None
    # A DatasetEvent has no job: a job rule does not match it.
    by_job = router(include=[{"job_namespace": "*"}])
    assert by_job.accepts(ds_event) == NOT_ROUTED
    assert by_job.accepts(run_events()["START"]) is None
    # kinds selects event kinds.
    no_dataset_events = router(exclude=[{"kinds": ["dataset"]}])
    assert no_dataset_events.accepts(ds_event) == NOT_ROUTED
    assert no_dataset_events.accepts(run_events()["START"]) is None


def test_job_event_routing() -> None:
    doc = job_event("airflow-prod", "dag.task", event_time=START, inputs=[("postgres://db:5432", "public.t")])
    event = decoded(doc)
    assert router(include=[{"dataset_namespace": "postgres://*"}]).accepts(event) is None
    assert router(include=[{"job_namespace": "airflow-*", "kinds": ["job"]}]).accepts(event) is None
    assert router(include=[{"kinds": ["run"]}]).accepts(event) == NOT_ROUTED


def test_works_from_the_body_when_doc_was_dropped() -> None:
    complete = run_events()["COMPLETE"]
    complete.doc = None  # what the relay does on the hot path
    assert router(include=[{"dataset_namespace": "s3://acme-warehouse"}]).accepts(complete) is None
    assert router(exclude=[{"dataset_namespace": "s3://acme-warehouse"}]).accepts(complete) == NOT_ROUTED


def test_body_is_not_parsed_unless_a_dataset_rule_needs_it() -> None:
    event = run_events()["START"]
    event.doc = None
    event.body = b"not json: parsing it would find no datasets"
    # Decided on the job fields alone: the body is never read.
    assert router(include=[{"job_namespace": "spark-*"}]).accepts(event) is None
    # The dataset rule is reached only when the rule's other fields match.
    r = router(include=[{"job_namespace": "airflow-*", "dataset_namespace": "*"}])
    assert r.accepts(event) == NOT_ROUTED
    # When it is reached, an unparseable body has no datasets (no exception).
    assert router(include=[{"dataset_namespace": "*"}]).accepts(event) == NOT_ROUTED


@pytest.mark.parametrize(
    "config, where",
    [
        ({"include": [{"job_namespace": "x", "colour": "red"}]}, "colour"),
        ({"include": [{}]}, "at least one"),
        ({"include": [{"event_types": ["FINISHED"]}]}, "entry 1 is not an event type"),  # never the value
        ({"include": [{"job_name": ""}]}, "non-empty"),
        ({"exclude": [{"kinds": ["table"]}]}, "kinds"),
        ({"includes": []}, "includes"),
        # Only RunEvents and JobEvents have a job.
        ({"include": [{"kinds": ["dataset"], "job_name": "*"}]}, "job_name: only RunEvents and JobEvents"),
        ({"exclude": [{"kinds": "dataset", "job_namespace": "spark-*"}]}, "job_namespace: only RunEvents"),
        # A glob around an IPv6 host: [fd00::1] would be one character of f, d, 0, :, 1.
        ({"include": [{"dataset_namespace": "postgres://[fd00::1]:*"}]}, "write [[] for a literal ["),
        # An IPv6 host and another class, no * or ?: neither text nor a glob, it would match nothing.
        ({"include": [{"job_namespace": "postgres://[fd00::1]:543[12]"}]}, "job_namespace"),
        ({"include": [{"job_namespace": "postgres://[fd00::1]:543[12]"}]}, "write [[] for a literal ["),
    ],
)
def test_bad_config_is_rejected_naming_the_key(config: dict, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate(config)
    assert where in str(err.value)


def test_config_is_frozen() -> None:
    config = RouteConfig.model_validate({"include": [{"job_namespace": "a"}]})
    with pytest.raises(ValidationError):
        config.include = ()  # type: ignore[misc]
    assert config.include[0].event_types is None


def test_event_kinds_the_collector_does_not_take_are_refused_before_any_rule() -> None:
    dataset = decoded(dataset_event("s3://x", "t", event_time=START))
    job = decoded(job_event("ns", "j", event_time=START))
    runs_only = Router(RouteConfig.model_validate({"include": [{"kinds": ["dataset", "job"]}]}), ("run",))
    assert not runs_only.routes_everything
    assert runs_only.accepts(dataset) == UNSUPPORTED_EVENT_KIND
    assert runs_only.accepts(job) == UNSUPPORTED_EVENT_KIND
    assert runs_only.accepts(run_events()["START"]) == NOT_ROUTED  # taken by kind, not by the rule
    everything = Router(RouteConfig(), ("job", "run", "dataset"))
    assert everything.routes_everything and everything.accepts(dataset) is None
