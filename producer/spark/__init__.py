"""PySpark lineage with no JVM jar: ``enable_lineage(spark)``.

::

    from producer.spark import enable_lineage
    enable_lineage(spark)          # everything else from spark.openlineage.* conf

It registers a py4j ``QueryExecutionListener`` on the driver. Each action that writes data
becomes a child run (START, then COMPLETE or FAIL) of the application run (START now,
COMPLETE at ``spark.stop()``/exit, FAIL when the driver dies on an uncaught exception),
with inputs, outputs, schema, dataSource, symlinks, lifecycleStateChange,
outputStatistics, processing_engine, spark_properties and columnLineage facets.

Configuration (Spark conf, as the official integration names it; keyword arguments win):

================================================  =====================================
``spark.openlineage.disabled``                    ``true`` turns capture off (also ``$OPENLINEAGE_DISABLED``)
``spark.openlineage.transport.*``                 where events go (see the producer docs)
``spark.openlineage.namespace``                   job namespace (default ``default``)
``spark.openlineage.appName``                     application job name (default: app name)
``spark.openlineage.parentJobNamespace`` etc.     parent/root parent run (also ``OPENLINEAGE_PARENT_ID``)
``spark.openlineage.capturedProperties``          Spark properties to report (comma list)
``spark.openlineage.columnLineage.enabled``       ``false`` skips column lineage
``spark.openlineage.python.readOnlyActions``      ``true`` also reports actions that write nothing
``spark.openlineage.python.maxPlanBytes``         plans above this skip column lineage (32 MiB)
================================================  =====================================
"""

from __future__ import annotations

import logging
import os
from typing import Any

from producer.errors import ConfigError
from producer.spark.capture import CaptureSettings, snake
from producer.spark.listener import SparkLineage

__all__ = ["enable_lineage", "disable_lineage", "SparkLineage", "CaptureSettings"]

log = logging.getLogger("producer.spark")
_P = "spark.openlineage."
_DEFAULT_PROPERTIES = ("spark.master", "spark.app.name")
_ACTIVE: dict[int, SparkLineage] = {}


def _bool(conf: dict[str, str], key: str, default: bool) -> bool:
    raw = conf.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{key}: expected true or false, got {raw!r}")
    return value == "true"


def _parents(conf: dict[str, str], producer: Any) -> tuple[tuple | None, tuple | None]:
    cfg = getattr(producer, "config", None)
    parent = getattr(cfg, "parent", None)
    root = getattr(cfg, "root_parent", None)
    if parent is None and conf.get(_P + "parentRunId"):
        parent = (conf.get(_P + "parentJobNamespace", "default"), conf.get(_P + "parentJobName", "parent"),
                  conf[_P + "parentRunId"])
    if root is None and conf.get(_P + "rootParentRunId"):
        root = (conf.get(_P + "rootParentJobNamespace", "default"), conf.get(_P + "rootParentJobName", "root"),
                conf[_P + "rootParentRunId"])
    from producer.events import parse_parent_id
    try:
        if parent is None and os.environ.get("OPENLINEAGE_PARENT_ID"):
            parent = parse_parent_id(os.environ["OPENLINEAGE_PARENT_ID"])
        if root is None and os.environ.get("OPENLINEAGE_ROOT_PARENT_ID"):
            root = parse_parent_id(os.environ["OPENLINEAGE_ROOT_PARENT_ID"])
    except ValueError as err:
        raise ConfigError(f"OPENLINEAGE_PARENT_ID/OPENLINEAGE_ROOT_PARENT_ID: {err}") from err
    return parent, root


def enable_lineage(spark: Any, *, producer: Any = None, namespace: str | None = None,
                   app_name: str | None = None, column_lineage: bool | None = None,
                   read_only_actions: bool | None = None, captured_properties: list[str] | None = None,
                   **producer_overrides: Any) -> SparkLineage | None:
    """Start capturing lineage for ``spark``; returns the capture, or None when disabled or
    when no transport is configured (logged). ``producer`` is anything with ``emit(dict)``
    (default: a :class:`producer.LineageProducer` from the Spark conf and the other config
    sources; ``producer_overrides`` are its config fields). Configuration mistakes raise
    :class:`producer.errors.ConfigError` naming the key; nothing after this call raises
    into the job. Calling it twice for one session returns the running capture."""
    from producer.sources import spark_disabled

    key = id(spark._jsparkSession)
    if key in _ACTIVE and not _ACTIVE[key].ended:
        return _ACTIVE[key]
    conf = dict(spark.sparkContext.getConf().getAll())
    if spark_disabled(conf, os.environ):
        log.info("lineage: disabled by spark.openlineage.disabled / OPENLINEAGE_DISABLED")
        return None
    if producer is None:
        from producer.config import load_config
        from producer.kafka import LineageProducer
        from producer.sources import spark_transport_type

        if producer_overrides or spark_transport_type(conf) is not None:
            producer = LineageProducer(load_config(producer_overrides or None, spark_conf=conf))
        else:
            log.warning("lineage: no transport configured (set spark.openlineage.transport.type=kafka and "
                        "spark.openlineage.transport.properties.bootstrap.servers, or pass producer=); "
                        "capture not enabled")
            return None
    try:
        max_plan = int(conf.get(_P + "python.maxPlanBytes", 32 * 1024 * 1024))
    except ValueError as err:
        raise ConfigError(f"{_P}python.maxPlanBytes: expected a number of bytes, got "
                          f"{conf.get(_P + 'python.maxPlanBytes')!r}") from err
    wanted = captured_properties
    if wanted is None:
        raw = conf.get(_P + "capturedProperties")
        wanted = [p.strip() for p in raw.split(",") if p.strip()] if raw else list(_DEFAULT_PROPERTIES)
    cfg_namespace = getattr(getattr(producer, "config", None), "namespace", None)
    settings = CaptureSettings(
        namespace=namespace or conf.get(_P + "namespace") or cfg_namespace or "default",
        app_job_name=snake(app_name or conf.get(_P + "appName") or conf.get("spark.app.name") or "spark_application"),
        spark_version=spark.version,
        column_lineage=column_lineage if column_lineage is not None else _bool(conf, _P + "columnLineage.enabled", True),
        captured_properties={k: conf[k] for k in wanted if k in conf},
        metastore_uris=conf.get("spark.hadoop.hive.metastore.uris") or conf.get("hive.metastore.uris"),
        warehouse=conf.get("spark.sql.warehouse.dir"),
    )
    parent, root = _parents(conf, producer)
    lineage = SparkLineage(
        spark, producer, settings, parent=parent, root=root, max_plan_bytes=max_plan,
        read_only_actions=read_only_actions if read_only_actions is not None
        else _bool(conf, _P + "python.readOnlyActions", False))
    lineage.start()
    _ACTIVE[key] = lineage
    return lineage


def disable_lineage(spark: Any) -> None:
    """Stop capturing for ``spark`` (no application COMPLETE is emitted)."""
    lineage = _ACTIVE.pop(id(spark._jsparkSession), None)
    if lineage is not None:
        lineage.stop_capture()
