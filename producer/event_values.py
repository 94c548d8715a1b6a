"""What ``LineageProducer.emit`` accepts as an OpenLineage event: a pure conversion, no I/O.

An event is a ``dict`` (what :mod:`producer.events` builds), an openlineage-python event
object (``RunEvent``, ``DatasetEvent``, ``JobEvent``: converted with its ``Serde.to_dict``, as
the official transports do), or the text of a JSON object (``str`` or UTF-8 ``bytes``; an
integer beyond 64 bits in it is kept, as in a dict: :func:`producer.codec.json_text.loads`).
Anything else (``None``, a number, a list, text that is not a JSON object) is not an event:
:func:`as_event` raises :class:`NotAnEvent`, and ``emit`` drops it with reason
``not_an_event`` before it reaches the journal or Kafka (the relay would only dead-letter it).
Whether a dict holds a valid event is the relay's to judge; it is not checked here.

:func:`plain` converts the openlineage-python objects (facets, datasets) found inside a value
given to an event builder or ``lineage_job`` the same way, so the JSON encoder never meets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from producer.codec.json_text import loads

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
            doc = loads(value)  # an integer beyond 64 bits stays that integer (orjson: a float)
        except orjson.JSONDecodeError:
            raise NotAnEvent(f"{type(value).__name__} that is not JSON text; an event is {_ACCEPTED}") from None
        if not isinstance(doc, dict):
            raise NotAnEvent(f"JSON text of a {type(doc).__name__}, not an object; an event is {_ACCEPTED}")
        return doc
    if _is_openlineage_object(value):
        from openlineage.client.serde import Serde

        doc = Serde.to_dict(value)
        if isinstance(doc, dict):
            return doc
    raise NotAnEvent(f"{type(value).__name__} is not an OpenLineage event; an event is {_ACCEPTED}")


def _is_openlineage_object(value: Any) -> bool:
    """An openlineage-python attrs object (an event, a facet, a dataset)."""
    cls = type(value)
    return str(getattr(cls, "__module__", "")).startswith("openlineage.") and hasattr(cls, "__attrs_attrs__")


def plain(value: Any, what: str) -> Any:
    """``value`` with every openlineage-python object in it (a facet such as
    ``SchemaDatasetFacet``, an ``InputDataset``), at any depth of its dicts, lists and tuples,
    converted to a dict with openlineage-python's ``Serde.to_dict``, as :func:`as_event` and
    the official transports convert an event. Everything else is kept as given, and ``value``
    itself is returned when nothing in it was converted. A conversion that fails raises
    ValueError naming ``what`` and the object's type."""
    if _is_openlineage_object(value):
        try:
            from openlineage.client.serde import Serde

            return Serde.to_dict(value)
        except Exception as err:  # noqa: BLE001 - any failure is this argument's
            raise ValueError(f"{what}: the openlineage-python {type(value).__name__} could not be converted "
                             f"with Serde.to_dict ({type(err).__name__})") from None
    if isinstance(value, dict):
        out = None
        for key, item in value.items():
            new = plain(item, what)
            if new is not item:
                out = dict(value) if out is None else out
                out[key] = new
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [plain(item, what) for item in value]
        return items if any(new is not old for new, old in zip(items, value)) else value
    return value


def check_encodable(value: Any, what: str) -> None:
    """ValueError naming ``what`` when the producer's JSON encoding cannot carry ``value`` (an
    object JSON has no form for): the event holding it would be dropped as unencodable."""
    try:
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError) as err:
        raise ValueError(f"{what} cannot be encoded as JSON ({err}); give JSON values (dict, list, str, "
                         "number, bool, None) or openlineage-python facet/dataset objects") from None
