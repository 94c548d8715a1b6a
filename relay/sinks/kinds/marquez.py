"""``type: marquez``: Marquez's lineage API.

``POST <url>/api/v1/lineage``, one event per request; Marquez answers 201 when it stored
the event, 400 for a body it cannot read and 422 for an event that fails its validation
(both permanent: dead-lettered). It takes RunEvents, DatasetEvents and JobEvents. It has
no batch endpoint. Authentication is optional (Marquez has none; a proxy in front may want
a bearer token).
"""

from __future__ import annotations

from typing import ClassVar

from relay.config import CollectorConfig
from relay.sinks.kinds.base import CollectorKind


class MarquezConfig(CollectorConfig):
    supports_batch: ClassVar[bool] = False

    type: str = "marquez"


class MarquezKind(CollectorKind):
    kind = "marquez"
    config_class = MarquezConfig
    success_statuses = frozenset({201})
    permanent_statuses = frozenset({400, 422})
