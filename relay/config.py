"""Relay configuration: validated once at start-up into frozen, typed objects.

Sources, in precedence order: command-line flags > YAML file > defaults. YAML values may
reference environment variables as ``${NAME}``, ``${NAME:-default}`` (NAME unset or empty)
or ``${NAME-default}`` (NAME unset), for secrets; ``$${`` is a literal ``${``, and any
other ``${`` is refused (see :func:`_interpolate`).
Unknown keys and bad values raise :class:`ConfigError` naming the key and the fix.
A collector's own settings are in :mod:`relay.sinks.config`, the ``kafka:`` section's in
:mod:`relay.source.config` (both re-exported here).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from relay.errors import ConfigError
from relay.frozen import Frozen
from relay.sinks.config import CollectorConfig, DeliveryMode, EventKind
from relay.sinks.sections import (
    AdaptiveConcurrencyConfig,
    BatchConfig,
    ConsolidationConfig,
    MissingStartConfig,
    RetryConfig,
    TlsConfig,
)
from relay.source.config import KafkaConfig

__all__ = [
    "AdaptiveConcurrencyConfig", "BatchConfig", "CollectorConfig", "ConfigError", "ConsolidationConfig",
    "DedupeConfig", "DeliveryMode", "EventKind", "HttpServerConfig", "KafkaConfig", "LookbackConfig",
    "MissingStartConfig", "OrderingConfig", "PipelineConfig", "RelayConfig", "RetryConfig", "TlsConfig",
    "build_config", "load_config", "load_yaml", "merge",
]

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
    #: None: 5 s, or half of ``ordering.hold_timeout_s`` when that is shorter
    #: (see PipelineConfig.search_after_s).
    search_after_s: float | None = Field(None, gt=0)
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

    @model_validator(mode="after")
    def _decode_knobs_need_the_worker(self) -> PipelineConfig:
        if not self.decode_worker:
            for key in ("decode_processes", "decode_priority"):
                if key in self.model_fields_set and getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"{key}: only used with decode_worker: true, and decode_worker is false "
                                     "(decoding runs on the event loop's thread), so it would have no effect; "
                                     f"fix: remove {key}, or set decode_worker: true")
        return self

    @model_validator(mode="after")
    def _search_before_timeout(self) -> PipelineConfig:
        look, order = self.lookback, self.ordering
        if look.search_after_s is not None and look.max_records and look.search_records and order.enabled \
                and look.search_after_s >= order.hold_timeout_s:
            raise ValueError(
                f"lookback.search_after_s ({look.search_after_s:g}) must be below ordering.hold_timeout_s "
                f"({order.hold_timeout_s:g}), or a held run is released before it is searched for; lower it, "
                "or set lookback.search_records: 0")
        return self

    @property
    def search_after_s(self) -> float:
        """How long a run is held before its partition is searched further back."""
        given = self.lookback.search_after_s
        return given if given is not None else min(5.0, self.ordering.hold_timeout_s / 2)


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
        # here: the kinds' modules import this one.
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
    "finite_number": "write a finite number (.inf and .nan are refused)",
}

#: ``$${`` (a literal ``${``), or a reference: ``${NAME}``, ``${NAME:-default}`` (NAME unset
#: or empty) or ``${NAME-default}`` (NAME unset), as in the shell. A default holds no ``}``
#: and no ``${`` (no nesting). A ``$`` not followed by ``{`` is kept as it is.
_ENV = re.compile(r"\$\$\{"
                  r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>(?:[^$}]|\$(?!\{))*))?\}")

_ENV_FORMS = ("write ${NAME}, ${NAME:-default} (NAME unset or empty) or ${NAME-default} (NAME unset), "
              "with a plain default (no ${...} inside: set the variable itself, or write the value), "
              "or $${ for a literal ${")


def _interpolate(value: Any, where: str) -> Any:
    """``value`` with its environment references replaced. Refused, naming the key but never
    the value (it may hold a secret): a reference to an unset variable without a default,
    and a ``${`` that is not a reference (nested, ``${NAME:?message}``, a typo). What a
    variable holds is taken as it is (a ``${`` in a password stays)."""
    if isinstance(value, str):
        if "$" not in value:
            return value
        if "${" in _ENV.sub(" ", value):  # what is left once the references are out
            raise ConfigError(f"{where}: a ${{ that is not an environment reference (nested, ${{NAME:?message}}, "
                              f"a typo); {_ENV_FORMS}")

        def sub(m: re.Match[str]) -> str:
            name, op, default = m.group("name"), m.group("op"), m.group("default")
            if name is None:
                return "${"
            found = os.environ.get(name)
            if op is not None and (found is None or (op == ":-" and not found)):
                return default
            if found is None:
                raise ConfigError(f"{where}: environment variable {name} is not set; export it or write "
                                  f"${{{name}:-default}}")
            return found
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


class _Loader(yaml.SafeLoader):
    """Safe YAML whose numbers are YAML 1.2's: ``0755`` and ``12:30`` stay text, where
    YAML 1.1 read them as octal and base 60 (493 and 750): a property, a numeric password or
    an id with a leading zero changed silently on its way to librdkafka."""


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        raw = yaml.load(p.read_text(), Loader=_Loader) or {}  # noqa: S506 - a SafeLoader
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
