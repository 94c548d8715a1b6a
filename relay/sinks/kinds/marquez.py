"""``type: marquez``: Marquez's lineage API.

``POST <url>/api/v1/lineage``, one event per request; Marquez answers 201 when it stored
the event, 400 for a body it cannot read and 422 for an event that fails its validation
(both permanent: dead-lettered). It has no batch endpoint. Authentication is optional
(Marquez has none; a proxy in front may want a bearer token).

It takes RunEvents, DatasetEvents and JobEvents, but only 0.43.0 and later store the last
two: 0.35.0 to 0.42.x (MarquezProject/marquez#2495 to #2641/#2661) tell them apart by
their ``schemaURL`` and answer 200 without storing them ("Unsupported event type ...
Skipping without error"). Only 201 means stored, in every release, so a 200 is dead-lettered
as ``collector_skipped`` (logged once): nothing is lost, and the dead letters can be
redriven after an upgrade. On such a release, ``event_kinds: [run]`` keeps them from
being sent at all.
"""

from __future__ import annotations

from typing import ClassVar

from relay.config import CollectorConfig
from relay.sinks.base import Undeliverable
from relay.sinks.kinds.base import CollectorKind


class MarquezConfig(CollectorConfig):
    supports_batch: ClassVar[bool] = False

    type: str = "marquez"


class MarquezKind(CollectorKind):
    kind = "marquez"
    config_class = MarquezConfig
    success_statuses = frozenset({201})
    #: 200: taken but not stored (see the module's docstring; ``refusal`` names it).
    permanent_statuses = frozenset({200, 400, 422})

    @classmethod
    def refusal(cls, config: CollectorConfig, status: int, body: bytes) -> Undeliverable | None:
        if status != 200:
            return None
        return Undeliverable(
            "collector_skipped",
            "Marquez answered 200, not 201: it took the event without storing it, as Marquez 0.35.0 to 0.42.x do "
            "with DatasetEvents and JobEvents. Upgrade Marquez to 0.43.0 or later (then redrive these dead "
            "letters), or set event_kinds: [run] for this collector.", status)
