"""Producer configuration: one frozen, validated :class:`ProducerConfig`.

Build it directly (``ProducerConfig(bootstrap_servers=..., topic=...)``) or with
:func:`load_config`, which merges the OpenLineage ecosystem's sources in their precedence
(explicit arguments > Spark conf > openlineage.yml > ``OPENLINEAGE__TRANSPORT*`` env vars;
the details are in :mod:`producer.sources`).
Unknown keys and bad values raise :class:`producer.errors.ConfigError`, whose message
names the key as the user spelled it and says how to fix it; neither it nor its traceback
carries the values given. ``repr()`` masks secrets: every librdkafka property that can hold
one (``sasl.password``, ``ssl.key.pem``, ``sasl.oauthbearer.config``, ... see :func:`is_secret`).

Settings copied from the OpenLineage Java (Spark) Kafka transport carry over: Kafka Java
client properties are translated to librdkafka's where it has the same setting
(``max.request.size`` is ``message.max.bytes``, a PLAIN or SCRAM ``sasl.jaas.config`` is
``sasl.username``/``sasl.password``, a PEM truststore is ``ssl.ca.location``), dropped with one
warning when they change nothing in what is sent (:data:`JAVA_ONLY_PROPERTIES`), and refused
with the librdkafka equivalent otherwise (a JKS truststore, another JAAS login module); see
:mod:`producer.java_properties`.

Defaults worth knowing:

* ``topic``: ``openlineage`` (what the relay reads by default).
* ``journal_dir``: ``$LINEAGE_RELAY_JOURNAL_DIR/<topic>``, else
  ``${XDG_CACHE_HOME:-~/.cache}/lineage-relay/journal/<topic>``.
* ``journal_max_bytes``: 256 MiB per producer; ``queue_max_events``: 100 000;
  ``journal_adopt_interval_s``: 10.
* librdkafka: ``enable.idempotence=true``, ``acks=all``, ``compression.type=lz4``,
  ``linger.ms=20``, ``message.timeout.ms=60000``; any other property passes through
  ``properties``. Idempotence and ``acks=all`` cannot be turned off (run order depends
  on them), and the callbacks belong to the producer.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from producer.errors import ConfigError
from producer.java_properties import JAVA_ONLY_PROPERTIES as JAVA_ONLY_PROPERTIES  # re-exported
from producer.java_properties import to_librdkafka
from producer.sources import collect, property_value_problem

log = logging.getLogger("producer.config")

_SPARK = "spark.openlineage."
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Every librdkafka property that can hold a secret: sasl.password, ssl.key.password,
# ssl.keystore.password, ssl.key.pem, ssl_key, sasl.oauthbearer.config (clientSecret=...),
# sasl.oauthbearer.client.secret, sasl.oauthbearer.assertion.private.key.{pem,passphrase},
# sasl.jaas.config (Java; holds password="..."). Masking a path too (ssl.key.location) is harmless.
_SECRET = re.compile(r"password|passphrase|secret|token|credential|jaas|oauthbearer\.config|private"
                     r"|(^|[._])key([._]|$)|pem$", re.IGNORECASE)

JOURNAL_DIR_ENV = "LINEAGE_RELAY_JOURNAL_DIR"

#: librdkafka defaults; ``properties`` override them except for :data:`_FIXED`.
KAFKA_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": "20",
    "message.timeout.ms": "60000",
}
# Why each is fixed: idempotence + acks=all keep per-partition order across retries, and
# the producer needs its own callbacks to count deliveries and journal failures.
_FIXED = {
    "enable.idempotence": ("true",),
    "acks": ("all", "-1"),
    "request.required.acks": ("all", "-1"),
}
#: librdkafka properties the producer reads itself (record and batch size limits): whole numbers
#: of bytes. librdkafka would read "10MB" as 10 (it parses the leading digits).
_BYTE_SIZES = ("message.max.bytes", "batch.size")
_WHOLE_NUMBER = re.compile(r"\s*\+?[0-9]+\s*")
#: The prefixes librdkafka accepts on a broker address (``SASL_SSL://kafka:9093``).
_BROKER_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_OWNED = ("on_delivery", "delivery.report.only.error", "error_cb", "throttle_cb", "stats_cb",
          "logger", "dr_cb", "dr_msg_cb", "queue.buffering.max.messages")


def default_journal_dir(topic: str) -> Path:
    """Where a producer for ``topic`` keeps its journal unless ``journal_dir`` is set."""
    base = os.environ.get(JOURNAL_DIR_ENV)
    if base:
        return Path(base).expanduser() / topic
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "lineage-relay" / "journal" / topic


class ProducerConfig(BaseModel):
    """Everything :class:`producer.LineageProducer` needs; immutable once built."""

    # hide_input_in_errors: a ValidationError would otherwise quote the properties dict,
    # passwords included, in every traceback that shows it.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    #: ``host:port[,host:port...]``; may also come from ``properties["bootstrap.servers"]``.
    bootstrap_servers: str
    topic: str = "openlineage"
    #: One fixed key for every message (as the official ``messageKey``); None = per-event keys.
    message_key: str | None = None
    encoding: Literal["json", "avro"] = "json"
    #: librdkafka producer properties, passed through (e.g. ``security.protocol``).
    properties: dict[str, str] = Field(default_factory=dict)
    #: None = :func:`default_journal_dir` of the topic.
    journal_dir: Path | None = None
    journal_max_bytes: int = Field(256 * 1024 * 1024, ge=64 * 1024)
    queue_max_events: int = Field(100_000, ge=1, le=10_000_000)
    #: How often a running producer looks for a journal a dead process left to adopt and send
    #: (producer.replay), after a look that found none (once one is sent, the next is looked for
    #: at once); a producer also takes every such journal over when it starts.
    journal_adopt_interval_s: float = Field(10.0, gt=0)
    #: How long close() (and interpreter exit) waits at most for delivery before journaling the
    #: rest (while Kafka is down, only until everything is journaled).
    close_timeout_s: float = Field(10.0, ge=0)
    #: Default job namespace for the job API (``spark.openlineage.namespace``).
    namespace: str | None = None
    parent_job_namespace: str | None = None
    parent_job_name: str | None = None
    parent_run_id: str | None = None
    root_parent_job_namespace: str | None = None
    root_parent_job_name: str | None = None
    root_parent_run_id: str | None = None
    # Where parent_* came from: "explicit", "spark", "file" or "env" (see parent_source).
    _parent_source: str = PrivateAttr("explicit")
    # Where namespace came from: "explicit", "spark", "file" or "env" (see namespace_source).
    _namespace_source: str = PrivateAttr("explicit")

    @model_validator(mode="before")
    @classmethod
    def _bootstrap_from_properties(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("properties"), dict):
            props = dict(data["properties"])
            from_props = props.pop("bootstrap.servers", None)
            if from_props is not None:
                problem = property_value_problem("bootstrap.servers", from_props)
                if problem:
                    raise ValueError(problem)
                explicit = data.get("bootstrap_servers")
                if explicit and explicit != str(from_props):
                    raise ValueError(
                        f"bootstrap_servers={explicit!r} and properties['bootstrap.servers']="
                        f"{from_props!r} disagree; set only one"
                    )
                data = {**data, "bootstrap_servers": str(from_props), "properties": props}
        return data

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, v: str) -> str:
        v = v.strip()
        if not v or any(not part.strip() or ":" not in part for part in v.split(",")):
            raise ValueError("must be host:port[,host:port...], e.g. kafka-1:9092,kafka-2:9092")
        for part in v.split(","):
            # librdkafka takes only its security protocols as a prefix: with any other (an
            # http:// URL copied from OPENLINEAGE_URL) it logs a parse error and has no broker
            # at all, so every event would go to the journal, never to Kafka. (A path after
            # the port, kafka:9092/x, it ignores: it connects and delivers.)
            scheme, sep, _ = part.strip().rpartition("://")
            if sep and scheme.upper() not in _BROKER_PROTOCOLS:
                raise ValueError("must be host:port[,host:port...] without a URL scheme "
                                 "(e.g. kafka-1:9092, not http://kafka-1:9092)")
        return v

    @field_validator("bootstrap_servers", "topic", "message_key", "namespace", "parent_job_namespace",
                     "parent_job_name", "root_parent_job_namespace", "root_parent_job_name", mode="before")
    @classmethod
    def _number_as_text(cls, v: Any) -> Any:
        # YAML and JSON env values make ``topic: 123`` a number; a name is text.
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not _TOPIC.match(v) or v in (".", ".."):
            raise ValueError("a Kafka topic name is 1-249 of letters, digits, '.', '_', '-'")
        return v

    @field_validator("properties", mode="before")
    @classmethod
    def _props(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out: dict[str, str] = {}
        for key, value in v.items():
            # Never str() a container (a nested mapping's text would carry its password past the
            # masking in repr) nor None (it would be the text "None"); never quote the value.
            problem = property_value_problem(str(key), value)
            if problem:
                raise ValueError(problem)
        # A number read from openlineage.yml str()s as written (producer.readers.YamlInt).
        given = {str(key): str(value).lower() if isinstance(value, bool) else str(value) for key, value in v.items()}
        for key, value in to_librdkafka(given, KAFKA_DEFAULTS["compression.type"]).items():
            if key in _OWNED:
                raise ValueError(f"{key!r} is managed by the producer and cannot be set (remove it)")
            if key in _BYTE_SIZES and not _WHOLE_NUMBER.fullmatch(value):
                # The value is not quoted: a ConfigError names keys, never values (see producer.job).
                raise ValueError(f"{key} must be a whole number of bytes, without a unit "
                                 f"(e.g. {key}: 10485760 for 10 MiB)")
            allowed = _FIXED.get(key)
            if allowed and value.lower() not in allowed:
                raise ValueError(
                    f"{key}={value!r} is not supported: the producer needs {key}={allowed[0]} "
                    "to keep run order (remove it)"
                )
            out[key] = value
        return out

    @field_validator("journal_dir", mode="before")
    @classmethod
    def _journal_dir(cls, v: Any) -> Any:
        # ~ as in $LINEAGE_RELAY_JOURNAL_DIR and the default: never a directory named "~".
        return Path(v).expanduser() if isinstance(v, (str, os.PathLike)) else v

    @field_validator("parent_run_id", "root_parent_run_id")
    @classmethod
    def _run_id(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                # Canonical form: a run id given as hex, {braces} or urn:uuid: is the same run.
                return str(uuid.UUID(v))
            except ValueError:
                raise ValueError("must be a UUID, e.g. 0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a") from None
        return v

    @model_validator(mode="after")
    def _parents_complete(self) -> ProducerConfig:
        for prefix in ("parent", "root_parent"):
            names = [f"{prefix}_job_namespace", f"{prefix}_job_name", f"{prefix}_run_id"]
            given = [n for n in names if getattr(self, n) is not None]
            if given and len(given) != 3:
                missing = [n for n in names if n not in given]
                raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} missing: "
                                 f"give all three or none")
        if self.root_parent_run_id and not self.parent_run_id:
            raise ValueError("root_parent_* needs parent_* too (the root is part of the parent facet)")
        return self

    # --- derived ---------------------------------------------------------------------

    @property
    def journal_path(self) -> Path:
        """The journal directory actually used."""
        return self.journal_dir if self.journal_dir is not None else default_journal_dir(self.topic)

    @property
    def parent(self) -> tuple[str, str, str] | None:
        """``(namespace, name, run_id)`` of the parent job run, if configured."""
        if self.parent_run_id is None:
            return None
        return (self.parent_job_namespace, self.parent_job_name, self.parent_run_id)  # type: ignore[return-value]

    @property
    def parent_source(self) -> Literal["explicit", "spark", "file", "env"]:
        """Where the parent (and root) came from: ``explicit`` (given to the config or
        :func:`load_config`), ``spark`` (``spark.openlineage.parent*``), ``file``
        (openlineage.yml's ``parentJob*``, read with Spark conf) or ``env``
        (``OPENLINEAGE_PARENT_ID``, or with Spark conf ``OPENLINEAGE__PARENT_JOB_*``).
        :func:`producer.spark.enable_lineage` lets only an explicit one win over the session's
        Spark conf."""
        return self._parent_source  # type: ignore[return-value]

    @property
    def namespace_source(self) -> Literal["explicit", "spark", "file", "env"]:
        """Where the namespace came from, as :attr:`parent_source` says it (``env``:
        ``OPENLINEAGE_NAMESPACE``, or with Spark conf ``OPENLINEAGE__NAMESPACE``).
        :func:`producer.spark.enable_lineage` ranks only an explicit one above the session's
        own sources."""
        return self._namespace_source  # type: ignore[return-value]

    @property
    def root_parent(self) -> tuple[str, str, str] | None:
        if self.root_parent_run_id is None:
            return None
        return (self.root_parent_job_namespace, self.root_parent_job_name,  # type: ignore[return-value]
                self.root_parent_run_id)

    def kafka_properties(self) -> dict[str, str]:
        """The librdkafka configuration (without callbacks)."""
        props = {**KAFKA_DEFAULTS, **self.properties}
        props["bootstrap.servers"] = self.bootstrap_servers
        props["queue.buffering.max.messages"] = str(self.queue_max_events)
        return props

    def __eq__(self, other: object) -> bool:
        # The settings, not where the parent came from, make two configs equal.
        if not isinstance(other, ProducerConfig):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def __repr_args__(self):  # type: ignore[override]
        for name, value in super().__repr_args__():
            if name == "properties":
                value = {k: ("***" if is_secret(k) else v) for k, v in value.items()}
            yield name, value


def is_secret(prop: str) -> bool:
    """Whether librdkafka property ``prop`` can hold a secret (its value must never print)."""
    return bool(_SECRET.search(prop))


def build_config(values: dict[str, Any], origins: dict[str, str] | None = None) -> ProducerConfig:
    """Validate ``values`` (ProducerConfig field names) into a config.

    ``origins`` maps a field to the key the user wrote (``spark.openlineage.transport.topicName``)
    so the error names that key; every problem is listed, one per line.
    """
    origins = origins or {}
    try:
        config = ProducerConfig(**values)
    except ValidationError as err:
        lines = []
        for problem in err.errors():
            field = str(problem["loc"][0]) if problem["loc"] else ""
            where = origins.get(field, field) or "config"
            msg = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "missing" and field == "bootstrap_servers":
                msg = ("required: set bootstrap_servers=..., transport.properties.bootstrap.servers in "
                       "openlineage.yml, or spark.openlineage.transport.properties.bootstrap.servers")
                if "transport_type" in origins:
                    msg += (f" (the configured transport, {origins['transport_type']}, is not a kafka or "
                            "lineage-relay one, so none of its settings are read)")
            elif problem["type"] == "extra_forbidden":
                msg = f"unknown key; known keys: {', '.join(ProducerConfig.model_fields)}"
            lines.append(f"{where}: {msg}")
        # from None: pydantic's error, chained, would print the values given (passwords too).
        raise ConfigError("invalid producer configuration:\n  " + "\n  ".join(lines)) from None
    where = origins.get("parent_run_id", "")
    config._parent_source = origins.get("parent_source") or (
        "env" if where.startswith("env ") else "spark" if where.startswith(_SPARK) else "explicit")
    config._namespace_source = origins.get("namespace_source", "explicit")
    return config


def with_overrides(config: ProducerConfig, overrides: Mapping[str, Any]) -> ProducerConfig:
    """``config`` with ``overrides`` (ProducerConfig field names) applied and validated; the
    parent keeps its source unless the overrides set one."""
    built = build_config({**config.model_dump(exclude_none=True), **overrides})
    if not any(key.startswith(("parent_", "root_parent_")) for key in overrides):
        built._parent_source = config._parent_source
    if "namespace" not in overrides:
        built._namespace_source = config._namespace_source
    return built


def load_config(overrides: Mapping[str, Any] | None = None, *,
                spark_conf: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None,
                cwd: Path | None = None, home: Path | None = None) -> ProducerConfig:
    """One validated config from every source, highest precedence first: ``overrides``
    (ProducerConfig field names), ``spark_conf``, openlineage.yml, ``OPENLINEAGE__TRANSPORT*``
    env vars. ``environ``/``cwd``/``home`` default to the process's (tests pass theirs).
    """
    values, origins = collect(overrides, spark_conf=spark_conf, environ=environ, cwd=cwd, home=home)
    return build_config(values, origins)
