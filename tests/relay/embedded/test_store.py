"""The lineage store answers what a user asks of the demo's lineage: what feeds a dataset or
a column (through every job on the way), what breaks if it changes, by short names, and it
never loses an event the collector accepted, whatever its shape."""

from __future__ import annotations

import threading

import pytest

from relay.embedded.store import ColumnEdge, IoEdge, LineageQueryError, LineageStore
from tests.support.pipeline_events import (
    BRONZE_CUSTOMERS,
    BRONZE_ORDERS,
    GOLD_CUSTOMER_LTV,
    GOLD_DAILY_REVENUE,
    JOBS,
    LANDING_CUSTOMERS,
    LANDING_ORDERS,
    SILVER_ORDERS,
    ds_id,
    job_id,
    pipeline_events,
)
from tests.support.spec import validator

LANDING_ORDERS_ID, LANDING_CUSTOMERS_ID = ds_id(LANDING_ORDERS), ds_id(LANDING_CUSTOMERS)
BRONZE_ORDERS_ID, BRONZE_CUSTOMERS_ID = ds_id(BRONZE_ORDERS), ds_id(BRONZE_CUSTOMERS)
SILVER_ID, DAILY_ID, LTV_ID = ds_id(SILVER_ORDERS), ds_id(GOLD_DAILY_REVENUE), ds_id(GOLD_CUSTOMER_LTV)


@pytest.fixture
def store() -> LineageStore:
    with LineageStore() as s:
        for event in pipeline_events():
            s.add(event)
        yield s


def test_the_pipeline_fixture_is_valid_openlineage():
    for event in pipeline_events():
        validator().validate(event)


def test_jobs_datasets_and_edges_are_derived_from_the_events(store):
    assert [j.id for j in store.jobs()] == sorted(job_id(j["name"]) for j in JOBS)
    assert all(j.runs == 1 and j.last_state == "COMPLETE" for j in store.jobs())
    assert {d.id for d in store.datasets()} == {LANDING_ORDERS_ID, LANDING_CUSTOMERS_ID, BRONZE_ORDERS_ID,
                                                BRONZE_CUSTOMERS_ID, SILVER_ID, DAILY_ID, LTV_ID}
    silver = next(d for d in store.datasets() if d.id == SILVER_ID)
    assert [c.name for c in silver.columns][:3] == ["order_id", "customer_id", "customer_name"]
    assert silver.aliases == (("hive://metastore.acme.internal:9083", "silver.orders"),)
    expected = {IoEdge(job_id(j["name"]), ds_id(ds), "input") for j in JOBS for ds in j["inputs"]}
    expected |= {IoEdge(job_id(j["name"]), ds_id(j["output"]), "output") for j in JOBS}
    assert set(store.edges()) == expected


def test_column_edges_keep_transformations_and_dataset_wide_entries(store):
    edges = store.column_edges()
    assert ColumnEdge(SILVER_ID, "amount_eur", DAILY_ID, "total_revenue", job_id("gold_build.daily_revenue"),
                      "DIRECT", "AGGREGATION") in edges
    assert ColumnEdge(SILVER_ID, "order_date", DAILY_ID, None, job_id("gold_build.daily_revenue"),
                      "INDIRECT", "GROUP_BY") in edges
    per_job = sum(len(s) for j in JOBS for s in j["fields"].values()) + sum(len(j["dataset"]) for j in JOBS)
    assert len(edges) == per_job


def test_upstream_of_a_column_crosses_every_job_to_the_landing_files(store):
    answer = store.upstream("gold.daily_revenue.total_revenue", indirect=False)
    assert (answer.dataset, answer.column) == (DAILY_ID, "total_revenue")
    assert {(h.dataset, h.column, h.depth) for h in answer.hops} == {
        (SILVER_ID, "amount_eur", 1),
        (BRONZE_ORDERS_ID, "amount", 2), (BRONZE_ORDERS_ID, "currency", 2),
        (LANDING_ORDERS_ID, "amount", 3), (LANDING_ORDERS_ID, "currency", 3),
    }
    assert answer.jobs == (job_id("gold_build.daily_revenue"), job_id("silver_build.orders"),
                           job_id("bronze_ingest.orders"))
    assert answer.datasets == (SILVER_ID, BRONZE_ORDERS_ID, LANDING_ORDERS_ID)


def test_upstream_of_a_column_includes_what_filters_joins_and_groups_it(store):
    answer = store.upstream(DAILY_ID, "total_revenue")
    columns = set(answer.columns)
    assert {(SILVER_ID, "order_date"), (SILVER_ID, "country"), (SILVER_ID, "status")} <= columns  # group by, filter
    assert {(BRONZE_ORDERS_ID, "customer_id"), (BRONZE_CUSTOMERS_ID, "customer_id")} <= columns  # the silver join
    assert (LANDING_CUSTOMERS_ID, "country") in columns  # the country grouped on, two jobs back
    assert (LANDING_CUSTOMERS_ID, "email") not in columns
    via = {(h.dataset, h.column): h.via for h in answer.hops}
    assert via[(SILVER_ID, "order_date")] == "INDIRECT/GROUP_BY"
    assert via[(SILVER_ID, "amount_eur")] == "DIRECT/AGGREGATION"


def test_upstream_of_a_dataset_lists_datasets_and_jobs_transitively(store):
    answer = store.upstream("gold.daily_revenue")
    assert {(h.dataset, h.depth) for h in answer.hops} == {
        (SILVER_ID, 1), (BRONZE_ORDERS_ID, 2), (BRONZE_CUSTOMERS_ID, 2), (LANDING_ORDERS_ID, 3),
        (LANDING_CUSTOMERS_ID, 3)}
    assert set(answer.jobs) == {job_id(j["name"]) for j in JOBS if j["name"] != "gold_build.customer_ltv"}
    assert answer.columns == ()


def test_downstream_of_a_dataset_is_what_breaks_if_it_changes(store):
    assert set(store.downstream("silver.orders").datasets) == {DAILY_ID, LTV_ID}
    answer = store.downstream("bronze.customers")
    assert {(h.dataset, h.depth) for h in answer.hops} == {(SILVER_ID, 1), (LTV_ID, 1), (DAILY_ID, 2)}
    assert set(answer.jobs) == {job_id("silver_build.orders"), job_id("gold_build.customer_ltv"),
                                job_id("gold_build.daily_revenue")}
    assert store.downstream("gold.daily_revenue").hops == ()


def test_downstream_of_a_column_through_two_jobs(store):
    answer = store.downstream("orders.csv.amount", indirect=False)
    assert {(h.dataset, h.column, h.depth) for h in answer.hops} == {
        (BRONZE_ORDERS_ID, "amount", 1), (SILVER_ID, "amount_eur", 2),
        (DAILY_ID, "total_revenue", 3), (LTV_ID, "lifetime_revenue", 3)}


def test_a_column_that_filters_a_dataset_breaks_all_of_it_downstream(store):
    answer = store.downstream("bronze.orders", "status")
    assert (SILVER_ID, None) in {(h.dataset, h.column) for h in answer.hops}  # the filter: all of silver.orders
    assert {(DAILY_ID, "order_count"), (LTV_ID, "customer_id")} <= set(answer.columns)
    direct = store.downstream("bronze.orders", "status", indirect=False)
    assert set(direct.columns) == {(SILVER_ID, "status")}


@pytest.mark.parametrize("text, expected", [
    ("silver.orders", SILVER_ID),  # the catalog table (symlinks facet)
    ("hive://metastore.acme.internal:9083/silver.orders", SILVER_ID),
    ("gold.db/daily_revenue", DAILY_ID),  # the end of the warehouse path
    ("daily_revenue", DAILY_ID),
    ("orders.csv", LANDING_ORDERS_ID),
    ("landing/orders.csv", LANDING_ORDERS_ID),
    (BRONZE_ORDERS_ID, BRONZE_ORDERS_ID),
])
def test_short_names_resolve_when_unambiguous(store, text, expected):
    assert store.resolve(text) == expected


def test_ambiguous_unknown_and_partial_names_are_refused_with_the_candidates(store):
    with pytest.raises(LineageQueryError, match="ambiguous.*bronze.db/orders.*silver.db/orders"):
        store.resolve("orders")
    with pytest.raises(LineageQueryError, match="no dataset matches 'platinum.orders'"):
        store.upstream("platinum.orders")
    with pytest.raises(LineageQueryError, match="no dataset matches 'rders.csv'"):
        store.resolve("rders.csv")  # a suffix must start at a '.', '/' or ':'
    with pytest.raises(LineageQueryError, match="has no column 'revenue'.*total_revenue"):
        store.upstream("gold.daily_revenue.revenue")


def test_run_state_follows_event_time_not_arrival_order():
    start, complete = pipeline_events()[:2]
    with LineageStore() as s:
        s.add(complete)
        s.add(start)
        assert [(j.runs, j.last_state) for j in s.jobs()] == [(1, "COMPLETE")]


@pytest.mark.parametrize("earlier,later", [
    # Java and Python omit a zero fraction: as text, "10:00:00Z" sorts after "10:00:00.250Z".
    (("START", "2024-01-01T10:00:00Z"), ("COMPLETE", "2024-01-01T10:00:00.250Z")),
    (("START", "2024-01-01T10:00:00.9Z"), ("COMPLETE", "2024-01-01T10:00:01Z")),
    # An offset counts: 11:00+02:00 is 09:00 UTC.
    (("RUNNING", "2024-01-01T11:00:00+02:00"), ("COMPLETE", "2024-01-01T10:30:00Z")),
    (("START", "2024-01-01T10:00:00.123456789Z"), ("FAIL", "2024-01-01T10:00:00.1235Z")),
], ids=["no-fraction-first", "no-fraction-last", "offset", "nanoseconds"])
@pytest.mark.parametrize("arrival", ["in-order", "reversed"])
def test_run_state_follows_event_time_whatever_its_format(earlier, later, arrival):
    base = {"run": {"runId": "r1"}, "job": {"namespace": "n", "name": "j"}}
    events = [{**base, "eventType": kind, "eventTime": time} for kind, time in (earlier, later)]
    with LineageStore() as s:
        for event in events if arrival == "in-order" else events[::-1]:
            s.add(event)
        assert [(j.runs, j.last_state) for j in s.jobs()] == [(1, later[0])]


def test_events_of_any_shape_are_kept_and_unreadable_parts_skipped():
    odd = [{"hello": "world"}, {"job": {"namespace": "ns"}, "inputs": "not a list"},
           {"job": {"namespace": "ns", "name": "j"}, "outputs": [{"namespace": "ns", "name": "d",
            "facets": {"columnLineage": {"fields": {"c": {"inputFields": [{"namespace": "ns"}, "x"]}}}}}]}]
    with LineageStore() as s:
        for event in odd:
            s.add(event)
        assert list(s.events()) == odd
        assert [d.id for d in s.datasets()] == ["ns/d"]
        assert s.column_edges() == []
        assert s.edges() == [IoEdge("ns/j", "ns/d", "output")]


def test_a_store_file_survives_reopening_and_serves_readers_while_written(tmp_path):
    path = tmp_path / "lineage.sqlite"
    events = pipeline_events()
    with LineageStore(path) as s:
        errors: list[BaseException] = []

        def write() -> None:
            try:
                for event in events * 5:
                    s.add(event)
            except BaseException as err:  # noqa: BLE001 - surfaced below
                errors.append(err)

        writer = threading.Thread(target=write)
        writer.start()
        while writer.is_alive():
            s.jobs(), s.datasets(), s.column_edges()
        writer.join()
        assert not errors
    with LineageStore(path) as reopened:
        assert reopened.event_count() == len(events) * 5
        assert set(reopened.downstream("silver.orders").datasets) == {DAILY_ID, LTV_ID}
