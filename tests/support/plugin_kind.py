"""A third-party collector kind, as a plugin package would ship it (for the kind tests):
named in ``type:`` by its dotted path, with its own config class and collector."""

from __future__ import annotations

from relay.config import CollectorConfig
from relay.metrics import CollectorMetrics
from relay.sinks.base import Undeliverable
from relay.sinks.kinds import CollectorKind


class InboxConfig(CollectorConfig):
    type: str = "tests.support.plugin_kind.InboxKind"
    #: A plugin's own key, validated like any other.
    mailbox: str


class InboxCollector:
    """Keeps events in memory; refuses the ones containing ``refuse``, and raises (as a
    buggy plugin might) on the ones containing ``explode``."""

    def __init__(self, config: InboxConfig) -> None:
        self.name = config.name
        self.mailbox = config.mailbox
        self.events: list[bytes] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def deliver(self, body: bytes) -> Undeliverable | None:
        if b"explode" in body:
            raise RuntimeError("inbox exploded")
        if b"refuse" in body:
            return Undeliverable("collector_rejected", "inbox refuses it")
        self.events.append(body)
        return None


class InboxKind(CollectorKind):
    kind = "inbox"
    config_class = InboxConfig

    @classmethod
    def build(cls, config: CollectorConfig, metrics: CollectorMetrics) -> InboxCollector:
        assert isinstance(config, InboxConfig)
        return InboxCollector(config)


class NotAKind:
    pass
