"""The official integration's ``spark_applicationDetails`` URLs and the choice of an action's
Spark job (``spark_jobDetails``), on plain data: what Spark's status store holds when the
action's callback runs."""

from __future__ import annotations

import orjson
import pytest

from producer.spark.details import application_facet, first_job_id, job_of

BASE = {"master": "yarn", "appName": "etl", "applicationId": "application_1700000000000_0042", "userName": "etl",
        "uiWebUrl": None, "spark.submit.deployMode": None, "spark.driver.host": "10.0.0.5"}
PROXY_KEY = "spark.org.apache.hadoop.yarn.server.webproxy.amfilter.AmIpFilter.param.PROXY_URI_BASES"


def test_the_application_facet_reports_what_spark_reports_and_leaves_out_what_it_has_not():
    facet = application_facet({**BASE, "uiWebUrl": "http://10.0.0.5:4040"})
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "master": "yarn", "appName": "etl", "applicationId": "application_1700000000000_0042",
        "deployMode": "client", "driverHost": "10.0.0.5", "userName": "etl", "uiWebUrl": "http://10.0.0.5:4040"}
    assert "uiWebUrl" not in application_facet(BASE), "no UI (spark.ui.enabled=false): no uiWebUrl"


@pytest.mark.parametrize(("conf", "proxy"), [
    ({PROXY_KEY: "http://rm:8088/proxy/application_1700000000000_0042"},
     "http://rm:8088/proxy/application_1700000000000_0042"),
    ({PROXY_KEY: "http://rm:8088/proxy/app", "spark.ui.reverseProxy": "true",
      "spark.ui.reverseProxyUrl": "https://gw/spark"}, "http://rm:8088/proxy/app"),  # YARN's first
    ({"spark.ui.reverseProxy": "true", "spark.ui.reverseProxyUrl": "https://gw/spark/"},
     "https://gw/spark/proxy/application_1700000000000_0042"),
    ({"spark.ui.reverseProxy": "false", "spark.ui.reverseProxyUrl": "https://gw/spark"}, None),
    ({"spark.ui.reverseProxy": "true"}, None),
])
def test_the_proxy_url_is_yarns_else_the_reverse_proxys_when_it_is_on(conf, proxy):
    assert application_facet({**BASE, **conf}).get("proxyUrl") == proxy


@pytest.mark.parametrize(("conf", "history"), [
    ({"spark.yarn.historyServer.address": "history:18080"}, "http://history:18080/history/application_1700000000000_0042"),
    ({"spark.yarn.historyServer.address": "history:18480", "yarn.http.policy": "HTTPS_ONLY"},
     "https://history:18480/history/application_1700000000000_0042"),
    ({"spark.yarn.historyServer.address": "https://history/"}, "https://history/history/application_1700000000000_0042"),
    ({}, None),
])
def test_the_history_url_names_the_application_in_the_history_server(conf, history):
    assert application_facet({**BASE, **conf}).get("historyUrl") == history


def _store(executions: list[dict], jobs: list[tuple[int, int, str | None, str | None]]) -> str:
    """Spark's status store as the reader serialises it: executions and jobs, newest first."""
    return orjson.dumps([executions, [{"info": {"jobId": job, "description": description, "jobGroup": group},
                                       "sqlExecutionId": execution}
                                      for job, execution, description, group in jobs]]).decode()


def _execution(execution_id: int, query_id: str, *, jobs: tuple[int, ...] = (), root: int | None = None,
               submitted: int = 0, completed: int | None = None) -> dict:
    """An execution as the store keeps it: the jobs it ran by id (as JSON, string keys)."""
    return {"executionId": execution_id, "rootExecutionId": execution_id if root is None else root,
            "queryId": query_id, "submissionTime": submitted, "completionTime": completed,
            "jobs": {str(job): "SUCCEEDED" for job in jobs}}


def test_the_actions_job_is_found_by_its_executions_query_id_among_others():
    text = _store([_execution(4, "q-later", jobs=(9,), submitted=30),
                   _execution(3, "q-ours", jobs=(7, 8), submitted=20, completed=25),
                   _execution(2, "q-before", jobs=(6,), submitted=10, completed=15)],
                  [(9, 4, "later", None), (8, 3, "nightly", "etl"), (7, 3, "nightly", "etl"), (6, 2, None, None)])
    assert job_of("q-ours", text) == {"jobId": 7, "jobDescription": "nightly", "jobGroup": "etl"}
    assert job_of("q-before", text) == {"jobId": 6, "jobDescription": None, "jobGroup": None}


def test_a_ctas_runs_its_job_in_a_nested_execution_which_is_its_own_but_not_a_later_siblings():
    # saveAsTable (root 5) runs the CTAS (6), which runs its write (7); then the root runs 8.
    executions = [_execution(8, "q-sibling", jobs=(4,), root=5, submitted=40),
                  _execution(7, "q-write", jobs=(3,), root=5, submitted=12, completed=18),
                  _execution(6, "q-ctas", root=5, submitted=11, completed=20),
                  _execution(5, "q-save", jobs=(4,), submitted=10)]
    text = _store(executions, [(4, 8, None, None), (3, 7, "d", "g")])
    assert first_job_id("q-ctas", executions) == 3
    assert job_of("q-ctas", text)["jobId"] == 3
    # While the CTAS's end is not recorded, no later execution of its root can be either.
    text = _store([{**e, "completionTime": None} if e["queryId"] == "q-ctas" else e for e in executions[1:]],
                  [(3, 7, "d", "g")])
    assert job_of("q-ctas", text)["jobId"] == 3


def test_the_first_job_is_the_lowest_id_the_store_records_for_the_execution_not_the_lowest_read():
    # An action that ran jobs 0-20: only the newest jobs are read, the execution records all.
    ours = _execution(3, "q-ours", jobs=tuple(range(21)), completed=50)
    newest = [(job, 3, "many", "g") for job in range(20, 4, -1)]
    assert first_job_id("q-ours", [ours]) == 0
    assert job_of("q-ours", _store([ours], newest)) is None, "not a later job of the action"
    assert job_of("q-ours", _store([ours], [(0, 3, "many", "g")])) == {
        "jobId": 0, "jobDescription": "many", "jobGroup": "g"}, "the first job, read by its id"


@pytest.mark.parametrize("text", [
    _store([_execution(2, "q-other", jobs=(1,))], [(1, 2, None, None)]),  # the action's execution not recorded yet
    _store([_execution(3, "q-ours", completed=5)], [(1, 2, None, None)]),  # its jobs not recorded yet (or none)
    _store([_execution(3, "q-ours", jobs=(2,), completed=5)], [(1, 3, None, None)]),  # its job not read
    "not json", "[]", "[[{}], []]", '[[{"queryId": "q-ours", "jobs": {"x": "RUNNING"}}], []]',
])
def test_an_action_whose_job_is_not_known_has_none_rather_than_another(text):
    assert job_of("q-ours", text) is None
