"""The ``kafka:`` section of the relay's configuration (re-exported by :mod:`relay.config`):
brokers, topics, group, the relay's own topics and the librdkafka properties, validated
once at start-up; properties are checked by librdkafka itself, offline, with the relay's
own defaults under them, and those the relay sets itself are refused rather than
overridden. Messages name the key and what is wrong, never the value.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from relay.frozen import Frozen
from relay.source.consumer_config import PRODUCER_DEFAULTS, RELAY_SETS
from relay.source.properties import problem as properties_problem

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _topic_name(name: str, which: str = "") -> str:
    """``name`` if Kafka takes it as a topic name, else ValueError saying what is wrong with
    it (never the name itself: it may come from an environment variable)."""
    if _TOPIC_NAME.fullmatch(name) is None or name in (".", ".."):
        if not name:
            why = "is empty"
        elif len(name) > 249:
            why = f"is {len(name)} characters long"
        elif name in (".", ".."):
            why = "is '.' or '..'"
        else:
            bad = {c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))}
            kinds = [what for what, hit in (("a space", " " in bad), ("','", "," in bad),
                                            ("a control character", any(not c.isprintable() for c in bad)),
                                            ("a non-ASCII character", any(not c.isascii() for c in bad)))
                     if hit]
            others = sorted(c for c in bad if c.isascii() and c.isprintable() and c not in " ,")
            why = "holds " + ", ".join([*kinds, *(repr(c) for c in others)])
        raise ValueError(f"{which or 'the name'} is not a Kafka topic name (it {why}); use letters, digits, '.', "
                         "'_' and '-' only (at most 249); several topics are a list, or one string separated by commas")
    return name


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
    #: Replication factor of the topics the relay creates (dead-letter, run-state, redrive
    #: markers); None: the cluster's ``default.replication.factor`` (Kafka 2.4+, KIP-464).
    topic_replication_factor: int | None = Field(None, ge=1)

    @property
    def run_state_topic(self) -> str:
        return self.state_topic or f"{self.group_id}.run-state"

    @field_validator("bootstrap_servers")
    @classmethod
    def _some_broker(cls, v: str) -> str:
        if not any(host.strip() for host in v.split(",")):
            raise ValueError("must list at least one broker as host:port, e.g. kafka:9092 (an environment "
                             "variable set but empty gives ''; set it, or write ${NAME:-kafka:9092})")
        for i, entry in enumerate(host.strip() for host in v.split(",")):
            if "/" in entry:  # a scheme (http://, SASL_SSL://) or a path
                raise ValueError(f"broker {i + 1} is a URL; list brokers as host:port without a scheme or path, "
                                 "e.g. kafka:9092 (TLS and SASL are set by security.protocol in "
                                 "consumer_properties and producer_properties)")
        return v

    @field_validator("group_id")
    @classmethod
    def _group_id(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty (an environment variable set but empty gives ''; librdkafka "
                             "aborts on an empty group id); set it, write ${NAME:-lineage-relay}, or leave "
                             "group_id out for the default lineage-relay")
        if not v.isprintable():
            raise ValueError("holds a line break or a control character; set the group id alone")
        return v

    @field_validator("topics", mode="before")
    @classmethod
    def _topics(cls, v: Any) -> Any:
        # One string may list several, comma-separated (topics: ${TOPICS} with TOPICS=a,b).
        return tuple(t.strip() for t in v.split(",")) if isinstance(v, str) else v

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("must name at least one topic to consume, e.g. [openlineage]")
        for i, name in enumerate(v):
            _topic_name(name, f"topic {i + 1}" if len(v) > 1 else "")
        return v

    @field_validator("dlq_topic", "state_topic")
    @classmethod
    def _other_topic_names(cls, v: str | None) -> str | None:
        return v if v is None else _topic_name(v)

    @field_validator("consumer_properties", "producer_properties", mode="before")
    @classmethod
    def _props(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): str(val).lower() if isinstance(val, bool) else str(val) for k, val in v.items()}
        return v

    @field_validator("consumer_properties")
    @classmethod
    def _consumer_properties(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            fix = RELAY_SETS.get(key.strip())
            if fix is not None:
                raise ValueError(f"{key}: the relay sets it itself, so this value would be ignored; fix: {fix}")
        protocol = v.get("group.protocol", "classic").strip().lower()
        if protocol != "classic":
            # KIP-848: the broker assigns partitions and owns the session timeout; the relay's
            # rebalance handling and defaults (session.timeout.ms, cooperative-sticky) are
            # those of the classic protocol, the one it is tested with.
            raise ValueError("group.protocol: only classic is supported (the relay runs its consumer group "
                             "with the classic protocol); fix: remove it, or set it to classic")
        found = properties_problem(v, "consumer")  # librdkafka's own check, offline
        if found is not None:
            raise ValueError(found)
        return v

    @field_validator("producer_properties")
    @classmethod
    def _producer_properties(cls, v: dict[str, str]) -> dict[str, str]:
        for key in ("bootstrap.servers", "metadata.broker.list"):
            if key in v:
                raise ValueError(f"{key}: the relay sets it itself, so this value would be ignored; "
                                 "fix: remove it, and set kafka.bootstrap_servers")
        for key in ("acks", "request.required.acks"):
            if key in v and v[key].strip().lower() not in ("all", "-1"):
                # Dead letters and run state are written with enable.idempotence: true, which
                # librdkafka refuses with any other acks (and they must not be lost).
                raise ValueError(f"{key}: the relay writes dead letters and run state idempotently, which needs "
                                 f"{key}: all; fix: remove it (the relay sets all), or set it to all")
        if v.get("enable.idempotence", "true").strip().lower() not in ("true", "1"):
            raise ValueError("enable.idempotence: the relay's dead letters and run state must not be duplicated "
                             "or reordered; fix: remove it (the relay sets true)")
        # Checked as the relay's producers are made: with its own defaults under them.
        found = properties_problem(v, "producer", PRODUCER_DEFAULTS)
        if found is not None:
            raise ValueError(found + " (the relay's producers set enable.idempotence: true and acks: all)")
        return v
