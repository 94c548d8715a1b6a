"""The contract of a collector kind: its config class and what its HTTP API promises.

A kind is a small class naming, as class attributes, what a collector of that kind
checks and answers; :meth:`CollectorKind.build` makes the collector. The config class
(a :class:`~relay.config.CollectorConfig` subclass) carries the kind's defaults: URL
shape and endpoint, delivery mode, event kinds accepted, size limit, batch endpoint.

A third-party kind subclasses :class:`CollectorKind` and is named by its dotted path in
``type:`` (``type: mypackage.collectors.Acme``); it may override :meth:`build` to return
any object with the :class:`~relay.sinks.base.Collector` protocol.
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from relay.config import CollectorConfig
from relay.metrics import CollectorMetrics
from relay.sinks.base import Collector, Undeliverable
from relay.sinks.batch import BatchCollector
from relay.sinks.envelope import Envelope, json_array
from relay.sinks.http import HttpCollector
from relay.sinks.retry import Verdict, classify


class CollectorKind:
    #: The ``type:`` value that picks this kind.
    kind: ClassVar[str] = ""
    config_class: ClassVar[type[CollectorConfig]] = CollectorConfig
    #: What the collector answers for an accepted event (other 2xx count as success too).
    success_statuses: ClassVar[frozenset[int]] = frozenset()
    #: What it answers for an event it will never accept (dead-lettered, not retried).
    #: Statuses in neither set follow :func:`relay.sinks.retry.classify`: 2xx success;
    #: 408, 429, 5xx and no answer retried; any other 4xx permanent.
    permanent_statuses: ClassVar[frozenset[int]] = frozenset()
    #: How a batch request body wraps the events (kinds with a batch endpoint).
    batch_envelope: ClassVar[Envelope] = staticmethod(json_array)

    @classmethod
    def classify(cls, status: int | None) -> Verdict:
        if status in cls.success_statuses:
            return Verdict.SUCCESS
        if status in cls.permanent_statuses:
            return Verdict.REJECT
        return classify(status)

    @classmethod
    def refusal(cls, config: CollectorConfig, status: int, body: bytes) -> Undeliverable | None:
        """A failure the service answers for one known cause, told by its status and the
        first bytes of its body: the dead letter, with a reason of its own (logged once per
        collector), or None for the generic policy. Pure. Asked for every answer to a single
        event that is not a success, before the verdict: a recognised 401 is not retried for
        a ``token_file``."""
        return None

    @classmethod
    def build(cls, config: CollectorConfig, metrics: CollectorMetrics) -> Collector:
        """The collector for ``config`` (an instance of :attr:`config_class`)."""
        plain = not cls.success_statuses and not cls.permanent_statuses
        verdict = classify if plain else cls.classify
        own = getattr(cls.refusal, "__func__", None) is not CollectorKind.refusal.__func__
        refuse = partial(cls.refusal, config) if own else None
        if config.batch is not None:
            return BatchCollector(config, metrics, verdict, cls.batch_envelope, refuse)
        return HttpCollector(config, metrics, verdict, refuse)
