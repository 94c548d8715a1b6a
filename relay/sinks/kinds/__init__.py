"""Collector kinds, chosen by ``type:`` in a collector's config.

Built in: ``http`` (generic OpenLineage HTTP, the default), ``marquez``, ``atlan``,
``datahub``, ``openmetadata``: one module each, with its contract (see
:mod:`relay.sinks.kinds.base`). Any other ``type`` is a dotted path ``package.module.Class``
to a :class:`CollectorKind` subclass, imported when the configuration is validated.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from relay.config import CollectorConfig
from relay.metrics import CollectorMetrics
from relay.sinks.base import Collector
from relay.sinks.kinds.atlan import AtlanKind
from relay.sinks.kinds.base import CollectorKind
from relay.sinks.kinds.datahub import DataHubKind
from relay.sinks.kinds.http import HttpKind
from relay.sinks.kinds.marquez import MarquezKind
from relay.sinks.kinds.openmetadata import OpenMetadataKind

BUILTIN: dict[str, type[CollectorKind]] = {
    k.kind: k for k in (HttpKind, MarquezKind, AtlanKind, DataHubKind, OpenMetadataKind)
}

__all__ = ["BUILTIN", "CollectorKind", "build_collector", "resolve_kind", "validate_collectors"]


def resolve_kind(name: str) -> type[CollectorKind]:
    """The kind ``type: name`` picks. Raises ValueError saying what to fix."""
    kind = BUILTIN.get(name)
    if kind is not None:
        return kind
    if "." not in name:
        raise ValueError(f"unknown collector type; use one of {', '.join(BUILTIN)}, "
                         "or a dotted path package.module.Class to a third-party kind")
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        # Neither the path nor the error's text (which quotes it): type may come from a variable.
        # A module it imports in turn is named (it is not part of the value).
        missing = getattr(err, "name", None)
        inner = missing is not None and not module_name.startswith(missing) and missing not in module_name
        what = f"it imports {missing}, which is not installed" if inner else type(err).__name__
        raise ValueError(f"cannot import the module of this dotted path ({what}); install the "
                         "package that provides it (pip install ...) or fix the dotted path") from None
    found = getattr(module, attr, None)
    if found is None:
        raise ValueError("the module has no class of the name the dotted path ends with; check the class name "
                         "in type")
    if not (isinstance(found, type) and issubclass(found, CollectorKind)):
        raise ValueError("the class this dotted path names is not a collector kind; it must subclass "
                         "relay.sinks.kinds.CollectorKind")
    if not (isinstance(found.config_class, type) and issubclass(found.config_class, CollectorConfig)):
        raise ValueError("the config_class of the kind this dotted path names must subclass "
                         "relay.config.CollectorConfig")
    return found


def validate_collectors(value: Any) -> Any:
    """Each collector entry validated by its kind's config class, errors located as
    ``collectors.<i>.<key>``. Entries that are already config objects pass as they are."""
    if not isinstance(value, (list, tuple)):
        return value
    out: list[Any] = []
    errors: list[InitErrorDetails] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            out.append(item)
            continue
        type_name = item.get("type", "http")
        if not isinstance(type_name, str):
            errors.append(_error((i, "type"), type_name, "must be a kind name such as marquez, or package.module.Class"))
            continue
        try:
            kind = resolve_kind(type_name)
        except ValueError as err:
            errors.append(_error((i, "type"), type_name, str(err)))
            continue
        try:
            out.append(kind.config_class.model_validate(item))
        except ValidationError as err:
            errors.extend(InitErrorDetails(type=e["type"], loc=(i, *e["loc"]), input=e.get("input"),
                                           ctx=e.get("ctx", {})) for e in err.errors())
    if errors:
        raise ValidationError.from_exception_data("collectors", errors)
    return out


def build_collector(config: CollectorConfig, metrics: CollectorMetrics) -> Collector:
    """The collector for one validated config, made by its kind."""
    return resolve_kind(config.type).build(config, metrics)


def _error(loc: tuple[Any, ...], value: Any, message: str) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError("collector_type", message), loc=loc, input=value)
