"""``type: http`` (the default): any endpoint that speaks the OpenLineage HTTP API.

Events are POSTed one per request to ``<url><endpoint>`` (default ``/api/v1/lineage``),
or, with ``batch:``, as a JSON array to ``POST <endpoint>/batch`` (the batch endpoint
OpenLineage PR #4109 proposes; not in a released spec) with per-event partial success
(:mod:`relay.sinks.batch_reply`); a 404, 405 or 501 there means there is none: single
events from then on. Every event kind is sent; any 2xx is success; 408, 429 and 5xx are
retried (an event answered a bare 500 while others are taken is given up, see
:mod:`relay.sinks.http`); other 4xx are permanent.
"""

from __future__ import annotations

from relay.config import CollectorConfig
from relay.sinks.kinds.base import CollectorKind


class HttpKind(CollectorKind):
    kind = "http"
    config_class = CollectorConfig
