"""The OpenLineage ecosystem's configuration sources, each read as the official clients
read it: openlineage.yml, the ``OPENLINEAGE__TRANSPORT*`` environment variables and Spark
conf (merged by :mod:`producer.sources`), and the settings outside ``transport`` the Spark
integration also reads from openlineage.yml and ``OPENLINEAGE__*`` (:func:`settings_sources`)."""

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
_ENV_ALL = "OPENLINEAGE__"

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
    # True when an unknown key in it is a mistake (raised): openlineage.yml and Spark conf are
    # always written for this transport once the merged type is ours, the environment only when
    # it names our type itself (other tools share OPENLINEAGE__TRANSPORT__*); otherwise an
    # unknown key is skipped, logged at ``level``.
    strict: bool = True
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


class _AsWritten:
    """A number read from openlineage.yml that keeps the text it was written as: ``str()`` is that
    text (``0123``, ``1_000``, ``12:30``, ``1.10``), so where text is expected (a librdkafka
    property, the topic, a namespace) it is read as written, as the Java integration (Jackson)
    reads it, not as YAML 1.1's number (``0123`` is octal 83); where a number is expected it is
    that number."""

    text: str
    _number: type

    def __new__(cls, value: Any, text: str) -> Any:
        obj = super().__new__(cls, value)  # type: ignore[call-arg]
        obj.text = text
        return obj

    def __str__(self) -> str:
        return self.text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._number(self), self.text))


class YamlInt(_AsWritten, int):
    """An int as written (:class:`_AsWritten`)."""

    _number = int


class YamlFloat(_AsWritten, float):
    """A float as written (:class:`_AsWritten`)."""

    _number = float


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load``, but a value that cannot be built (``since: 2024-02-30``: a date
    that does not exist) is a YAML error with its position, like any other mistake in the file,
    and a number keeps the text it was written as (:class:`YamlInt`, :class:`YamlFloat`)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        value = super().construct_yaml_int(node)
        return YamlInt(value, node.value) if node.style is None else value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> Any:
        value = super().construct_yaml_float(node)
        return YamlFloat(value, node.value) if node.style is None else value

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as err:  # noqa: BLE001 - any value the loader cannot build
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot build this value ({type(err).__name__})", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def yaml_problem(err: BaseException) -> str:
    """Why a file cannot be read, without its text: PyYAML's own message quotes the offending
    line (``sasl.password: "hunter2...``), so only the problem and where it is are kept."""
    if isinstance(err, yaml.MarkedYAMLError):
        problem = err.problem or err.context or "malformed YAML"
        mark = err.problem_mark or err.context_mark
        text = f"{problem} at {_where(mark)}" if mark is not None else problem
        if err.context_mark is not None and mark is not err.context_mark and \
                err.context_mark.line != getattr(mark, "line", None):
            text += f" (started at {_where(err.context_mark)})"
        return text
    if isinstance(err, yaml.reader.ReaderError):
        return f"{err.reason} (character {err.position})"
    if isinstance(err, UnicodeDecodeError):
        return f"not {err.encoding} text (byte {err.start})"
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    return type(err).__name__


def _yaml_doc(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader) or {}
    except Exception as err:  # noqa: BLE001 - any file that cannot be read is read as empty
        # Never str(err): PyYAML quotes the offending line, which may hold a password.
        log_once(logging.WARNING, f"badyaml:{path}",
                 "event=openlineage_yml_ignored path=%s reason=cannot read it as YAML: %s fix=correct or remove "
                 "the file; it is read as empty", path, yaml_problem(err))
        return None


def yaml_source(path: Path | None) -> Source | None:
    if path is None:
        return None
    doc = _yaml_doc(path)
    if doc is None:
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
    return Source(where, section, lambda key: f"{where}.{key}")


@dataclass
class Settings:
    """One source's settings outside ``transport`` (``namespace``, ``parentJobName``,
    ``facets``, ...), named as the Java client names them: the top level of openlineage.yml,
    or the ``OPENLINEAGE__*`` variables. ``kind`` is ``file`` or ``env``."""

    kind: str
    values: dict[str, Any]
    origin: Callable[[str], str]


def yaml_settings(path: Path | None) -> Settings | None:
    """openlineage.yml's top-level keys but ``transport`` (a malformed file is logged once, as
    by :func:`yaml_source`, and has none)."""
    doc = _yaml_doc(path) if path is not None else None
    if not isinstance(doc, dict):
        return None
    values = {str(key): value for key, value in doc.items() if str(key) != "transport"}
    return Settings("file", values, lambda key: f"{path}: {key}") if values else None


def env_settings(environ: Mapping[str, str]) -> Settings | None:
    """The ``OPENLINEAGE__*`` variables but ``OPENLINEAGE__TRANSPORT*``, nested and named as the
    Java client's ``OpenLineageEnvParser`` reads them: split at ``__``, each part from
    snake_case to camelCase (``OPENLINEAGE__PARENT_JOB_NAME`` is ``parentJobName``,
    ``OPENLINEAGE__FACETS__SCHEMA__DISABLED`` is ``facets.schema.disabled``), a JSON object or
    array value parsed, a variable merged over the ones after it in name order (a JSON object
    into the nested variables it shares a prefix with). ``OPENLINEAGE_NAMESPACE`` is the
    namespace when ``OPENLINEAGE__NAMESPACE`` is not set."""
    values: dict[str, Any] = {}
    written: list[tuple[tuple[str, ...], str, Any]] = []   # (path, variable, value), in merge order
    for var in sorted(environ, reverse=True):
        if not var.startswith(_ENV_ALL) or var == _ENV_SECTION or var.startswith(_ENV):
            continue
        parts = [_camel(part.lower()) for part in var[len(_ENV_ALL):].split("__")]
        if not all(parts):
            continue
        value: Any = _env_value(environ[var])
        written.append((tuple(parts), var, value))
        for part in reversed(parts):
            value = {part: value}
        _merge(values, value)
    if "namespace" not in values and environ.get("OPENLINEAGE_NAMESPACE"):
        values["namespace"] = environ["OPENLINEAGE_NAMESPACE"]
        written.append((("namespace",), "OPENLINEAGE_NAMESPACE", values["namespace"]))
    if not values:
        return None
    return Settings("env", values, lambda key: _env_origin(written, key))


def _env_origin(written: list[tuple[tuple[str, ...], str, Any]], key: str) -> str:
    """The variable a dotted ``key`` came from: the last merged one that holds it
    (``env OPENLINEAGE__JOB__TAGS``; ``env OPENLINEAGE__JOB: tags`` for a key inside a JSON
    object), else the first that sets something under it, else its name as the parser reads it."""
    path = tuple(key.split("."))
    for parts, var, value in reversed(written):
        rest = path[len(parts):]
        if path[:len(parts)] == parts and _holds(value, rest):
            return f"env {var}" + (f": {'.'.join(rest)}" if rest else "")
    for parts, var, _value in reversed(written):
        if parts[:len(path)] == path:
            return f"env {var}"
    return "env " + _ENV_ALL + "__".join(_snake(part).upper() for part in path)


def _holds(value: Any, rest: tuple[str, ...]) -> bool:
    for part in rest:
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


def settings_sources(environ: Mapping[str, str], cwd: Path | None = None,
                     home: Path | None = None) -> list[Settings]:
    """The settings outside ``transport`` of ``OPENLINEAGE__*`` and openlineage.yml, lowest
    precedence first (the Spark integration's order; Spark conf is above both).
    ``cwd``/``home`` default to the process's."""
    if cwd is None:
        try:
            cwd = Path.cwd()
        except OSError:   # a working directory removed under the job: no ./openlineage.yml
            cwd = Path("/nonexistent")
    path = find_yaml(environ, cwd, Path.home() if home is None else home)
    return [s for s in (env_settings(environ), yaml_settings(path)) if s is not None]


def _camel(part: str) -> str:
    head, *rest = part.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(into.get(key), dict) and isinstance(value, Mapping):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


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
        log_once(logging.WARNING, f"badjson:{hash(raw)}",
                 "event=env_transport_ignored var=%s reason=not a JSON object fix=set it to the transport "
                 "section as JSON, e.g. '{\"type\": \"kafka\", \"topicName\": \"openlineage\"}', or unset it",
                 _ENV_SECTION)
        return {}
    return value


def env_source(environ: Mapping[str, str], *, merge_json: bool = False) -> tuple[Source | None, list[str]]:
    """The ``OPENLINEAGE__TRANSPORT*`` variables as one section, and the nested variables
    (settings of other transports, never read). A valid ``OPENLINEAGE__TRANSPORT`` JSON object
    is the whole section: as in openlineage-python, the single variables are then not read
    (their names are logged once, never their values). With ``merge_json`` (the Spark
    integration, whose Java ``OpenLineageEnvParser`` merges them) the single variables are
    read too and the JSON object wins key by key (``properties`` merged property by property)."""
    nested = sorted(var for var in environ if var.startswith(_ENV) and _nested(var))
    whole = _without_blanks(env_json_section(environ), _ENV_SECTION)
    if whole and not merge_json:
        ignored = sorted(var for var in environ if var.startswith(_ENV) and not _nested(var))
        if ignored:
            log_once(logging.WARNING, "jsonwins:" + ",".join(ignored),
                     "event=env_transport_ignored vars=%s reason=%s holds the whole transport section, which "
                     "replaces them (as openlineage-python reads them) fix=move what is still needed into %s "
                     "and unset them", ",".join(ignored), _ENV_SECTION, _ENV_SECTION)
        # Lower case to find "type" however it is written; an error names the key as written.
        written = {str(key).lower(): str(key) for key in whole}
        section = {str(key).lower(): value for key, value in whole.items()}
        return Source("env", section, lambda key: f"{_ENV_SECTION}.{written.get(key, key)}",
                      strict=_names_ours(section), level=logging.INFO), nested
    section: dict[str, Any] = {}
    origins: dict[str, str] = {}
    props: dict[str, Any] = {}
    for var, raw in sorted(environ.items()):
        if not var.startswith(_ENV) or _nested(var):
            continue
        parts = var[len(_ENV):].lower().split("__")
        if len(parts) == 2 and parts[0] in ("properties", "config"):
            if not raw.strip():
                _blank_property(var)
                continue
            props[parts[1]] = raw          # BOOTSTRAP_SERVERS: read as bootstrap.servers
            origins.setdefault("properties", f"{_ENV}{parts[0].upper()}__*")
        elif len(parts) == 1:
            section[parts[0]] = _env_value(raw)
            origins[parts[0]] = var
    if props:
        given = section.get("properties", section.get("config"))
        section["properties"] = {**props, **(given if isinstance(given, dict) else {})}
        section.pop("config", None)
    for key, value in whole.items():   # only with merge_json: the JSON object over the single variables
        name = str(key).replace("_", "").lower()
        name = "properties" if name == "config" else name
        below = [section.pop(k) for k in list(section) if k.replace("_", "").lower() == name]
        merge = name == "properties" and isinstance(value, dict) and below and isinstance(below[0], dict)
        section[name] = {**below[0], **value} if merge else value
        origins[name] = f"{_ENV_SECTION}.{key}"
    if not section:
        return None, nested
    return Source("env", section, lambda key: origins.get(key, f"{_ENV}{key.upper()}"),
                  strict=_names_ours(section), level=logging.INFO), nested


def _blank_property(var: str) -> None:
    # A template that renders an unset value gives "": never a setting (an empty
    # ssl.endpoint.identification.algorithm would turn TLS hostname verification off). An empty
    # value is honoured only where it is written on purpose: openlineage.yml, explicit arguments.
    log_once(logging.INFO, f"blank:{var}", "event=transport_setting_ignored key=%s reason=blank value, read as not "
             "set fix=unset it, or give the value (an empty one only in openlineage.yml)", var)


def env_blank_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties the ``OPENLINEAGE__TRANSPORT*`` variables give a blank value, as
    openlineage-python hands them to a transport (``ssl_endpoint_identification_algorithm`` for
    ``..._PROPERTIES__SSL_ENDPOINT_IDENTIFICATION_ALGORITHM``; a key of a JSON object as written),
    each with the variable that blanks it: the plugin reads them as not set, as :func:`env_source` does."""
    out: dict[str, str] = {}
    for var, raw in environ.items():
        if not var.startswith(_ENV_SECTION):
            continue
        parts = var[len(_ENV_SECTION):].lower().split("__")[1:]   # "" for OPENLINEAGE__TRANSPORT itself
        if len(parts) == 2 and parts[0] in ("properties", "config"):
            if not raw.strip():
                out[parts[1]] = var
            continue
        if parts and (len(parts) != 1 or parts[0] not in ("properties", "config")):
            continue
        value = _env_value(raw)
        if not isinstance(value, dict):
            continue
        sections = [value] if parts else [v for k, v in value.items()
                                          if str(k).replace("_", "").lower() in ("properties", "config")]
        for section in sections:
            if isinstance(section, dict):
                out.update({str(k): var for k, v in section.items() if isinstance(v, str) and not v.strip()})
    return out


def drop_blank_env_properties(section: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``section`` (as openlineage-python merged it from openlineage.yml, ``config=`` and the
    ``OPENLINEAGE__TRANSPORT*`` variables) without the blank property values those variables
    brought (:func:`env_blank_properties`), each logged once as :func:`env_source` logs it. A blank
    value written in openlineage.yml under the same name as a blank variable is left out too (not
    set is the safe reading: an empty ``ssl.endpoint.identification.algorithm`` turns TLS hostname
    verification off)."""
    blanks = env_blank_properties(environ)
    out = dict(section)
    if not blanks:
        return out
    for key, value in section.items():
        if str(key).replace("_", "").lower() in ("properties", "config") and isinstance(value, Mapping):
            kept = {}
            for name, item in value.items():
                if isinstance(item, str) and not item.strip() and str(name) in blanks:
                    _blank_property(blanks[str(name)])
                else:
                    kept[name] = item
            out[key] = kept
    return out


def numbers_as_written(section: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``section`` (as openlineage-python read it, with ``yaml.safe_load``) with each number that
    openlineage.yml's transport section holds at the same key (or property) replaced by that
    number as written there (:class:`YamlInt`): ``sasl.password: 012345`` is then ``012345``,
    not 5349, through the plugin too."""
    try:
        cwd = Path.cwd()
    except OSError:   # a working directory removed under the job: no ./openlineage.yml
        cwd = Path("/nonexistent")
    path = find_yaml(environ, cwd, Path.home())
    doc = _yaml_doc(path) if path is not None else None
    written = doc.get("transport") if isinstance(doc, dict) else None
    if not isinstance(written, dict):
        return dict(section)

    def same(value: Any, mine: Any) -> bool:
        return isinstance(mine, (YamlInt, YamlFloat)) and type(value) in (int, float) and value == mine

    out = dict(section)
    for key, value in section.items():
        if same(value, written.get(key)):
            out[key] = written[key]
        elif isinstance(value, Mapping) and isinstance(written.get(key), Mapping):
            out[key] = {name: written[key][name] if same(item, written[key].get(name)) else item
                        for name, item in value.items()}
    return out


def _without_blanks(section: dict[str, Any], where: str) -> dict[str, Any]:
    """``section`` with the blank ``properties``/``config`` values of a JSON environment variable left out."""
    out = dict(section)
    for key, value in section.items():
        if str(key).replace("_", "").lower() in ("properties", "config") and isinstance(value, dict):
            kept = {k: v for k, v in value.items() if not (isinstance(v, str) and not v.strip())}
            for name in value.keys() - kept.keys():
                _blank_property(f"{where}.{key}.{name}")
            out[key] = kept
    return out


def _nested(var: str) -> bool:
    """``OPENLINEAGE__TRANSPORT__AUTH__TYPE``, ``..._TRANSPORTS__DEFAULT_HTTP__URL``: a setting of
    another transport (``PROPERTIES__<NAME>``/``CONFIG__<NAME>`` are librdkafka properties)."""
    parts = var[len(_ENV):].lower().split("__")
    return len(parts) > 1 and not (len(parts) == 2 and parts[0] in ("properties", "config"))


def _names_ours(section: Mapping[str, Any]) -> bool:
    return section.get("type") is not None and is_ours(section.get("type"))


def spark_source(conf: Mapping[str, str]) -> Source | None:
    prefix = _SPARK + "transport."
    section: dict[str, Any] = {}
    by_config: dict[str, Any] = {}   # transport.config.<name>: the same as properties.<name>, which wins
    for key, value in conf.items():
        if not str(value).strip():
            continue   # as the official ArgumentParser: a blank value is not set
        if key.startswith(prefix + "properties."):
            section.setdefault("properties", {})[key[len(prefix + "properties."):]] = value
        elif key.startswith(prefix + "config."):
            by_config[key[len(prefix + "config."):]] = value
        elif key.startswith(prefix):
            section[key[len(prefix):]] = value
    if by_config and isinstance(section.get("properties", {}), dict):
        section["properties"] = {**by_config, **section.get("properties", {})}
    if not section:
        return None
    props_origin = prefix + ("properties.*" if any(k.startswith(prefix + "properties.") for k in conf)
                             else "config.*")

    def origin(key: str) -> str:
        return props_origin if key == "properties" else prefix + key
    return Source(_SPARK + "transport", section, origin)


def env_foreign_keys(environ: Mapping[str, str]) -> set[str]:
    """Transport keys (lower case) the ``OPENLINEAGE__TRANSPORT*`` variables bring into the
    section openlineage-python hands a transport that need not be ours: every nested one
    (``AUTH__*``, ``TRANSPORTS__*``: never a setting of this transport), and all of them unless
    the variables themselves name our type. A valid ``OPENLINEAGE__TRANSPORT`` JSON object
    replaces the single variables, so only its keys count then."""
    whole = {str(key).lower(): value for key, value in env_json_section(environ).items()}
    if whole:
        return set() if _names_ours(whole) else set(whole)
    declares = _names_ours({"type": environ.get(_ENV + "TYPE")})
    keys: set[str] = set()
    for var in environ:
        if var.startswith(_ENV):
            parts = var[len(_ENV):].lower().split("__")
            if not declares or (len(parts) > 1 and parts[0] not in ("properties", "config")):
                keys.add(parts[0])
    return keys
