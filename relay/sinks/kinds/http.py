"""``type: http`` (the default): any endpoint that speaks the OpenLineage HTTP API.

Events are POSTed one per request to ``<url><endpoint>`` (default ``/api/v1/lineage``),
or, with ``batch:``, as a JSON array to the spec's ``POST <endpoint>/batch`` with per-event
partial success (:mod:`relay.sinks.batch_reply`). Every event kind is sent; any 2xx is
success; 408, 429 and 5xx are retried; other 4xx are permanent.
"""

from __future__ import annotations

from relay.config import CollectorConfig
from relay.sinks.kinds.base import CollectorKind


class HttpKind(CollectorKind):
    kind = "http"
    config_class = CollectorConfig
