"""What ``LineageProducer.emit`` accepts as an OpenLineage event: a pure conversion, no I/O.

An event is a ``dict`` (what :mod:`producer.events` builds), an openlineage-python event
object (``RunEvent``, ``DatasetEvent``, ``JobEvent``: converted with its ``Serde.to_dict``, as
the official transports do), or the text of a JSON object (``str`` or UTF-8 ``bytes``).
Anything else (``None``, a number, a list, text that is not a JSON object) is not an event:
:func:`as_event` raises :class:`NotAnEvent`, and ``emit`` drops it with reason
``not_an_event`` before it reaches the journal or Kafka (the relay would only dead-letter it).
Whether a dict holds a valid event is the relay's to judge; it is not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

_ACCEPTED = "a dict, an openlineage-python event object, or the text of a JSON object"


class NotAnEvent(TypeError):
    """The value given to emit() is not an OpenLineage event. Its message names the value's
    type, never the value (it may be a large document, or hold a secret)."""


def as_event(value: Any) -> dict:
    """``value`` as an event dict, or :class:`NotAnEvent`."""
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise NotAnEvent(f"{type(value).__name__} that is not JSON text; an event is {_ACCEPTED}") from None
        if not isinstance(doc, dict):
            raise NotAnEvent(f"JSON text of a {type(doc).__name__}, not an object; an event is {_ACCEPTED}")
        return doc
    if type(value).__module__.startswith("openlineage.") and hasattr(type(value), "__attrs_attrs__"):
        from openlineage.client.serde import Serde

        doc = Serde.to_dict(value)
        if isinstance(doc, dict):
            return doc
    raise NotAnEvent(f"{type(value).__name__} is not an OpenLineage event; an event is {_ACCEPTED}")
