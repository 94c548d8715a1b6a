"""lineage-relay producer library: OpenLineage events from data jobs to Kafka.

``from producer import LineageProducer, ProducerConfig``. Build events with
:mod:`producer.events` (no Kafka import needed), emit them with :class:`LineageProducer`
(never blocks, never raises, journals to disk when Kafka is away), wrap plain Python jobs
with :mod:`producer.job`, or plug the producer into openlineage-python with
:mod:`producer.openlineage_transport`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producer.errors import ConfigError, JournalError, ProducerError

if TYPE_CHECKING:
    from producer.config import ProducerConfig, load_config
    from producer.kafka import LineageProducer
    from producer.stats import ProducerStats

# Imported on first use, so `import producer.events` does not load confluent-kafka/pydantic.
_LAZY = {
    "LineageProducer": "producer.kafka",
    "ProducerStats": "producer.stats",
    "ProducerConfig": "producer.config",
    "load_config": "producer.config",
}

__all__ = ["LineageProducer", "ProducerConfig", "ProducerStats", "load_config",
           "ProducerError", "ConfigError", "JournalError"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'producer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
