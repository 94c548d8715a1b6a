"""``DisabledProducer``: what ``LineageProducer(...)`` builds while ``OPENLINEAGE_DISABLED=true``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from producer.config import ProducerConfig
from producer.kafka import LineageProducer
from producer.stats import ProducerStats

log = logging.getLogger("producer.kafka")


class DisabledProducer(LineageProducer):
    """What ``LineageProducer(...)`` (or a subclass's constructor) builds while
    ``OPENLINEAGE_DISABLED=true``, as the official clients fall back to a no-op transport: it
    reads no configuration source, connects to nothing and drops every event (counted in
    ``stats.emitted``). Logged once per process. ``config`` is the config given, else
    ProducerConfig's defaults (``bootstrap_servers`` empty), with the keyword overrides that
    name its fields applied as given (not validated: nothing uses them)."""

    def __init__(self, config: ProducerConfig | None = None, **overrides: Any) -> None:
        global _disabled_logged
        base = config if config is not None else ProducerConfig.model_construct(bootstrap_servers="")
        self.config = base.model_copy(update={k: v for k, v in overrides.items()
                                              if k in ProducerConfig.model_fields and v is not None})
        self._count_lock = threading.RLock()   # stats in a signal handler that interrupted emit()
        self._emitted = 0
        if not _disabled_logged:
            _disabled_logged = True
            log.info("event=lineage_disabled reason=OPENLINEAGE_DISABLED=true fix=unset it to send lineage; "
                     "events are dropped")

    def emit(self, event: dict) -> None:
        with self._count_lock:
            self._emitted += 1

    @property
    def pending(self) -> int:
        return 0

    def flush(self, timeout_s: float | None = None) -> int:
        return 0

    def settle(self, timeout_s: float | None = None) -> int:
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        pass

    @property
    def stats(self) -> ProducerStats:
        with self._count_lock:
            return ProducerStats(emitted=self._emitted, delivered=0, journaled=0, replayed=0,
                                 delivery_failures=0, errors=0, mode="disabled")

    def drop(self, reason: str, detail: object, key: bytes | None = None) -> None:
        pass


_disabled_logged = False
_DISABLED_CLASSES: dict[type, type] = {}


def disabled_class(cls: type) -> type:
    """What ``cls(...)`` builds while OpenLineage is disabled: :class:`DisabledProducer` for
    ``LineageProducer`` itself; for a subclass, one that is both (its own methods first,
    calling down to the disabled ones), so ``isinstance`` and the subclass's additions still
    hold; a subclass of DisabledProducer itself."""
    if cls is LineageProducer:
        return DisabledProducer
    if issubclass(cls, DisabledProducer):
        return cls
    if cls not in _DISABLED_CLASSES:
        _DISABLED_CLASSES[cls] = type(f"Disabled{cls.__name__}", (cls, DisabledProducer),
                                      {"__module__": cls.__module__, "__doc__": DisabledProducer.__doc__})
    return _DISABLED_CLASSES[cls]
