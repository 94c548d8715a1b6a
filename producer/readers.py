"""The OpenLineage ecosystem's configuration sources, each read as the official clients
read it: openlineage.yml, the ``OPENLINEAGE__TRANSPORT*`` environment variables and Spark
conf (merged by :mod:`producer.sources`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("producer.config")

_SPARK = "spark.openlineage."
_ENV = "OPENLINEAGE__TRANSPORT__"
_ENV_SECTION = "OPENLINEAGE__TRANSPORT"

TRANSPORT_TYPES = frozenset({
    "kafka", "lineage-relay", "lineage_relay",
    "producer.openlineage_transport.LineageRelayTransport",
})

_logged: set[str] = set()


def log_once(level: int, key: str, msg: str, *args: Any) -> None:
    """Log ``msg`` the first time ``key`` is seen in this process (config is read more than once)."""
    if key not in _logged:
        _logged.add(key)
        log.log(level, msg, *args)


def is_ours(transport_type: Any) -> bool:
    return transport_type is None or str(transport_type) in TRANSPORT_TYPES


def disabled(environ: Mapping[str, str]) -> bool:
    """``OPENLINEAGE_DISABLED=true``: the official clients then emit nothing."""
    return environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true"


@dataclass
class Source:
    """One source's transport section, as the official clients would see it."""

    where: str
    section: dict[str, Any]
    origin: Callable[[str], str]
    # True when the source names our transport type itself: an unknown key in it is a mistake;
    # in any other source it is skipped, logged at ``level``.
    declares_ours: bool = False
    level: int = logging.WARNING


def find_yaml(environ: Mapping[str, str], cwd: Path, home: Path) -> Path | None:
    """The openlineage.yml the OpenLineage clients would read (the first readable one), or None."""
    candidates = [environ.get("OPENLINEAGE_CONFIG"), cwd / "openlineage.yml",
                  home / ".openlineage" / "openlineage.yml"]
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate)
        try:
            if path.is_file():
                if os.access(path, os.R_OK):
                    return path
                log_once(logging.WARNING, f"unreadable:{path}",
                         "event=openlineage_yml_ignored path=%s reason=not readable fix=make it readable or "
                         "remove it; the next candidate is used", path)
        except OSError as err:
            log_once(logging.WARNING, f"unreadable:{path}",
                     "event=openlineage_yml_ignored path=%s reason=%s fix=make it readable or remove it", path, err)
    return None


def yaml_source(path: Path | None) -> Source | None:
    if path is None:
        return None
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        reason = " ".join(str(err).split())
        log_once(logging.WARNING, f"badyaml:{path}",
                 "event=openlineage_yml_ignored path=%s reason=cannot read it as YAML (%s) fix=correct or remove "
                 "the file; it is read as empty", path, reason)
        return None
    section = doc.get("transport") if isinstance(doc, dict) else None
    if section is None:
        if not isinstance(doc, dict):
            log_once(logging.WARNING, f"badyaml:{path}",
                     "event=openlineage_yml_ignored path=%s reason=not a YAML mapping fix=give it a 'transport:' "
                     "section; it is read as empty", path)
        return None
    if not isinstance(section, dict):
        log_once(logging.WARNING, f"badyaml:{path}",
                 "event=openlineage_yml_ignored path=%s reason='transport' is not a mapping fix=write it as "
                 "'transport:' followed by indented keys; it is read as empty", path)
        return None
    where = f"{path}: transport"
    return Source(where, section, lambda key: f"{where}.{key}",
                   declares_ours=section.get("type") is not None and is_ours(section.get("type")))


def _env_value(raw: str) -> Any:
    # Only a JSON object or array is structure; "123" or "true" is text the field converts
    # as it needs (a topic named 123 stays a string).
    if raw.lstrip()[:1] not in ("{", "["):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def env_json_section(environ: Mapping[str, str]) -> dict[str, Any]:
    raw = environ.get(_ENV_SECTION)
    if not raw:
        return {}
    value = _env_value(raw)
    if not isinstance(value, dict):
        log_once(logging.WARNING, f"badjson:{raw}",
                 "event=env_transport_ignored var=%s reason=not a JSON object fix=set it to the transport "
                 "section as JSON, e.g. '{\"type\": \"kafka\", \"topic\": \"openlineage\"}', or unset it",
                 _ENV_SECTION)
        return {}
    return value


def env_source(environ: Mapping[str, str]) -> tuple[Source | None, list[str]]:
    """The ``OPENLINEAGE__TRANSPORT*`` variables as one section, and the nested variables
    (settings of other transports, never read)."""
    section: dict[str, Any] = {}
    origins: dict[str, str] = {}
    props: dict[str, Any] = {}
    nested: list[str] = []
    for var, raw in sorted(environ.items()):
        if not var.startswith(_ENV):
            continue
        parts = var[len(_ENV):].lower().split("__")
        if len(parts) == 2 and parts[0] in ("properties", "config"):
            props[parts[1]] = raw          # BOOTSTRAP_SERVERS: read as bootstrap.servers
            origins.setdefault("properties", f"{_ENV}{parts[0].upper()}__*")
        elif len(parts) == 1:
            section[parts[0]] = _env_value(raw)
            origins[parts[0]] = var
        else:
            nested.append(var)
    if props:
        given = section.get("properties", section.get("config"))
        section["properties"] = {**props, **(given if isinstance(given, dict) else {})}
        section.pop("config", None)
    whole = env_json_section(environ)
    for key, value in whole.items():   # the whole section as JSON wins over single variables
        key = str(key).lower()
        if isinstance(value, dict) and isinstance(section.get(key), dict):
            value = {**section[key], **value}
        section[key] = value
        origins[key] = f"{_ENV_SECTION}.{key}"
    if not section:
        return None, nested
    declares = section.get("type") is not None and is_ours(section.get("type"))
    return Source("env", section, lambda key: origins.get(key, f"{_ENV}{key.upper()}"),
                   declares_ours=declares, level=logging.INFO), nested


def spark_source(conf: Mapping[str, str]) -> Source | None:
    prefix = _SPARK + "transport."
    section: dict[str, Any] = {}
    for key, value in conf.items():
        if key.startswith(prefix + "properties."):
            section.setdefault("properties", {})[key[len(prefix + "properties."):]] = value
        elif key.startswith(prefix):
            section[key[len(prefix):]] = value
    if not section:
        return None
    declares = section.get("type") is not None and is_ours(section.get("type"))

    def origin(key: str) -> str:
        return prefix + ("properties.*" if key == "properties" else key)
    return Source(_SPARK + "transport", section, origin, declares_ours=declares)


def env_foreign_keys(environ: Mapping[str, str]) -> set[str]:
    """Transport keys (lower case) the ``OPENLINEAGE__TRANSPORT*`` variables bring that need not
    be ours: every nested one (``AUTH__*``, ``TRANSPORTS__*``: never a setting of this
    transport), and all of them unless the variables themselves name our type."""
    whole = env_json_section(environ)
    own_type = whole.get("type", environ.get(_ENV + "TYPE"))
    declares = own_type is not None and is_ours(own_type)
    keys: set[str] = set()
    for var in environ:
        if var.startswith(_ENV):
            parts = var[len(_ENV):].lower().split("__")
            if not declares or (len(parts) > 1 and parts[0] not in ("properties", "config")):
                keys.add(parts[0])
    if not declares:
        keys.update(str(k).lower() for k in whole)
    return keys
