"""Spark's own description of the application and of the Spark job behind an action: the
official integration's ``spark_applicationDetails`` and ``spark_jobDetails`` run facets (same
names and fields, but ``jobCallSite``: see :func:`job_facet`), so that consumers reading
those (data-rentgen, Marquez) read ours.

Guarantees:

* The application's details are read once per application run (:func:`read_application`,
  about a dozen py4j calls, when capture starts); the conf values read are exactly those the
  official facet reports (deploy mode, driver host, YARN proxy and history server, reverse
  proxy), nothing else.
* An action's job costs three py4j calls (:class:`JobReader`; one when its ``queryId`` was
  read with the rest of the action, see ``producer.spark.batched_reads``): its ``queryId``, then one
  JSON text of the newest SQL executions (with the ids of the jobs each ran) and Spark jobs
  in Spark's status store (small: heavy fields such as plan descriptions are never
  serialised). Two more only when the action's first job is not among those newest jobs (an
  action that ran many, or other threads' jobs since): that one job, read by its id. Which
  job is the action's is decided in Python (:func:`first_job_id`, :func:`job_of`), by the
  execution's ``queryId`` and the job ids the store records for it, never guessed: when
  Spark's status store has not recorded it yet (it is updated on another listener thread),
  or the action ran no job, there is no ``spark_jobDetails`` rather than another job's.
* Nothing here raises into capture: a read that fails returns None (the facet is left out).
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import quote_plus

import orjson

from producer import events
from producer.spark.capture import SCHEMA_BASE
from producer.spark.java_objects import untracked
from producer.spark.relations import opt

log = logging.getLogger("producer.spark")

APPLICATION_SCHEMA = f"{SCHEMA_BASE}/SparkApplicationDetailsRunFacet.json"
JOB_SCHEMA = f"{SCHEMA_BASE}/SparkJobDetailsRunFacet.json"

_YARN_PROXY = "spark.org.apache.hadoop.yarn.server.webproxy.amfilter.AmIpFilter.param.PROXY_URI_BASES"
#: The Spark conf keys the facet is built from (and the only ones read).
_CONF_KEYS = ("spark.submit.deployMode", "spark.driver.host", _YARN_PROXY, "spark.ui.reverseProxy",
              "spark.ui.reverseProxyUrl", "spark.yarn.historyServer.address")


# -- the application -----------------------------------------------------------------------
def read_application(sc: Any) -> dict[str, str | None]:
    """What :func:`application_facet` needs, from a PySpark ``SparkContext``: its master,
    name, id (attributes PySpark already holds), user, UI address and the conf keys above."""
    jsc = sc._jsc.sc()
    conf = jsc.conf()  # the live SparkConf (getConf() would copy every entry)
    raw: dict[str, str | None] = {key: conf.get(key, None) for key in _CONF_KEYS}
    raw.update(master=sc.master, appName=sc.appName, applicationId=sc.applicationId,
               userName=jsc.sparkUser(), uiWebUrl=opt(jsc.uiWebUrl()))
    if raw["spark.yarn.historyServer.address"] and not raw["spark.yarn.historyServer.address"].startswith("http"):
        raw["yarn.http.policy"] = sc._jsc.hadoopConfiguration().get("yarn.http.policy", "HTTP_ONLY")
    return raw


def application_facet(raw: dict[str, str | None]) -> dict:
    """The ``spark_applicationDetails`` facet, its URLs derived as the official integration
    derives them: ``proxyUrl`` from YARN's AM filter, else ``<spark.ui.reverseProxyUrl>/proxy/<id>``
    when the reverse proxy is on; ``historyUrl`` as ``<history server>/history/<id>`` (the
    scheme from ``yarn.http.policy`` when the address has none). Values as Spark reports them."""
    app_id = raw.get("applicationId") or ""
    fields: dict[str, Any] = {
        "master": raw.get("master"), "appName": raw.get("appName"), "applicationId": app_id,
        "deployMode": raw.get("spark.submit.deployMode") or "client", "driverHost": raw.get("spark.driver.host"),
        "userName": raw.get("userName"), "uiWebUrl": raw.get("uiWebUrl"),
    }
    encoded = quote_plus(app_id, safe="*")  # as java.net.URLEncoder
    if raw.get(_YARN_PROXY):
        fields["proxyUrl"] = raw[_YARN_PROXY]
    elif (raw.get("spark.ui.reverseProxy") or "").lower() == "true" and raw.get("spark.ui.reverseProxyUrl"):
        fields["proxyUrl"] = f"{raw['spark.ui.reverseProxyUrl'].rstrip('/')}/proxy/{encoded}"
    history = raw.get("spark.yarn.historyServer.address")
    if history:
        if not history.startswith("http"):
            scheme = (raw.get("yarn.http.policy") or "HTTP_ONLY").replace("_ONLY", "").lower()
            history = f"{scheme}://{history}"
        fields["historyUrl"] = f"{history.rstrip('/')}/history/{encoded}"
    return events.custom_facet({k: v for k, v in fields.items() if v is not None}, schema_url=APPLICATION_SCHEMA)


# -- an action's Spark job -----------------------------------------------------------------
#: Heavy or unused fields never serialised (a py4j answer over 8 KiB stalls ~40 ms).
_IGNORED = {
    "org.apache.spark.sql.execution.ui.SQLExecutionUIData": (
        "description", "details", "physicalPlanDescription", "modifiedConfigs", "metrics", "metricValues",
        "stages", "errorMessage"),
    "org.apache.spark.status.api.v1.JobData": (
        "name", "stageIds", "jobTags", "killedTasksSummary", "submissionTime", "completionTime", "status", "numTasks",
        "numActiveTasks", "numCompletedTasks", "numSkippedTasks", "numFailedTasks", "numKilledTasks",
        "numCompletedIndices", "numActiveStages", "numCompletedStages", "numSkippedStages", "numFailedStages"),
    "org.apache.spark.status.JobDataWrapper": ("skippedStages",),
}
_EXECUTIONS = "org.apache.spark.sql.execution.ui.SQLExecutionUIData"
_JOBS = "org.apache.spark.status.JobDataWrapper"
#: How many of the newest executions and jobs are read: an action's execution is among the
#: newest when its callback runs (a nested write's execution comes after its command's), and
#: its first job usually is (else it is read by its id: see :meth:`JobReader.read`).
NEWEST_EXECUTIONS = 12
NEWEST_JOBS = 16


class JobReader:
    """Reads, per action, the newest SQL executions and jobs of Spark's status store as one
    JSON text. The mapper and the two store views are made once (kept across actions); a
    view made while its kind of entry did not exist yet stays empty, so an empty answer makes
    the views again (once per read)."""

    def __init__(self, gateway: Any, jsession: Any) -> None:
        self._gateway, self._jsession = gateway, jsession
        self._lock = threading.Lock()
        self._mapper: Any = None
        self._views: Any = None
        self._store: Any = None
        self._job_class: Any = None

    def read(self, qe: Any, query_id: str | None = None) -> tuple[str, str] | None:
        """The action's ``queryId`` (read from ``qe`` unless given) and ``[[executions...],
        [jobs...]]``, the jobs holding the action's first job whenever the store has recorded
        it (:func:`first_job_id`); None when not readable."""
        try:
            with self._lock:
                query_id = query_id or str(qe.queryId().toString())
                text = self._serialised(rebuild=False)
                if text.startswith("[[],") or text.endswith(",[]]"):
                    text = self._serialised(rebuild=True)
                return query_id, self._with_first_job(query_id, text)
        except Exception as err:  # noqa: BLE001 - another Spark, or a job no longer kept: no job details
            log.debug("lineage: could not read the action's Spark job: %s", err)
            return None

    def _with_first_job(self, query_id: str, text: str) -> str:
        """``text`` as read when it holds the action's first job (or the action has none known);
        else that job alone, read by its id (two py4j calls; raises when the store no longer
        keeps it, past ``spark.ui.retainedJobs``)."""
        executions, jobs = orjson.loads(text)
        first = first_job_id(query_id, executions)
        if first is None or _info_of(jobs, first) is not None:
            return text
        job = self._mapper.writeValueAsString(self._store.read(self._job_class, first))
        return orjson.dumps([executions, [orjson.loads(str(job))]]).decode()

    def _serialised(self, *, rebuild: bool) -> str:
        with untracked():  # kept across actions
            if self._mapper is None:
                self._mapper = self._make_mapper()
            if self._views is None or rebuild:
                self._views = self._make_views()
        return str(self._mapper.writeValueAsString(self._views))

    def _make_mapper(self) -> Any:
        jvm = self._gateway.jvm
        mapper = jvm.com.fasterxml.jackson.databind.ObjectMapper()
        scala_module = getattr(getattr(jvm.com.fasterxml.jackson.module.scala, "DefaultScalaModule$"), "MODULE$")
        mapper.registerModule(scala_module)
        ignorals = getattr(jvm.com.fasterxml.jackson.annotation, "JsonIgnoreProperties$Value")
        util = jvm.java.util
        as_list, tokenizer, as_set = util.Collections.list, util.StringTokenizer, util.HashSet
        for class_name, names in _IGNORED.items():
            # A Set made in four calls (py4j would add the names one call at a time).
            names_set = as_set(as_list(tokenizer(",".join(names), ",")))
            mapper.configOverride(jvm.java.lang.Class.forName(class_name)).setIgnorals(
                ignorals.forIgnoredProperties(names_set))
        return mapper

    def _make_views(self) -> Any:
        jvm = self._gateway.jvm
        self._store = self._jsession.sparkContext().statusStore().store()
        self._job_class = jvm.java.lang.Class.forName(_JOBS)
        views = jvm.java.util.ArrayList()
        views.add(self._store.view(jvm.java.lang.Class.forName(_EXECUTIONS)).reverse().max(NEWEST_EXECUTIONS))
        views.add(self._store.view(self._job_class).reverse().max(NEWEST_JOBS))
        return views


def first_job_id(query_id: str, executions: list[dict]) -> int | None:
    """The id of the first Spark job (lowest id) the action ran: of its SQL execution (found
    by ``queryId``) or of an execution nested in it (a CTAS's inner write: the same root, a
    later id, started before the action's ended; while its end is not recorded, no later
    execution of that root can be either, the store is updated in order), as the ``jobs`` of
    those executions record them. Exact, however many jobs the action ran: a job is in its
    execution's ``jobs`` from its start, so once any of the action's jobs is, every earlier
    one is too. None when the execution or its jobs are not recorded (yet)."""
    ours = next((e for e in executions if isinstance(e, dict) and e.get("queryId") == query_id), None)
    if ours is None:
        return None
    ended = ours.get("completionTime")
    nested = [e for e in executions
              if isinstance(e, dict) and e.get("rootExecutionId") == ours.get("rootExecutionId")
              and e["executionId"] > ours["executionId"]
              and (ended is None or (e.get("submissionTime") or 0) <= ended)]
    ids = [int(job) for e in (ours, *nested) for job in (e.get("jobs") or {})]
    return min(ids, default=None)


def _info_of(jobs: list[dict], job_id: int) -> dict | None:
    """The ``info`` (Spark's ``JobData``) of job ``job_id`` among ``jobs``, if there."""
    return next((j["info"] for j in jobs
                 if isinstance(j, dict) and isinstance(j.get("info"), dict) and j["info"].get("jobId") == job_id), None)


def job_of(query_id: str, text: str) -> dict | None:
    """The first Spark job the action ran (:func:`first_job_id`), when ``text`` holds it (what
    :meth:`JobReader.read` returns does whenever the store has recorded it). Keys as the
    facet's; None when not known: never another job of the action, nor another action's."""
    try:
        executions, jobs = orjson.loads(text)
        first = first_job_id(query_id, executions)
        info = _info_of(jobs, first) if first is not None else None
        if info is None:
            return None
        return {"jobId": first, "jobDescription": info.get("description"), "jobGroup": info.get("jobGroup")}
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError):
        return None


def job_facet(job: dict) -> dict:
    """The ``spark_jobDetails`` facet: ``jobId``, and the job's description and group when set.
    Not ``jobCallSite``: the official one is the job's ``callSite.short`` property, set only
    by ``setCallSite``, which Spark's status store does not keep (its job name is the call site
    Spark computes, e.g. ``$anonfun$withThreadLocalCaptured$1 at CompletableFuture.java:1768``
    for an adaptive query's stage, where the official facet has none)."""
    return events.custom_facet({k: v for k, v in job.items() if v is not None}, schema_url=JOB_SCHEMA)
