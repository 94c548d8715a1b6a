"""Relay configuration: validated once at start-up into frozen, typed objects.

Sources, in precedence order: command-line flags > YAML file > defaults. YAML values may
reference environment variables as ``${NAME}`` or ``${NAME:-default}`` (for secrets).
Unknown keys and bad values raise :class:`ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from relay.errors import ConfigError
from relay.frozen import Frozen
from relay.source.properties import problem as properties_problem
from relay.stages.rewrite import RewriteConfig
from relay.stages.route import RouteConfig, kinds_list

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RetryConfig(Frozen):
    """Retries on connection errors, timeouts, 408, 429 and 5xx: exponential backoff with
    full jitter, capped; a Retry-After header is honoured as a lower bound."""

    initial_backoff_s: float = Field(0.2, gt=0)
    max_backoff_s: float = Field(30.0, gt=0)
    #: None = retry until delivered (a collector that is down pauses the relay, nothing is lost).
    max_attempts: int | None = Field(None, ge=1)


class MissingStartConfig(Frozen):
    """What happens to a run whose START never arrives (consolidated/coalesce modes)."""

    #: How long after a run's first event its START may still come.
    timeout_s: float = Field(30.0, gt=0)
    #: ``synthesize``: make a START up from what was seen (marked with the
    #: ``lineageRelay_synthesizedStart`` run facet); ``forward``: the run goes on without one.
    policy: Literal["synthesize", "forward"] = "synthesize"


class ConsolidationConfig(Frozen):
    """Knobs of the ``consolidated`` and ``coalesce`` delivery modes (see the README)."""

    #: consolidated: after the first terminal event, merge later facets for this long.
    settle_s: float = Field(2.0, ge=0)
    #: coalesce: RUNNING events within this window go out as one.
    coalesce_window_s: float = Field(10.0, gt=0)
    missing_start: MissingStartConfig = MissingStartConfig()
    #: A child run's START waits this long for an unseen parent run's START.
    parent_hold_s: float = Field(5.0, ge=0)
    #: Open runs kept (memory bound); beyond it the least recently active run is flushed early.
    max_open_runs: int = Field(100_000, ge=1)
    #: A run without events for this long is flushed early (what it holds is sent).
    run_ttl_s: float = Field(6 * 3600.0, gt=0)
    #: Finished runs remembered, so that their late events are dropped, not a new run.
    max_finished_runs: int = Field(100_000, ge=1)
    finished_ttl_s: float = Field(3600.0, gt=0)


DeliveryMode = Literal["passthrough", "consolidated", "coalesce"]
EventKind = Literal["run", "dataset", "job"]


class TlsConfig(Frozen):
    """TLS towards one collector (``https://`` URLs). Files are read at start-up; a missing
    or unreadable one stops the relay with the key that names it."""

    #: PEM file of the CA(s) that signed the collector's certificate; default: the system's.
    ca_bundle: str | None = None
    #: PEM client certificate (mutual TLS), with ``client_key`` unless the key is in the same file.
    client_cert: str | None = None
    client_key: str | None = None
    #: ``false`` skips certificate verification: for tests only, never in production.
    verify: bool = True

    @model_validator(mode="after")
    def _key_needs_cert(self) -> TlsConfig:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert; add client_cert (the PEM certificate) or remove client_key")
        return self


class BatchConfig(Frozen):
    """Delivery through the collector's ``POST <lineage>/batch`` endpoint (OpenLineage spec):
    a batch goes out when it holds ``max_events`` events, when the next event would take it
    over ``max_bytes``, or ``linger_ms`` after its first event, whichever comes first."""

    #: Path appended to ``url``; default: ``endpoint`` + ``/batch`` (the spec's layout).
    endpoint: str | None = None
    max_events: int = Field(200, ge=1, le=10_000)
    max_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    linger_ms: float = Field(20.0, ge=0)
    #: Batch POSTs in flight at once.
    max_requests: int = Field(4, ge=1, le=64)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must start with '/', e.g. /api/v1/lineage/batch")
        return v


class AdaptiveConcurrencyConfig(Frozen):
    """Requests in flight to a collector, learnt from its answers (:mod:`relay.sinks.adaptive`):
    between ``min`` and the collector's ceiling (``concurrency``, or ``batch.max_requests``),
    growing while answers come back fast, shrinking when they slow down or on 429, 5xx and
    timeouts."""

    min: int = Field(1, ge=1)
    #: Where the limit starts; default: 4 (or ``min``, or the ceiling, whichever bounds it).
    initial: int | None = Field(None, ge=1)
    #: A success slower than this times the lowest recent latency means the collector is
    #: queueing: the limit shrinks. Batch requests ignore latency (their size sets it).
    latency_tolerance: float = Field(2.0, gt=1)


class CollectorConfig(Frozen):
    """One collector. ``type`` picks its kind (:mod:`relay.sinks.kinds`): ``http`` (this
    class, the generic OpenLineage HTTP endpoint), ``marquez``, ``atlan``, ``datahub``,
    ``openmetadata``, or a dotted path ``package.module.Class`` to a third-party kind. Each
    kind's config class derives from this one and supplies its own defaults (endpoint,
    mode, event kinds, size limit) where the user sets none."""

    #: Whether the kind has a batch endpoint (``batch`` is refused otherwise).
    supports_batch: ClassVar[bool] = True
    #: Whether the kind always needs credentials (``token``, ``token_env`` or ``token_file``).
    needs_token: ClassVar[bool] = False
    #: The kind's size limit: ``rewrite.max_event_bytes`` when the user sets none.
    default_max_event_bytes: ClassVar[int | None] = None

    type: str = "http"
    name: str
    url: str
    #: Path appended to ``url``; the OpenLineage HTTP default.
    endpoint: str = "/api/v1/lineage"
    timeout_s: float = Field(10.0, gt=0)
    #: Events in flight at once to this collector (events of one run are always sequential).
    #: Without ``batch`` it is also the number of requests in flight.
    concurrency: int = Field(32, ge=1, le=1024)
    #: Events accepted for this collector but not yet delivered; above it the relay pauses consumption.
    max_pending: int = Field(20_000, ge=1)
    headers: dict[str, str] = Field(default_factory=dict)
    #: The bearer token, at most one of: inline (use ``${VAR}``), ``token_env`` (the name of an
    #: environment variable read at start-up) or ``token_file`` (a mounted secret, re-read
    #: when it changes, without restart).
    token: SecretStr | None = None
    token_env: str | None = None
    token_file: str | None = None
    #: How the token is sent: ``<auth_header>: <auth_scheme> <token>`` (empty scheme: the bare token).
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    tls: TlsConfig = TlsConfig()
    retry: RetryConfig = RetryConfig()
    #: Which events this collector gets (job/dataset namespace and name globs, event types).
    route: RouteConfig = RouteConfig()
    #: Per-collector changes: namespace mapping, credential redaction, facet drop/mask, size cap.
    rewrite: RewriteConfig = RewriteConfig()
    #: Event kinds this collector takes; others are not sent to it (counted as dropped,
    #: reason ``unsupported_event_kind``). The kind sets the default.
    event_kinds: tuple[EventKind, ...] = ("run", "dataset", "job")
    #: ``passthrough``: every event as it comes (ordered per run); ``consolidated``: each run
    #: as its START and one terminal event holding everything the run said; ``coalesce``:
    #: like passthrough with a run's RUNNING events merged per ``coalesce_window_s``.
    mode: DeliveryMode = "passthrough"
    consolidation: ConsolidationConfig = ConsolidationConfig()
    #: Send events in batches to the collector's batch endpoint (kinds that have one).
    batch: BatchConfig | None = None
    #: Learn how many requests the collector takes at once instead of always sending up
    #: to the ceiling (off by default).
    adaptive_concurrency: AdaptiveConcurrencyConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _batch_concurrency(cls, data: Any) -> Any:
        # A batch fills from events in flight: unless told otherwise, keep enough of them
        # in flight to fill every batch request.
        if not isinstance(data, dict) or "concurrency" in data:
            return data
        batch = data["batch"] if "batch" in data else cls.model_fields["batch"].default
        if isinstance(batch, BatchConfig):
            batch = batch.model_dump()
        if isinstance(batch, dict):
            events = batch.get("max_events", BatchConfig.model_fields["max_events"].default)
            requests = batch.get("max_requests", BatchConfig.model_fields["max_requests"].default)
            if isinstance(events, int) and isinstance(requests, int):
                data = {**data, "concurrency": max(1, min(1024, events * requests))}
        return data

    @model_validator(mode="before")
    @classmethod
    def _kind_size_limit(cls, data: Any) -> Any:
        limit = cls.default_max_event_bytes
        if limit is None or not isinstance(data, dict):
            return data
        rewrite = data.get("rewrite")
        if rewrite is None:
            return {**data, "rewrite": {"max_event_bytes": limit}}
        if isinstance(rewrite, dict) and "max_event_bytes" not in rewrite:
            return {**data, "rewrite": {**rewrite, "max_event_bytes": limit}}
        return data

    @model_validator(mode="after")
    def _kind_rules(self) -> CollectorConfig:
        if self.batch is not None and not type(self).supports_batch:
            raise ValueError(f"batch: type {self.type} has no batch endpoint; remove batch (a server that takes "
                             "the spec's POST .../lineage/batch can be configured as type: http with batch)")
        adaptive = self.adaptive_concurrency
        if adaptive is not None:
            ceiling, key = (self.batch.max_requests, "batch.max_requests") if self.batch is not None \
                else (self.concurrency, "concurrency")
            if adaptive.min > ceiling:
                raise ValueError(f"adaptive_concurrency.min: {adaptive.min} is above {key} ({ceiling}), the "
                                 f"ceiling; lower adaptive_concurrency.min or raise {key}")
            if adaptive.initial is not None and not adaptive.min <= adaptive.initial <= ceiling:
                raise ValueError(f"adaptive_concurrency.initial: {adaptive.initial} is outside min..{key} "
                                 f"({adaptive.min}..{ceiling}); set it within them or leave it out")
        if type(self).needs_token and self.token is None and self.token_env is None and self.token_file is None:
            raise ValueError(f"token: type {self.type} needs credentials; set token: ${{VAR}}, "
                             "token_env: VAR or token_file: /path/to/mounted/secret")
        return self

    @model_validator(mode="after")
    def _consolidation_needs_a_mode(self) -> CollectorConfig:
        if self.mode == "passthrough" and "consolidation" in self.model_fields_set:
            raise ValueError("consolidation: only used with mode consolidated or coalesce; "
                             "set mode: consolidated (or coalesce), or remove consolidation")
        return self

    @model_validator(mode="after")
    def _one_token_source(self) -> CollectorConfig:
        given = [k for k in ("token", "token_env", "token_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give the token one way only; keep one of them")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("use letters, digits, '_', '.', '-' (it labels metrics and dead-letter records)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// base URL such as http://marquez:5000")
        return v.rstrip("/")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/', e.g. /api/v1/lineage")
        return v

    @field_validator("token_env")
    @classmethod
    def _token_env(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError("must be an environment variable name such as MARQUEZ_TOKEN (not its value)")
        return v

    @field_validator("event_kinds", mode="before")
    @classmethod
    def _event_kinds(cls, v: Any) -> Any:
        return kinds_list(v, "must list at least one of run, dataset, job")

    @property
    def target(self) -> str:
        return self.url + self.endpoint

    @property
    def batch_target(self) -> str | None:
        """Where batches go, or None when this collector takes events one at a time."""
        if self.batch is None:
            return None
        return self.url + (self.batch.endpoint or self.endpoint.rstrip("/") + "/batch")


class KafkaConfig(Frozen):
    bootstrap_servers: str
    topics: tuple[str, ...] = ("openlineage",)
    group_id: str = "lineage-relay"
    #: Extra librdkafka consumer properties, e.g. {"security.protocol": "SASL_SSL"}.
    consumer_properties: dict[str, str] = Field(default_factory=dict)
    #: Extra librdkafka producer properties for the dead-letter producer.
    producer_properties: dict[str, str] = Field(default_factory=dict)
    dlq_topic: str = "openlineage.dlq"
    #: Create the dead-letter topic at start-up when missing (1 partition); turn off where
    #: topics are managed elsewhere.
    create_dlq_topic: bool = True
    commit_interval_s: float = Field(1.0, gt=0)
    #: Compacted changelog of open-run state for consolidated/coalesce collectors;
    #: default ``<group_id>.run-state``. One partition per partition of the input topic.
    state_topic: str | None = None
    #: Create the state topic at start-up when missing (cleanup.policy=compact).
    create_state_topic: bool = True

    @property
    def run_state_topic(self) -> str:
        return self.state_topic or f"{self.group_id}.run-state"

    @field_validator("topics", mode="before")
    @classmethod
    def _topics(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @field_validator("consumer_properties", "producer_properties", mode="before")
    @classmethod
    def _props(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): str(val).lower() if isinstance(val, bool) else str(val) for k, val in v.items()}
        return v

    @field_validator("consumer_properties")
    @classmethod
    def _consumer_properties(cls, v: dict[str, str]) -> dict[str, str]:
        found = properties_problem(v, "consumer")  # librdkafka's own check, offline
        if found is not None:
            raise ValueError(found)
        return v

    @field_validator("producer_properties")
    @classmethod
    def _producer_properties(cls, v: dict[str, str]) -> dict[str, str]:
        found = properties_problem(v, "producer")
        if found is not None:
            raise ValueError(found)
        return v


class DedupeConfig(Frozen):
    enabled: bool = True
    ttl_s: float = Field(3600.0, gt=0)
    max_entries: int = Field(200_000, ge=1)


class OrderingConfig(Frozen):
    """Per run and per collector, the first event is the run's START; one terminal event."""

    enabled: bool = True
    #: How long a RUNNING/COMPLETE/... waits for its START before the timeout policy applies.
    hold_timeout_s: float = Field(60.0, gt=0)
    #: ``forward``: deliver the held events as they are; ``dead_letter``: send them to the DLQ.
    on_hold_timeout: Literal["forward", "dead_letter"] = "forward"
    #: A terminal event that arrived before its START waits this long after the START,
    #: so the run's RUNNING events still in flight reach the collector before it.
    terminal_grace_s: float = Field(2.0, ge=0)
    #: The spec allows OTHER events after the terminal one (extra metadata).
    forward_other_after_terminal: bool = True
    max_held_events: int = Field(50_000, ge=1)
    max_tracked_runs: int = Field(200_000, ge=1)
    finished_ttl_s: float = Field(3600.0, gt=0)


class LookbackConfig(Frozen):
    """What a relay reads back, when it is assigned a partition, from before its committed
    offset: the runs begun there, and their digests (see :mod:`relay.source.lookback`)."""

    #: Records read back per newly assigned partition; 0 turns it off.
    max_records: int = Field(10_000, ge=0)
    #: For all the partitions of one assignment; then what was read is used.
    timeout_s: float = Field(10.0, gt=0, le=50)
    #: A run held ``search_after_s`` for its START in a partition read back from above its
    #: start: this many more records below are searched, once per assignment and in the
    #: background, for the runs begun there (see relay.source.run_search); 0 turns it off.
    search_records: int = Field(200_000, ge=0)
    search_after_s: float = Field(5.0, gt=0)
    search_timeout_s: float = Field(60.0, gt=0)


class PipelineConfig(Frozen):
    #: Larger records are dead-lettered (too_large). Real events reach 23 MB.
    max_event_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    #: Bytes of consumed records not yet delivered everywhere (or dead-lettered); above it
    #: consumption pauses, resuming at half. Bounds memory when events are large.
    max_pending_bytes: int = Field(128 * 1024 * 1024, ge=1024 * 1024)
    #: Decode (parse, validate, digest) in a child process, on another core; false: on the
    #: event loop's thread (one process, slower).
    decode_worker: bool = True
    #: How many decode processes (batches go to them in turn). One keeps up with a
    #: collector on a 2-core machine; give it more where the relay has cores to spare and
    #: decoding is the bottleneck (batch collectors, several hundred thousand events/s).
    decode_processes: int = Field(1, ge=1, le=64)
    #: CPU priority of the decode processes. ``low``: below the relay's (nice 10). ``idle``:
    #: only CPU nobody else wants (Linux SCHED_IDLE), so decoding never delays delivery.
    #: ``auto``: ``idle`` when every collector gets one POST per event (delivery is then
    #: the bottleneck and decoding runs far ahead of it), else ``low`` (batch collectors
    #: wait on decoding).
    decode_priority: Literal["auto", "low", "idle"] = "auto"
    dedupe: DedupeConfig = DedupeConfig()
    ordering: OrderingConfig = OrderingConfig()
    lookback: LookbackConfig = LookbackConfig()


class HttpServerConfig(Frozen):
    host: str = "0.0.0.0"
    #: 0 = pick a free port; None = no HTTP server.
    port: int | None = Field(9108, ge=0, le=65535)


class RelayConfig(Frozen):
    kafka: KafkaConfig
    collectors: tuple[CollectorConfig, ...]
    pipeline: PipelineConfig = PipelineConfig()
    http: HttpServerConfig = HttpServerConfig()
    drain_timeout_s: float = Field(20.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("collectors", mode="before")
    @classmethod
    def _collectors_by_kind(cls, v: Any) -> Any:
        # Each entry is validated by its kind's config class, chosen by its ``type``. Imported
        # here: the kinds' config classes derive from CollectorConfig in this module.
        from relay.sinks.kinds import validate_collectors

        return validate_collectors(v)

    @model_validator(mode="after")
    def _unique_collectors(self) -> RelayConfig:
        if not self.collectors:
            raise ValueError("collectors: at least one collector is needed, e.g. --collector marquez=http://marquez:5000")
        names = [c.name for c in self.collectors]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"collectors: names must be unique, repeated: {', '.join(dupes)}")
        if self.kafka.dlq_topic in self.kafka.topics:
            raise ValueError("kafka.dlq_topic: must differ from the consumed topics, or rejects would loop")
        stateful = [c.name for c in self.collectors if c.mode != "passthrough"]
        if stateful and len(self.kafka.topics) != 1:
            raise ValueError(f"kafka.topics: collectors {', '.join(stateful)} keep run state partitioned like "
                             "the input topic, so consume exactly one topic (run one relay per topic)")
        if stateful and self.kafka.run_state_topic in (*self.kafka.topics, self.kafka.dlq_topic):
            raise ValueError("kafka.state_topic: must differ from the consumed and dead-letter topics")
        return self

    @property
    def keeps_run_state(self) -> bool:
        """Whether any collector holds runs (consolidated/coalesce), hence needs the state topic."""
        return any(c.mode != "passthrough" for c in self.collectors)


_FIX_HINTS = {
    "extra_forbidden": "remove it (unknown key; check the spelling against the README's configuration reference)",
    "missing": "add it",
}

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, where: str) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{where}: environment variable {name} is not set; export it or write ${{{name}:-default}}")
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{where}.{i}") for i, v in enumerate(value)]
    return value


def build_config(data: dict[str, Any]) -> RelayConfig:
    """Validate a plain dict (already env-interpolated) into a RelayConfig."""
    try:
        return RelayConfig.model_validate(data)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "(top level)"
            fix = _FIX_HINTS.get(e["type"], "")
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {msg}" + (f"; fix: {fix}" if fix else ""))
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"cannot read config file {p}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{p} is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping with keys kafka, collectors, ...")
    return _interpolate(raw, "")


def load_config(path: str | Path) -> RelayConfig:
    return build_config(load_yaml(path))


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into ``base`` (flags over file)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
