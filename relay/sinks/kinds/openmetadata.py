"""``type: openmetadata``: OpenMetadata's OpenLineage API.

``POST <url>/api/v1/openlineage/lineage`` takes one RunEvent; ``POST
<url>/api/v1/openlineage/lineage/batch`` takes ``{"events": [...]}`` and answers 200 with
``status`` (``success``, ``partial_success``, ``failure``), a ``summary`` and
``failedEvents`` (``index``, ``reason``, ``retriable``); events it took with some datasets
unresolved count in ``summary.partial`` and ``unresolvedDatasets``, not in ``failedEvents``
(delivered: they are not sent again). The newest releases answer 400 with ``failedEvents``
when every event of the batch failed: read per event too. Its single endpoint answers an
exception with 500, so an event it fails on is dead-lettered after
``retry.poison_after_attempts`` (:mod:`relay.sinks.http`). Both need an OpenMetadata JWT as
``Authorization: Bearer <jwt>`` (required here; a bot's token from ``token_file`` rotates
without restart). RunEvents only. Batch delivery is on by default (``batch: null`` sends
one event per request). OpenMetadata only turns COMPLETE events into lineage and skips the
others (answering success): a ``route`` with ``event_types: [COMPLETE]`` saves the traffic.
"""

from __future__ import annotations

from typing import ClassVar

from relay.config import BatchConfig, CollectorConfig, EventKind
from relay.sinks.envelope import enclose
from relay.sinks.kinds.base import CollectorKind


def events_object(bodies: list[bytes]) -> bytes:
    """OpenMetadata's batch body: ``{"events": [...]}``."""
    return enclose(b'{"events":[', bodies, b"]}")


class OpenMetadataConfig(CollectorConfig):
    needs_token: ClassVar[bool] = True

    type: str = "openmetadata"
    endpoint: str = "/api/v1/openlineage/lineage"
    event_kinds: tuple[EventKind, ...] = ("run",)
    batch: BatchConfig | None = BatchConfig()


class OpenMetadataKind(CollectorKind):
    kind = "openmetadata"
    config_class = OpenMetadataConfig
    success_statuses = frozenset({200})
    permanent_statuses = frozenset({400, 401, 403})
    batch_envelope = staticmethod(events_object)
