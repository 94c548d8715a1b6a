"""Relay configuration: validated once at start-up into frozen, typed objects.

Sources, in precedence order: command-line flags > YAML file > defaults. YAML values may
reference environment variables as ``${NAME}``, ``${NAME:-default}`` (NAME unset or empty)
or ``${NAME-default}`` (NAME unset), for secrets; ``$${`` is a literal ``${``, and any
other ``${`` is refused (see :mod:`relay.config_file`).
Unknown keys and bad values raise :class:`ConfigError` naming the key and the fix, every
one of them at once (:mod:`relay.config_errors` words them).
A collector's own settings are in :mod:`relay.sinks.config`, the ``kafka:`` section's in
:mod:`relay.source.config` (both re-exported here).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from relay.config_errors import error_lines, where
from relay.config_file import Loc, inline_secrets, interpolate, read_yaml
from relay.errors import ConfigError
from relay.event_loop import EventLoopSetting, check_setting
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
    "ConfigFile", "build_config", "load_config", "load_yaml", "merge", "read_config", "resolve_workers",
]

#: The cgroup v2 CPU quota of this process's container: ``QUOTA PERIOD``, or ``max PERIOD``.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
#: Where cgroup v1 mounts the cpu controller (its ``cpu.cfs_quota_us``, -1: no limit, and
#: ``cpu.cfs_period_us``), by distribution: alone, or joined with cpuacct.
CGROUP_V1_CPU_DIRS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
MAX_WORKERS = 64


def resolve_workers(setting: int | str, cpu_max: Path = CGROUP_CPU_MAX,
                    cgroup_v1: tuple[Path, ...] = CGROUP_V1_CPU_DIRS) -> tuple[int, str]:
    """How many relay processes ``workers`` means, and where that came from: a number as it
    is (``config``); ``auto``: the CPUs this process may run on (``affinity``), capped by its
    container's CPU quota (``cgroup v2``: ``cpu.max``; else ``cgroup v1``: the cfs quota over
    the cfs period), rounded up (1.5 CPUs is 2), at least 1 and at most :data:`MAX_WORKERS`.
    No quota, or no such file: the affinity alone."""
    if setting != "auto":
        return int(setting), "config"
    cpus, source = len(os.sched_getaffinity(0)), "affinity"
    quota = _cgroup_quota(cpu_max, cgroup_v1)
    if quota is not None and quota[0] < cpus:
        cpus, source = quota
    return max(1, min(cpus, MAX_WORKERS)), source


def _cgroup_quota(cpu_max: Path, cgroup_v1: tuple[Path, ...]) -> tuple[int, str] | None:
    """The container's CPU quota in whole CPUs (rounded up) and the cgroup version it came
    from; None: no quota (``max``, -1), or no cgroup file to read it from."""
    try:  # cgroup v2
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else _whole_cpus(int(quota), int(period), "cgroup v2")
    except (OSError, ValueError):  # not mounted (or unreadable): cgroup v1, if any
        pass
    for directory in cgroup_v1:
        try:
            quota_us = int((directory / "cpu.cfs_quota_us").read_text())
            return _whole_cpus(quota_us, int((directory / "cpu.cfs_period_us").read_text()), "cgroup v1")
        except (OSError, ValueError):
            continue
    return None


def _whole_cpus(quota: int, period: int, source: str) -> tuple[int, str] | None:
    return (math.ceil(quota / period), source) if quota > 0 and period > 0 else None


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
    #: event loop's thread (one process, slower). With ``workers`` above 1 the default is
    #: false (see RelayConfig.workers), unless given here.
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
    #: Relay processes in this pod, one consumer-group member each, under one supervisor
    #: that serves the HTTP endpoint (see relay.workers); ``auto``: one per CPU this process
    #: may use (affinity, capped by the cgroup quota). With more than one, each decodes on
    #: its own event loop's thread (``pipeline.decode_worker`` defaults to false; a decode
    #: child per worker measured slower). On cores shared with the collector it gained
    #: nothing; the pipeline alone gained ~11% with two (bench/README.md, *Workers*).
    workers: int | Literal["auto"] = 1
    #: The event loop of the relay's processes (see relay.event_loop): ``auto``, uvloop when
    #: it can be imported, else asyncio's own; ``uvloop`` is refused when it is not installed.
    event_loop: EventLoopSetting = "auto"

    @field_validator("collectors", mode="before")
    @classmethod
    def _collectors_by_kind(cls, v: Any) -> Any:
        # Each entry is validated by its kind's config class, chosen by its ``type``. Imported
        # here: the kinds' modules import this one.
        from relay.sinks.kinds import validate_collectors

        return validate_collectors(v)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():  # --workers 2, ${WORKERS}
            v = int(v)
        if v == "auto" or (type(v) is int and 1 <= v <= MAX_WORKERS):
            return v
        raise ValueError(f"must be a whole number from 1 to {MAX_WORKERS}, or auto (one per CPU this process may "
                         "use); fix: write workers: 2, or workers: auto, or leave it out for 1")

    @field_validator("event_loop", mode="before")
    @classmethod
    def _event_loop(cls, v: Any) -> Any:
        return check_setting(v)

    @model_validator(mode="after")
    def _workers_decode_inline(self) -> RelayConfig:
        # More than one worker: each decodes on its own thread, unless decode_worker was given.
        # ``auto`` counts as several, unresolved: the same file validates the same on any machine.
        pipeline = self.pipeline
        if self.workers != 1 and "decode_worker" not in pipeline.model_fields_set:
            defaults = PipelineConfig.model_fields
            for key in ("decode_processes", "decode_priority"):
                if key in pipeline.model_fields_set and getattr(pipeline, key) != defaults[key].default:
                    raise ValueError(f"pipeline.{key}: only used with decode_worker: true, and with workers above 1 "
                                     "or auto, decode_worker defaults to false (each worker decodes on its own "
                                     f"thread); fix: set pipeline.decode_worker: true, or remove pipeline.{key}")
            # Frozen: set once here, while the model is being validated.
            object.__setattr__(self, "pipeline", pipeline.model_copy(update={"decode_worker": False}))
        return self

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
            # A kind's default mode (type: atlan is consolidated) is not in the user's file: say where it comes from.
            defaulted = sorted({f"type: {c.type} defaults to mode: {c.mode}" for c in self.collectors
                                if c.mode != "passthrough" and "mode" not in c.model_fields_set})
            raise ValueError(f"kafka.topics: collectors {', '.join(stateful)} keep run state partitioned like "
                             f"the input topic, so consume exactly one topic"
                             f"{' (' + '; '.join(defaulted) + ')' if defaulted else ''}; fix: set mode: "
                             "passthrough on those collectors (events sent as they come, no run state), or consume "
                             "one topic (run one relay per topic)")
        if stateful and self.kafka.run_state_topic in (*self.kafka.topics, self.kafka.dlq_topic):
            raise ValueError("kafka.state_topic: must differ from the consumed and dead-letter topics")
        return self

    @property
    def keeps_run_state(self) -> bool:
        """Whether any collector holds runs (consolidated/coalesce), hence needs the state topic."""
        return any(c.mode != "passthrough" for c in self.collectors)


def _validation_lines(data: dict[str, Any], skip: tuple[Loc, ...] = ()) -> list[str]:
    try:
        RelayConfig.model_validate(data)
    except ValidationError as err:
        return error_lines(err, data, RelayConfig, skip)
    return []


def _invalid(lines: list[str]) -> ConfigError:
    return ConfigError("invalid configuration:\n  " + "\n  ".join(lines))


def build_config(data: dict[str, Any]) -> RelayConfig:
    """Validate a plain dict (already env-interpolated) into a RelayConfig."""
    try:
        return RelayConfig.model_validate(data)
    except ValidationError as err:
        raise _invalid(error_lines(err, data, RelayConfig)) from None


@dataclass(frozen=True)
class ConfigFile:
    """A configuration file read: its data (references replaced), and what to warn about
    though it is valid (a secret written in the file), each naming the key, never the value."""

    data: dict[str, Any]
    inline_secrets: tuple[str, ...] = ()

    def warnings(self) -> list[str]:
        return [f"{key}: a secret written in the file itself (not ${{NAME}}); fix: take it from an environment "
                "variable (key: ${NAME}, set from a Kubernetes Secret)"
                + (", or use token_env or token_file" if key.endswith(".token") else "")
                for key in self.inline_secrets]


def read_config(path: str | Path, content: bytes | None = None) -> ConfigFile:
    """The file at ``path`` (or its ``content``, already read), its references replaced.
    Raises :class:`ConfigError` listing every unset variable and every ``${`` that is no
    reference, with what else is wrong in the file (its other keys validated as they are)."""
    raw = read_yaml(path, content)
    found = interpolate(raw)
    if found.problems:
        lines = [f"{where(loc, found.data)}: {msg}" for loc, msg in found.problems]
        raise _invalid(lines + _validation_lines(found.data, tuple(loc for loc, _ in found.problems)))
    inline = inline_secrets(raw, found.referenced)
    return ConfigFile(found.data, tuple(where(loc, found.data) for loc in inline))


def load_yaml(path: str | Path) -> dict[str, Any]:
    return read_config(path).data


def load_config(path: str | Path) -> RelayConfig:
    return build_config(load_yaml(path))


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into ``base`` (flags over file)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
