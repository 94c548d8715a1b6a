"""``type: datahub``: DataHub GMS's OpenLineage endpoint.

``POST <gms-url>/openapi/openlineage/api/v1/lineage``, one RunEvent per request, with a
DataHub access token as ``Authorization: Bearer <token>`` (when GMS has metadata-service
authentication on, which is the default in recent releases). DataHub converts RunEvents
only: DatasetEvents and JobEvents are not sent (counted as dropped, reason
``unsupported_event_kind``); set ``event_kinds`` if your release takes them. Answers 200
or 201 on success; 400 (malformed), 401/403 (credentials, rights) and 422 (could not be
converted) are permanent. No batch endpoint.
"""

from __future__ import annotations

from typing import ClassVar

from relay.config import CollectorConfig, EventKind
from relay.sinks.kinds.base import CollectorKind


class DataHubConfig(CollectorConfig):
    supports_batch: ClassVar[bool] = False

    type: str = "datahub"
    endpoint: str = "/openapi/openlineage/api/v1/lineage"
    event_kinds: tuple[EventKind, ...] = ("run",)


class DataHubKind(CollectorKind):
    kind = "datahub"
    config_class = DataHubConfig
    success_statuses = frozenset({200, 201})
    permanent_statuses = frozenset({400, 401, 403, 422})
