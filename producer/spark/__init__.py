"""PySpark lineage with no JVM jar: ``enable_lineage(spark)``.

::

    from producer.spark import enable_lineage
    enable_lineage(spark)          # everything else from spark.openlineage.* conf

It registers a py4j ``QueryExecutionListener`` on the driver. Each action that writes data
becomes a child run (START, then COMPLETE or FAIL) of the application run (START now,
COMPLETE at ``spark.stop()``/exit, FAIL when the driver dies on an uncaught exception or
exits with a non-zero status: any ``SystemExit`` on Python 3.12+, ``sys.exit`` on 3.11, see
:mod:`producer.spark.driver_exit`),
with inputs, outputs, schema, dataSource, symlinks, lifecycleStateChange,
outputStatistics, processing_engine, spark_properties and columnLineage facets. Each run of a
Structured Streaming query is a child run too (START, RUNNING once its datasets are known,
COMPLETE, FAIL or ABORT; see :mod:`producer.spark.streaming`).

``disable_lineage(spark)`` switches capture off (both listeners; open streaming runs end in
ABORT) but not the application run: a session has one application run however often capture
is switched off and on. ``enable_lineage`` again continues it (same runId, no second START),
and it ends once, COMPLETE or FAIL, at ``spark.stop()`` or exit, even when capture is off at
that moment. Enabling again with another namespace, application name or parent ends it
(COMPLETE) and starts a new one.

Configuration (Spark conf, as the official integration names it; keyword arguments win):

================================================  =====================================
``spark.openlineage.disabled``                    ``true`` turns capture off (also ``$OPENLINEAGE_DISABLED``)
``spark.openlineage.transport.*``                 where events go (over openlineage.yml, over OPENLINEAGE__TRANSPORT__*)
``spark.openlineage.namespace``                   job namespace (default ``default``)
``spark.openlineage.appName``                     application job name (default: app name, on AWS Glue the job's)
``spark.openlineage.jobName.appendDatasetName``   ``false``: an action's job name without its output
``...jobName.replaceDotWithUnderscore``           as the official integration (changes no name today)
``spark.openlineage.parentJobNamespace`` etc.     parent/root parent run (also ``OPENLINEAGE_PARENT_ID``)
``spark.openlineage.capturedProperties``          Spark properties to report (comma list)
``spark.openlineage.job.tags``, ``.run.tags``     the tags job and run facets (see :mod:`producer.spark.tags`)
``spark.openlineage.job.owners.<type>``           the ownership job facet
``spark.openlineage.columnLineage.enabled``       ``false`` skips column lineage
``spark.openlineage.facets.disabled``             facets to leave out, ``[schema;columnLineage]`` (then not computed)
``spark.openlineage.facets.<name>.disabled``      ``true``/``false`` per facet (over the list)
``spark.openlineage.python.readOnlyActions``      ``true`` also reports actions that write nothing
``spark.openlineage.python.maxPlanBytes``         plans above this skip column lineage (32 MiB)
================================================  =====================================

Every key but ``disabled`` and ``transport.*`` (read with the producer's transport) may also be
set in openlineage.yml, nested at its dots (``columnLineage: {datasetLineageEnabled: false}``,
``job: {tags: [env:prod], owners: {team: data}}``), or as an ``OPENLINEAGE__*`` variable named
as the Java env parser names it (``OPENLINEAGE__JOB_NAME__APPEND_DATASET_NAME=false``); the
application's name there is ``overriddenAppName``, the official name (``appName`` is read too).
Spark conf wins over openlineage.yml, which wins over the variables, as the official
ArgumentParser merges them; tags merge by key and owners by type. See
:mod:`producer.spark.settings` (and :mod:`producer.spark.facets_config` for the facets).

``spark.openlineage.columnLineage.datasetLineageEnabled=false`` puts the whole-dataset column
dependencies (JOIN, FILTER, GROUP_BY, SORT) into the ``inputFields`` of every output field with inputs of its own
instead of the facet's ``dataset`` member (``true``, the default here), as the official
integration does with that setting, for consumers that read ``fields`` only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from producer import events
from producer.spark import job_names
from producer.spark.capture import CaptureSettings
from producer.spark.listener import SparkLineage
from producer.spark.session_listeners import session_key as _session_key
from producer.spark.settings import SparkSettings

__all__ = ["enable_lineage", "disable_lineage", "SparkLineage", "CaptureSettings", "SparkSettings"]

log = logging.getLogger("producer.spark")
_P = "spark.openlineage."
_DEFAULT_PROPERTIES = ("spark.master", "spark.app.name")
_ACTIVE: dict[int, SparkLineage] = {}


#: ProducerConfig fields only a transport section sets (not the namespace or parent ids).
_TRANSPORT_FIELDS = frozenset({"bootstrap_servers", "topic", "properties", "message_key", "encoding",
                               "journal_dir", "journal_max_bytes", "journal_adopt_interval_s", "queue_max_events",
                               "close_timeout_s", "local_server_id"})


def _transport_elsewhere(conf: dict[str, str]) -> tuple[bool, str | None]:
    """Whether one of the other sources :func:`producer.config.load_config` merges
    (``OPENLINEAGE__TRANSPORT*`` env, openlineage.yml) configures a transport of ours, and
    the type of the transport they configure when it is not ours."""
    from producer.sources import collect

    values, origins = collect(spark_conf=conf)
    return any(field in values for field in _TRANSPORT_FIELDS), origins.get("transport_type")


def _parents(conf: dict[str, str], producer: Any, lower: list) -> tuple[tuple | None, tuple | None]:
    """The producer's explicitly configured parent, else this session's Spark conf,
    openlineage.yml and OPENLINEAGE__PARENT_* (``lower``) merged setting by setting, else
    OPENLINEAGE_PARENT_ID's; an unusable one skipped (see :mod:`producer.parents`). A parent the
    producer's config took from those sources when it was built does not beat this session's."""
    cfg = getattr(producer, "config", None)
    if getattr(cfg, "parent", None) is not None and getattr(cfg, "parent_source", "explicit") == "explicit":
        return cfg.parent, getattr(cfg, "root_parent", None)
    from producer.parents import resolve

    parent, root, _source = resolve(conf, os.environ, lower)
    return parent, root


class _FacetFilter:
    """The sender, minus the disabled facets of every event (run, job and dataset facets)."""

    def __init__(self, sender: Any, names: frozenset[str]) -> None:
        self._sender, self._names = sender, names

    def emit(self, event: dict) -> None:
        self._sender.emit(events.without_facets(event, self._names))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sender, name)


def enable_lineage(spark: Any, *, producer: Any = None, namespace: str | None = None,
                   app_name: str | None = None, column_lineage: bool | None = None,
                   read_only_actions: bool | None = None, captured_properties: list[str] | None = None,
                   **producer_overrides: Any) -> SparkLineage | None:
    """Start capturing lineage for ``spark``; returns the capture, or None (with one log
    line) when capture is disabled or cannot run: no transport configured, a transport of
    another type (``http``, ``console``: the OpenLineage JVM integration's business), a
    Spark Connect session (no driver JVM in this process), or a failure while registering
    the listener (undone). After :func:`disable_lineage` it continues the session's
    application run (same runId, no second START; through the same producer unless one is
    given), unless the namespace, application name or parent differ: then that run ends
    (COMPLETE) and a new one starts. ``producer`` is anything with ``emit(dict)`` (default: a
    :class:`producer.LineageProducer` from the Spark conf and the other config sources;
    ``producer_overrides`` are its config fields). A mistake in *our* configuration (a
    ``kafka`` transport without bootstrap servers, an unknown key in openlineage.yml's or Spark
    conf's transport section, a bad value of any ``spark.openlineage.*`` setting in any source)
    raises :class:`producer.errors.ConfigError` naming the source and the key, and the fix, here,
    before anything is registered or the job's work starts; problems in sources that are not needed (a malformed
    openlineage.yml, another transport's ``OPENLINEAGE__TRANSPORT__*`` variables, an incomplete
    or invalid ``spark.openlineage.parent*``) are logged once and skipped. Nothing after this
    call raises into the job. Calling it twice for one session
    returns the running capture."""
    from producer.sources import TRANSPORT_TYPES, spark_disabled, spark_transport_type

    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        log.warning("lineage: %s has no driver JVM in this process (Spark Connect?); py4j capture needs "
                    "classic PySpark, use the OpenLineage Spark jar on the server instead; capture not enabled",
                    type(spark).__name__)
        return None
    key = _session_key(spark)
    running = _ACTIVE.get(key)
    if running is not None and (running.ended or not _same_session(running.spark, jsession)):
        running = None
    if running is not None and running.capturing:
        return running
    # A blank spark.openlineage.* value is not set, as in the official ArgumentParser.
    conf = {k: v for k, v in spark.sparkContext.getConf().getAll() if not k.startswith(_P) or str(v).strip()}
    if spark_disabled(conf, os.environ):
        log.info("lineage: disabled by spark.openlineage.disabled / OPENLINEAGE_DISABLED")
        return None
    # Every setting is read here, before anything is registered: a bad value raises now or never.
    merged = SparkSettings.read(conf)
    max_plan = merged.byte_count("python.maxPlanBytes", 32 * 1024 * 1024)
    wanted = captured_properties if captured_properties is not None else merged.names(
        "capturedProperties", _DEFAULT_PROPERTIES)
    off = merged.disabled_facets()
    col_lineage = column_lineage if column_lineage is not None else merged.flag("columnLineage.enabled", True)
    # A disabled columnLineage facet would be thrown away: not computed at all.
    col_lineage = col_lineage and "columnLineage" not in off
    append_dataset_name = merged.flag("jobName.appendDatasetName", True)
    replace_dots = merged.flag("jobName.replaceDotWithUnderscore", False)
    dataset_lineage = merged.flag("columnLineage.datasetLineageEnabled", True)
    read_only = read_only_actions if read_only_actions is not None else merged.flag("python.readOnlyActions", False)
    # overriddenAppName: the name the official integration reads from openlineage.yml.
    app_job_name = job_names.application_name(conf, app_name or merged.text("appName", "overriddenAppName"))
    job_tags, run_tags, owners = merged.tags("job.tags"), merged.tags("run.tags"), merged.owners()
    configured_namespace = merged.find("namespace")
    # As text (openlineage.yml's namespace: 2024 is "2024"); a mapping or list raises, naming the key.
    configured_text = merged.text("namespace") if configured_namespace is not None else None
    built = None
    if producer is None and running is not None and not producer_overrides:
        producer = _unfiltered(running.sender)   # capture switched back on: the same producer
    if producer is None:
        from producer.config import load_config
        from producer.kafka import LineageProducer

        transport_type = spark_transport_type(conf)
        if not producer_overrides and transport_type is not None and transport_type not in TRANSPORT_TYPES:
            log.info("lineage: spark.openlineage.transport.type=%s is not ours (kafka, lineage-relay); "
                     "capture not enabled here (pass producer= to send through this producer anyway)",
                     transport_type)
            return None
        found, other = (False, None) if producer_overrides or transport_type else _transport_elsewhere(conf)
        if producer_overrides or transport_type is not None or found:
            producer = built = LineageProducer(load_config(producer_overrides or None, spark_conf=conf))
        elif other is not None:
            log.info("lineage: the configured transport (%s) is not ours (kafka, lineage-relay); capture not "
                     "enabled here (pass producer= to send through this producer anyway)", other)
            return None
        else:
            log.warning("lineage: no transport configured (set spark.openlineage.transport.type=kafka and "
                        "spark.openlineage.transport.properties.bootstrap.servers, the OPENLINEAGE__TRANSPORT__* "
                        "env vars or openlineage.yml, or pass producer=); capture not enabled")
            return None
    # A producer's namespace given explicitly ranks below this session's Spark conf, above the other
    # sources; one it read from those sources (OPENLINEAGE_NAMESPACE, the lowest) does not beat them.
    cfg = getattr(producer, "config", None)
    cfg_namespace = getattr(cfg, "namespace", None) \
        if getattr(cfg, "namespace_source", "explicit") == "explicit" else None
    spark_namespace = configured_text if configured_namespace and configured_namespace.kind == "spark" else None
    settings = CaptureSettings(
        namespace=namespace or spark_namespace or cfg_namespace
        or configured_text or "default",
        app_job_name=app_job_name,
        spark_version=spark.version,
        column_lineage=col_lineage,
        dataset_lineage=dataset_lineage,
        captured_properties={k: conf[k] for k in wanted if k in conf},
        metastore_uris=_metastore_uris(spark, conf),
        warehouse=conf.get("spark.sql.warehouse.dir"),
        append_dataset_name=append_dataset_name,
        replace_dot_with_underscore=replace_dots,
        job_tags=job_tags,
        run_tags=run_tags,
        owners=owners,
    )
    parent, root = _parents(conf, producer, merged.lower)
    sender = _FacetFilter(producer, off) if off else producer
    if running is not None:
        if running.identity == (settings.namespace, settings.app_job_name, parent, root):
            try:
                return running.resume(sender, settings, read_only_actions=read_only, max_plan_bytes=max_plan)
            except Exception as err:  # noqa: BLE001 - a capture that cannot start must not stop the job
                log.warning("lineage: could not start capture again (%s: %s); capture not enabled (the "
                            "application run still ends at stop or exit)", type(err).__name__, err)
                return None
        running.end()   # another application (namespace, name or parent): the previous one ends here
    lineage = SparkLineage(
        spark, sender, settings, parent=parent, root=root,
        max_plan_bytes=max_plan, read_only_actions=read_only)
    try:
        lineage.start()
    except Exception as err:  # noqa: BLE001 - a capture that cannot start must not stop the job
        log.warning("lineage: could not start capture (%s: %s); capture not enabled", type(err).__name__, err)
        try:
            lineage.release()
        except Exception:  # noqa: BLE001 - undo what can be undone
            log.debug("lineage: could not undo a failed start", exc_info=True)
        if built is not None:
            built.close(0)   # nothing to wait for: whatever it holds is journaled
        return None
    _ACTIVE[key] = lineage
    return lineage


def disable_lineage(spark: Any) -> None:
    """Stop capturing for ``spark``: the actions that finished before this call are reported
    (Spark's listener bus is drained, up to 10 s), then both listeners are unregistered and
    open streaming runs end in ABORT. The application run stays open (no event now): ``enable_lineage`` again
    continues it (same runId, no second START), and it ends, COMPLETE or FAIL, at
    ``spark.stop()`` or exit, whether capture is on then or not."""
    jsession = getattr(spark, "_jsparkSession", None)
    key = _session_key(spark)
    running = _ACTIVE.get(key)
    if running is not None and _same_session(running.spark, jsession):
        running.drain()   # the actions that finished before this call are still reported
        running.stop_capture()


def _unfiltered(sender: Any) -> Any:
    return sender._sender if isinstance(sender, _FacetFilter) else sender


def _same_session(spark: Any, jsession: Any) -> bool:
    """Whether ``spark`` runs on ``jsession`` (an identity-hash collision is not the same session)."""
    try:
        return spark._jsparkSession is jsession or bool(spark._jsparkSession.equals(jsession))
    except Exception:  # noqa: BLE001
        return False


def _metastore_uris(spark: Any, conf: dict[str, str]) -> str | None:
    """The Hive metastore that names catalog tables (``hive://host:port`` symlinks), only
    when the session's catalog is Hive's (``spark.sql.catalogImplementation=hive``, as the
    official integration's ``PathUtils.extractMetastoreUri`` requires): a
    ``hive.metastore.uris`` left in a cluster's hive-site.xml names no table of an
    in-memory catalog, whose tables are named by the warehouse. Read once, at enable."""
    implementation = conf.get("spark.sql.catalogImplementation")
    if implementation is None:
        try:
            implementation = spark.conf.get("spark.sql.catalogImplementation", None)
        except Exception:  # noqa: BLE001 - one optional setting must not stop capture
            implementation = None
    if str(implementation or "").strip().lower() != "hive":
        return None
    return conf.get("spark.hadoop.hive.metastore.uris") or conf.get("hive.metastore.uris") \
        or _hadoop_setting(spark, "hive.metastore.uris")


def _hadoop_setting(spark: Any, key: str) -> str | None:
    """``key`` from the Hadoop configuration (core-site.xml, hive-site.xml on the classpath),
    where clusters set the metastore; None when it is not set or cannot be read."""
    try:
        return spark.sparkContext._jsc.hadoopConfiguration().get(key) or None
    except Exception:  # noqa: BLE001 - one optional setting must not stop capture
        return None
