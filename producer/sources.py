"""Read producer configuration from the OpenLineage ecosystem's sources (used by
:func:`producer.config.load_config`).

Precedence, highest first (a key set higher wins; ``properties`` merge key by key):

1. explicit arguments (``LineageProducer(**overrides)``, ``load_config(overrides)``);
2. ``openlineage.yml``: ``$OPENLINEAGE_CONFIG``, else ``./openlineage.yml``, else
   ``~/.openlineage/openlineage.yml`` (the first that exists), its ``transport:`` section;
3. ``OPENLINEAGE__TRANSPORT__<KEY>`` environment variables (a JSON object or array is
   parsed, so ``OPENLINEAGE__TRANSPORT__CONFIG='{"bootstrap.servers": "k:9092"}'`` works,
   any other value stays text, so ``OPENLINEAGE__TRANSPORT__TOPIC=123`` is topic ``123``; so does
   ``OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS=k:9092``), plus
   ``OPENLINEAGE_NAMESPACE``, ``OPENLINEAGE_PARENT_ID`` and ``OPENLINEAGE_ROOT_PARENT_ID``
   (``<namespace>/<job name>/<run id>``, as Airflow's ``lineage_parent_id`` macro renders;
   a malformed one is logged and ignored: the scheduler set it, not this job's config);
4. Spark conf: ``spark.openlineage.transport.{type,topicName,messageKey,properties.<librdkafka
   key>,encoding,journalDir,journalMaxBytes,queueMaxEvents}``, ``spark.openlineage.namespace``,
   ``spark.openlineage.{parentJobNamespace,parentJobName,parentRunId,rootParentJobNamespace,
   rootParentJobName,rootParentRunId}``.

A transport section is read only when its ``type`` is ours: ``kafka`` (the official Kafka
transport's settings carry over unchanged), ``lineage-relay`` or the plugin's dotted path
``producer.openlineage_transport.LineageRelayTransport``; a section of another type (say
``http``) is ignored. Within a section that is read, keys are matched ignoring case and
``_`` (``messageKey`` = ``message_key`` = ``MESSAGEKEY``) and an unknown key is an error.
``config`` (Python client) and ``properties`` (Java client) both mean librdkafka properties
(Java-only ones are handled in :mod:`producer.config`); ``topicName`` (Java) and ``topic``
(Python) both mean the topic; ``flush`` is accepted and ignored (``emit`` never waits for
the broker), so is ``localServerId`` (the Java transport only puts it in its own Kafka
client id). Env vars nested deeper than ``PROPERTIES__<KEY>`` (``AUTH__TYPE``,
``TRANSPORTS__...``, ``HEADERS__...``) belong to other transport types and are ignored when
the type is not ours; under a ``kafka`` type they are an error.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from producer.errors import ConfigError
from producer.events import env_parent_id

log = logging.getLogger("producer.config")

TRANSPORT_TYPES = frozenset({
    "kafka", "lineage-relay", "lineage_relay",
    "producer.openlineage_transport.LineageRelayTransport",
})

# Normalised transport key (lower case, no "_") -> ProducerConfig field; None = ignored.
_TRANSPORT_KEYS: dict[str, str | None] = {
    "type": None, "name": None, "priority": None, "flush": None,
    # The Java transport only uses it in its Kafka client.id; librdkafka names its own client.
    "localserverid": None,
    "topic": "topic", "topicname": "topic",
    "messagekey": "message_key",
    "config": "properties", "properties": "properties",
    "bootstrapservers": "bootstrap_servers",
    "encoding": "encoding",
    "journaldir": "journal_dir",
    "journalmaxbytes": "journal_max_bytes",
    "queuemaxevents": "queue_max_events",
    "closetimeouts": "close_timeout_s",
}
_SPARK = "spark.openlineage."
_SPARK_TOP: dict[str, str] = {
    "namespace": "namespace",
    "parentJobNamespace": "parent_job_namespace",
    "parentJobName": "parent_job_name",
    "parentRunId": "parent_run_id",
    "rootParentJobNamespace": "root_parent_job_namespace",
    "rootParentJobName": "root_parent_job_name",
    "rootParentRunId": "root_parent_run_id",
}
_ENV = "OPENLINEAGE__TRANSPORT__"


class _Layer:
    """One source's values plus where each came from (for error messages)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}

    def set(self, field: str, value: Any, origin: str) -> None:
        if field == "properties":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{origin}: must be a mapping of librdkafka properties, "
                                  f"e.g. {{bootstrap.servers: 'kafka:9092'}}")
            props = {str(k): v for k, v in value.items()}
            # Normalised per layer so a higher layer's bootstrap servers win either way.
            if "bootstrap.servers" in props:
                self.set("bootstrap_servers", props.pop("bootstrap.servers"), f"{origin}.bootstrap.servers")
            self.values.setdefault("properties", {}).update(props)
        else:
            self.values[field] = value
        self.origins.setdefault(field, origin)


def _is_ours(transport_type: Any) -> bool:
    return transport_type is None or str(transport_type) in TRANSPORT_TYPES


def transport_layer(section: Mapping[str, Any], where: str) -> _Layer:
    """Map one OpenLineage ``transport`` section onto ProducerConfig fields."""
    layer = _Layer()
    for key, value in section.items():
        norm = str(key).replace("_", "").lower()
        if norm not in _TRANSPORT_KEYS:
            known = "topic, messageKey, properties (or config), encoding, journalDir, journalMaxBytes, " \
                    "queueMaxEvents, closeTimeoutS, bootstrapServers"
            raise ConfigError(f"{where}.{key}: unknown transport key; known keys: {known}")
        field = _TRANSPORT_KEYS[norm]
        if field is not None:
            layer.set(field, value, f"{where}.{key}")
    return layer


def find_yaml(environ: Mapping[str, str], cwd: Path, home: Path) -> Path | None:
    """The openlineage.yml the OpenLineage clients would read, or None."""
    candidates = [environ.get("OPENLINEAGE_CONFIG"), cwd / "openlineage.yml",
                  home / ".openlineage" / "openlineage.yml"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _yaml_layer(path: Path | None) -> _Layer:
    if path is None:
        return _Layer()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read it as YAML ({err}); fix or remove the file") from err
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: must be a YAML mapping with a 'transport:' section")
    section = doc.get("transport")
    if not isinstance(section, dict) or not _is_ours(section.get("type")):
        return _Layer()
    return transport_layer(section, f"{path}: transport")


def _env_value(raw: str) -> Any:
    # Only a JSON object or array is structure; "123" or "true" is text the field converts
    # as it needs (a topic named 123 stays a string).
    if raw.lstrip()[:1] not in ("{", "["):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _env_layer(environ: Mapping[str, str]) -> _Layer:
    layer = _Layer()
    section: dict[str, Any] = {}
    props: dict[str, Any] = {}
    nested: list[str] = []
    for var, raw in environ.items():
        if not var.startswith(_ENV):
            continue
        parts = var[len(_ENV):].lower().split("__")
        if len(parts) == 2 and parts[0] in ("properties", "config"):
            # Environment variable names cannot hold '.', librdkafka names never hold '_'.
            props[parts[1].replace("_", ".")] = raw
        elif len(parts) == 1:
            section[parts[0]] = _env_value(raw)
        else:
            nested.append(var)
    # The type decides whose the section is: another tool's HTTP auth or composite
    # transport settings must not stop this producer.
    if not _is_ours(section.get("type")):
        log.debug("event=env_transport_ignored type=%s reason=not a kafka/lineage-relay transport",
                  section.get("type"))
        section, props, nested = {}, {}, []
    if nested:
        raise ConfigError(f"{sorted(nested)[0]}: unknown transport setting; use {_ENV}<KEY> or "
                          f"{_ENV}PROPERTIES__<LIBRDKAFKA_KEY>")
    if section or props:
        layer = transport_layer({k.upper(): v for k, v in section.items()}, "env OPENLINEAGE__TRANSPORT_")
        if props:
            layer.set("properties", props, f"env {_ENV}PROPERTIES__*")
    if environ.get("OPENLINEAGE_NAMESPACE"):
        layer.set("namespace", environ["OPENLINEAGE_NAMESPACE"], "env OPENLINEAGE_NAMESPACE")
    parent_ignored = False
    for var, prefix in (("OPENLINEAGE_PARENT_ID", "parent"), ("OPENLINEAGE_ROOT_PARENT_ID", "root_parent")):
        parsed = env_parent_id(var, environ)
        if prefix == "parent":
            parent_ignored = bool(environ.get(var)) and parsed is None
        elif parent_ignored:
            continue   # a root without its (ignored) parent would be rejected
        if parsed is not None:
            ns, name, run_id = parsed
            layer.set(f"{prefix}_job_namespace", ns, f"env {var}")
            layer.set(f"{prefix}_job_name", name, f"env {var}")
            layer.set(f"{prefix}_run_id", run_id, f"env {var}")
    return layer


def spark_transport_type(conf: Mapping[str, str]) -> str | None:
    return conf.get(_SPARK + "transport.type")


def spark_disabled(conf: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    return (str(conf.get(_SPARK + "disabled", "")).lower() == "true"
            or environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true")


def _spark_layer(conf: Mapping[str, str] | None) -> _Layer:
    layer = _Layer()
    if not conf:
        return layer
    section: dict[str, Any] = {}
    props: dict[str, Any] = {}
    prefix = _SPARK + "transport."
    for key, value in conf.items():
        if key.startswith(prefix + "properties."):
            props[key[len(prefix + "properties."):]] = value
        elif key.startswith(prefix):
            section[key[len(prefix):]] = value
        elif key.startswith(_SPARK) and key[len(_SPARK):] in _SPARK_TOP:
            layer.set(_SPARK_TOP[key[len(_SPARK):]], value, key)
    if (section or props) and _is_ours(section.get("type")):
        transport = transport_layer(section, _SPARK + "transport")
        for field, value in transport.values.items():
            layer.set(field, value, transport.origins[field])
        if props:
            layer.set("properties", props, prefix + "properties.*")
    return layer


def collect(overrides: Mapping[str, Any] | None = None, *,
            spark_conf: Mapping[str, str] | None = None,
            environ: Mapping[str, str] | None = None,
            cwd: Path | None = None, home: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge every source (see the module docstring) into ``(values, origins)``.

    ``values`` use ProducerConfig field names (not yet validated); ``origins`` say which
    key each came from. ``environ``, ``cwd`` and ``home`` default to the process's.
    """
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else Path(cwd)
    home = Path.home() if home is None else Path(home)
    explicit = _Layer()
    for key, value in (overrides or {}).items():
        if value is not None:
            explicit.set(key, value, key)
    layers = [_spark_layer(spark_conf), _env_layer(environ),
              _yaml_layer(find_yaml(environ, cwd, home)), explicit]  # lowest first
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer in layers:
        for field, value in layer.values.items():
            if field == "properties":
                values["properties"] = {**values.get("properties", {}), **value}
            else:
                values[field] = value
            origins[field] = layer.origins[field]
    return values, origins
