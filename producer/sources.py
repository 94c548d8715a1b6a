"""Read producer configuration from the OpenLineage ecosystem's sources (used by
:func:`producer.config.load_config`).

Precedence, highest first (a key set higher wins; ``properties`` merge key by key):

1. explicit arguments (``LineageProducer(**overrides)``, ``load_config(overrides)``);
2. Spark conf: ``spark.openlineage.transport.{type,topicName,messageKey,properties.<librdkafka
   key>,encoding,journalDir,journalMaxBytes,journalAdoptIntervalS,queueMaxEvents}``
   (``config.<librdkafka key>`` too: ``properties.`` wins for the same key),
   ``spark.openlineage.namespace``,
   ``spark.openlineage.{parentJobNamespace,parentJobName,parentRunId,rootParentJobNamespace,
   rootParentJobName,rootParentRunId}`` (the official Spark integration lets Spark conf win
   over openlineage.yml);
3. ``openlineage.yml``: ``$OPENLINEAGE_CONFIG``, else ``./openlineage.yml``, else
   ``~/.openlineage/openlineage.yml`` (the first readable one), its ``transport:`` section
   (openlineage-python lets it win over the variables below);
4. ``OPENLINEAGE__TRANSPORT__<KEY>`` environment variables, or ``OPENLINEAGE__TRANSPORT``
   (the whole section as a JSON object, which then replaces the single variables, as in
   openlineage-python; their names are logged once); a JSON object or array value is
   parsed, any other stays text (``OPENLINEAGE__TRANSPORT__TOPIC=123`` is topic ``123``;
   ``OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS=k:9092`` is ``bootstrap.servers``),
   plus ``OPENLINEAGE_NAMESPACE``, ``OPENLINEAGE_PARENT_ID`` and ``OPENLINEAGE_ROOT_PARENT_ID``
   (``<namespace>/<job name>/<run id>``, as Airflow's ``lineage_parent_id`` macro renders).

With Spark conf (``spark_conf`` given: the Spark integration), the other sources are read as the
official integration's ArgumentParser reads them: openlineage.yml's top-level ``namespace``,
``parentJobNamespace``/``parentJobName``/``parentRunId`` and ``rootParent*``, and the
``OPENLINEAGE__*`` variables named as its env parser names them (``OPENLINEAGE__NAMESPACE``,
``OPENLINEAGE__PARENT_JOB_NAME`` is ``parentJobName``), Spark conf over openlineage.yml over
the variables (over ``OPENLINEAGE_NAMESPACE``/``OPENLINEAGE_PARENT_ID``); a blank Spark conf
value is not set; and ``OPENLINEAGE__TRANSPORT`` is merged with the single variables, the JSON
winning key by key, as the Java env parser merges them.

Whose transport it is, is decided on the merged section, as the official clients do: the
``type`` of the highest source that sets one wins, and a source whose type differs from a
higher one's is dropped whole (our type names count as one). Only a merged type of ours is
read: ``kafka`` (the official Kafka transport's settings carry over unchanged), ``lineage-relay`` or the plugin's dotted
path ``producer.openlineage_transport.LineageRelayTransport`` (no type anywhere counts as
ours). So openlineage.yml ``type: http`` with ``OPENLINEAGE__TRANSPORT__TYPE=kafka`` is an
HTTP setup, not ours. Keys are matched ignoring case and ``_`` (``messageKey`` =
``message_key`` = ``MESSAGEKEY``); ``config`` (Python client) and ``properties`` (Java
client) both mean librdkafka properties, whose names may be written with ``_`` for ``.``;
``topicName`` (Java) and ``topic`` (Python) both mean the topic; ``flush`` is read by the
openlineage-python plugin (:mod:`producer.openlineage_transport`) and ignored here
(``LineageProducer.emit`` never waits for the broker); ``localServerId`` (the Java transport's record key
before 1.13, an alias of ``messageKey`` until 1.16) is the message key when no ``messageKey`` is
set, with a deprecation warning.

When the merged type is ours (no type anywhere counts), openlineage.yml's and Spark conf's
transport sections were written for this producer: an unknown key in them is an error naming
the key (``transport.topc``), whether or not they set a type. The ``OPENLINEAGE__TRANSPORT*``
variables are shared with other tools, so an unknown key there is an error only when they
name our type themselves (``OPENLINEAGE__TRANSPORT__TYPE=kafka``). Anything else that is not
needed is logged once and skipped, never raised: other keys in those variables and settings
of other transports (``OPENLINEAGE__TRANSPORT__AUTH__*``, ``HEADERS__*``, the
``TRANSPORTS__DEFAULT_HTTP__*`` openlineage-python writes for ``OPENLINEAGE_URL``), a
malformed or unreadable openlineage.yml (only the problem and its line are logged, never the
file's text), a malformed ``OPENLINEAGE_PARENT_ID`` and an incomplete or invalid Spark
parent (the parent facet is then omitted, as the official integration does). Explicit parent
settings replace every source's; otherwise, with Spark conf, each ``parent*``/``rootParent*``
setting comes from the highest source that sets it (Spark conf > openlineage.yml >
``OPENLINEAGE__PARENT_*``, as the official integration merges them), and
``OPENLINEAGE_PARENT_ID`` (with ``OPENLINEAGE_ROOT_PARENT_ID``) is the parent only when those
give no usable one (see :mod:`producer.parents`).

``properties`` merge key by key; a Kafka Java client property and its librdkafka name
(``max.request.size`` and ``message.max.bytes``, ``sasl.jaas.config`` and
``sasl.username``/``sasl.password``) compete by source precedence like any other setting: the
higher source's wins, whichever name it writes (within one source the librdkafka one wins). A
blank ``OPENLINEAGE__TRANSPORT__PROPERTIES__*`` value (or one in ``OPENLINEAGE__TRANSPORT``'s
``properties``) is not set: a template rendering an unset value must not turn anything off (an
empty ``ssl.endpoint.identification.algorithm`` disables TLS hostname verification; give it in
openlineage.yml to mean it, and it is logged ``tls_hostname_verification_off``), through
:func:`load_config` and the openlineage-python plugin alike.

A property value is text, a number or true/false: a YAML null (``sasl.password:``) or ``null``
in a variable openlineage-python parses, and a nested mapping or a list, are refused with
:class:`ConfigError` naming ``transport.properties.<key>`` (never the value; see
:func:`property_value_problem`). openlineage.yml's numbers are read as written where text is
expected (a librdkafka property, ``topicName``, ``messageKey``, ``namespace``: ``012345`` stays
``012345``, not YAML 1.1's octal 5349), as the Java integration reads them
(:class:`producer.readers.YamlInt`); ``journalDir`` expands ``~``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from producer.errors import ConfigError
from producer.java_properties import shadowed
from producer.parents import parent_values
from producer.readers import (
    TRANSPORT_TYPES,
    Source,
    disabled,
    env_settings,
    env_source,
    find_yaml,
    is_ours,
    log_once,
    spark_source,
    yaml_settings,
    yaml_source,
)

__all__ = ["TRANSPORT_TYPES", "collect", "disabled", "find_yaml", "is_ours", "local_server_id_as_message_key",
           "spark_disabled", "spark_transport_type", "transport_layer"]

log = logging.getLogger("producer.config")

# Normalised transport key (lower case, no "_") -> ProducerConfig field; None = ignored.
_TRANSPORT_KEYS: dict[str, str | None] = {
    "type": None, "name": None, "priority": None, "flush": None,
    "localserverid": "local_server_id",   # see local_server_id_as_message_key
    "topic": "topic", "topicname": "topic",
    "messagekey": "message_key",
    "config": "properties", "properties": "properties",
    "bootstrapservers": "bootstrap_servers",
    "encoding": "encoding",
    "journaldir": "journal_dir",
    "journalmaxbytes": "journal_max_bytes",
    "journaladoptintervals": "journal_adopt_interval_s",
    "queuemaxevents": "queue_max_events",
    "closetimeouts": "close_timeout_s",
}
# Named as the README and openlineage.yml examples write them (the Java transport's names;
# openlineage-python's ``topic`` and ``config`` are the alternatives).
_KNOWN = ("topicName (or topic), messageKey, properties (or config), encoding, journalDir, journalMaxBytes, "
          "journalAdoptIntervalS, queueMaxEvents, closeTimeoutS, bootstrapServers")
_SPARK = "spark.openlineage."
_DEFAULT_CODEC = "lz4"   # producer.config.KAFKA_DEFAULTS (which imports this module)
# librdkafka names never hold "_" but these C-API/callback ones; an env var name cannot hold ".".
_UNDERSCORE_PROPERTY = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)+")


class _Layer:
    """One source's values plus where each came from (for error messages), or several merged
    (:meth:`update`), each librdkafka property ranked by the precedence of its source."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        #: librdkafka/Java property -> precedence of the source it came from (higher wins).
        self.ranks: dict[str, int] = {}
        self.sources = 1

    def set(self, field: str, value: Any, origin: str) -> None:
        if field == "properties":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{origin}: must be a mapping of librdkafka properties, "
                                  f"e.g. {{bootstrap.servers: 'kafka:9092'}}")
            for key, item in value.items():
                problem = property_value_problem(str(key), item, _property_origin(origin, str(key)))
                if problem:
                    raise ConfigError(problem)
            props = _dotted(value)
            # Normalised per layer so a higher layer's bootstrap servers win either way.
            if "bootstrap.servers" in props:
                self.set("bootstrap_servers", props.pop("bootstrap.servers"),
                         _property_origin(origin, "bootstrap.servers"))
            self.values.setdefault("properties", {}).update(props)
            self.ranks.update(dict.fromkeys(props, 0))
        else:
            self.values[field] = value
        self.origins.setdefault(field, origin)

    def update(self, other: _Layer) -> None:
        for name, value in other.values.items():
            if name == "properties":
                self.values["properties"] = {**self.values.get("properties", {}), **value}
            else:
                self.values[name] = value
            self.origins[name] = other.origins[name]
        self.ranks.update({key: self.sources + rank for key, rank in other.ranks.items()})
        self.sources += other.sources

    def translate_by_source(self) -> None:
        """Drop each librdkafka property a Java one from a higher source replaces, so that the
        two compete by source precedence when ProducerConfig translates the Java one
        (:func:`producer.java_properties.shadowed`)."""
        props = self.values.get("properties")
        if props:
            for key in shadowed(props, self.ranks, _DEFAULT_CODEC):
                del props[key]


def property_value_problem(key: str, value: Any, where: str | None = None) -> str | None:
    """Why librdkafka property ``key`` (set at ``where``, default ``key``) cannot take ``value``,
    with the fix, or None when it can (text,
    a number or true/false). A YAML null (``sasl.password:``, a template that rendered nothing;
    ``null`` in an environment variable openlineage-python parses as JSON) is refused, not read as
    unset: left unset, a password fails only at the first connection, and a TLS or SASL setting
    falls back to a default the file meant to change. A mapping or list is refused too (its text
    would be no librdkafka value, and would carry a nested password past the masking in ``repr``).
    The message never quotes the value."""
    if isinstance(value, (str, int, float)):   # bool is an int
        return None
    where = where or key
    if value is None:
        return f"{where}: no value (null) fix: give a value, or remove it"
    if isinstance(value, Mapping):   # its keys are not named either: a key may be a secret written as one
        return (f"{where}: a nested mapping, not a librdkafka property value fix: use dotted keys "
                f"({key}.<name>: <value>), e.g. sasl.password: ...")
    return (f"{where}: a {type(value).__name__}, not a librdkafka property value fix: write it as one value "
            f"(a librdkafka list is comma-separated: a,b)")


def _property_origin(origin: str, key: str) -> str:
    # "env OPENLINEAGE__TRANSPORT__PROPERTIES__*" / "spark.openlineage.transport.properties.*": the key for the "*".
    return origin[:-1] + key if origin.endswith("*") else f"{origin}.{key}"


def _dotted(props: Mapping[Any, Any]) -> dict[str, Any]:
    """librdkafka properties with ``bootstrap_servers`` read as ``bootstrap.servers`` (how
    ``OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS`` reaches a transport through
    openlineage-python); a name also given dotted keeps the dotted one's value."""
    out: dict[str, Any] = {}
    for key, value in props.items():
        key = str(key)
        if _UNDERSCORE_PROPERTY.fullmatch(key) and not key.endswith("_cb") and key != "on_delivery":
            dotted = key.replace("_", ".")
            if dotted not in props:
                out[dotted] = value
            continue
        out[key] = value
    return out


def transport_layer(section: Mapping[str, Any], where: str, *,
                    origin: Callable[[str], str] | None = None,
                    skippable: Callable[[str], bool] = lambda key: False,
                    skip_level: int = logging.INFO) -> _Layer:
    """Map one OpenLineage ``transport`` section onto ProducerConfig fields. An unknown key
    raises, unless ``skippable(key)`` (it need not be ours): then it is logged once and skipped."""
    origin = origin or (lambda key: f"{where}.{key}")
    layer = _Layer()
    for key, value in section.items():
        norm = str(key).replace("_", "").lower()
        if norm not in _TRANSPORT_KEYS:
            if skippable(str(key)):
                log_once(skip_level, f"skip:{origin(str(key))}",
                         "event=transport_setting_ignored key=%s reason=not a setting of the kafka/lineage-relay "
                         "transport, from a source that does not name that transport type fix=remove it if it is "
                         "meant for this producer (known keys: %s)", origin(str(key)), _KNOWN)
                continue
            raise ConfigError(f"{origin(str(key))}: unknown transport key; known keys: {_KNOWN}")
        name = _TRANSPORT_KEYS[norm]
        if name is not None:
            layer.set(name, value, origin(str(key)))
    return layer


def spark_transport_type(conf: Mapping[str, str]) -> str | None:
    return conf.get(_SPARK + "transport.type")


def spark_disabled(conf: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    return str(conf.get(_SPARK + "disabled", "")).strip().lower() == "true" or disabled(environ)


def _transport(sources: list[Source], nested: list[str]) -> tuple[_Layer, str | None]:
    """The merged transport of ``sources`` (lowest precedence first) as ProducerConfig values,
    or an empty layer and a note naming the type when it is not ours."""
    kept: list[Source] = []
    merged_type: Any = None
    for src in sources:
        src_type = src.section.get("type")
        same = str(src_type) == str(merged_type) or (is_ours(src_type) and is_ours(merged_type))
        if src_type is not None and merged_type is not None and not same:
            kept = []   # a different type replaces the lower sources whole, as in the official clients
        kept.append(src)
        if src_type is not None:
            merged_type = src_type
    if not is_ours(merged_type):
        typed = next(s for s in reversed(kept) if s.section.get("type") is not None)
        note = f"{typed.origin('type')}={merged_type}"
        log_once(logging.DEBUG, f"notours:{note}", "event=transport_not_ours type=%s", note)
        return _Layer(), note
    if nested:
        log_once(logging.INFO, "nested:" + ",".join(sorted(nested)),
                 "event=transport_setting_ignored key=%s reason=settings of another transport type (auth, headers, "
                 "composite transports), not read by the kafka/lineage-relay transport fix=none needed",
                 ",".join(sorted(nested)))
    layer = _Layer()
    for src in kept:
        layer.update(transport_layer(src.section, src.where, origin=src.origin, skip_level=src.level,
                                     skippable=lambda key, strict=src.strict: not strict))
    return layer, None


def collect(overrides: Mapping[str, Any] | None = None, *,
            spark_conf: Mapping[str, str] | None = None,
            environ: Mapping[str, str] | None = None,
            cwd: Path | None = None, home: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge every source (see the module docstring) into ``(values, origins)``.

    ``values`` use ProducerConfig field names (not yet validated); ``origins`` say which
    key each came from (``origins["transport_type"]`` names a merged transport type that is
    not ours). ``environ``, ``cwd`` and ``home`` default to the process's.
    """
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else Path(cwd)
    home = Path.home() if home is None else Path(home)
    conf = spark_conf or {}
    # The Spark integration reads these as the official one's ArgumentParser does (OPENLINEAGE__*
    # merged, openlineage.yml's top-level settings); openlineage-python reads neither.
    spark = spark_conf is not None
    path = find_yaml(environ, cwd, home)
    env, nested = env_source(environ, merge_json=spark)
    sources = [s for s in (env, yaml_source(path), spark_source(conf)) if s]
    lower = [s for s in (env_settings(environ), yaml_settings(path)) if s] if spark else []
    merged = _Layer()
    transport, note = _transport(sources, nested)
    namespaces = [("env", "env OPENLINEAGE_NAMESPACE", environ.get("OPENLINEAGE_NAMESPACE"))]
    namespaces += [(s.kind, s.origin("namespace"), s.values.get("namespace")) for s in lower]
    namespaces.append(("spark", _SPARK + "namespace", conf.get(_SPARK + "namespace")))
    namespace_source = None
    for kind, where, namespace in namespaces:
        if namespace is not None and str(namespace).strip():
            layer = _Layer()
            layer.set("namespace", namespace, where)
            merged.update(layer)
            namespace_source = kind
    merged.update(transport)
    explicit = _Layer()
    for key, value in (overrides or {}).items():
        if value is not None:
            explicit.set(key, value, key)
    parent_source = None
    if not any(k.startswith(("parent_", "root_parent_")) for k in explicit.values):
        parents = _Layer()
        found, parent_source = parent_values(conf, environ, lower)
        for name, (value, where) in found.items():
            parents.set(name, value, where)
        merged.update(parents)
    merged.update(explicit)
    merged.translate_by_source()
    local_server_id_as_message_key(merged)
    origins = dict(merged.origins)
    if note is not None:
        origins["transport_type"] = note
    if namespace_source is not None and "namespace" not in explicit.values:
        origins["namespace_source"] = namespace_source
    if parent_source is not None and "parent_run_id" in merged.values:
        origins["parent_source"] = parent_source
    return merged.values, origins


def local_server_id_as_message_key(merged: _Layer) -> None:
    """``localServerId``: the record key in the official Java Kafka transport before 1.13, an
    alias of ``messageKey`` in 1.13-1.15, gone since; read as ``messageKey`` when that is not set."""
    value = merged.values.pop("local_server_id", None)
    where = merged.origins.pop("local_server_id", "localServerId")
    if value is None:
        return
    if "message_key" in merged.values:
        log_once(logging.INFO, f"localserverid:{where}",
                 "event=transport_setting_ignored key=%s reason=deprecated alias of messageKey, which is set "
                 "fix=remove it", where)
        return
    log_once(logging.WARNING, f"localserverid:{where}",
             "event=deprecated_setting key=%s reason=the OpenLineage Java Kafka transport's old name of "
             "messageKey (every record gets this key, so all go to one partition) fix=rename it messageKey, or "
             "remove it for the per-event keys", where)
    merged.values["message_key"] = value
    merged.origins["message_key"] = where
