"""Reading ``relay.yaml``: YAML 1.2 numbers, then ``${VAR}`` references replaced.

References are ``${NAME}``, ``${NAME:-default}`` (NAME unset or empty) or ``${NAME-default}``
(NAME unset), as in the shell; ``$${`` is a literal ``${``, and any other ``${`` is refused.
Every problem of the file is collected in one pass (each unset variable, each ``${`` that is
no reference), located by key, never quoting a value (it may hold a secret). Which values
were written in the file rather than taken from a variable is noted too: a token written
there is warned about (:func:`inline_secrets`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from producer.readers import yaml_problem
from relay.errors import ConfigError

Loc = tuple[str | int, ...]

#: ``$${`` (a literal ``${``), or a reference: ``${NAME}``, ``${NAME:-default}`` (NAME unset
#: or empty) or ``${NAME-default}`` (NAME unset), as in the shell. A default holds no ``}``
#: and no ``${`` (no nesting). A ``$`` not followed by ``{`` is kept as it is.
_ENV = re.compile(r"\$\$\{"
                  r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>(?:[^$}]|\$(?!\{))*))?\}")

_ENV_FORMS = ("write ${NAME}, ${NAME:-default} (NAME unset or empty) or ${NAME-default} (NAME unset), "
              "with a plain default (no ${...} inside: set the variable itself, or write the value), "
              "or $${ for a literal ${")

#: Keys of ``consumer_properties``/``producer_properties`` that hold a secret.
_SECRET_PROPERTY = re.compile(r"^sasl\.|password|secret|\.key$|token", re.IGNORECASE)
#: Those of them warned about when written in the file (not a mechanism or a user name).
_INLINE_WARNED = re.compile(r"password|secret|jaas", re.IGNORECASE)


def is_secret(loc: Loc) -> bool:
    """Whether the value at ``loc`` is a secret: a collector's token or a header's value (API
    keys), a SASL setting or a password among the librdkafka properties."""
    if len(loc) >= 3 and loc[0] == "collectors":
        return loc[2] == "token" or (loc[2] == "headers" and len(loc) == 4)
    return (len(loc) == 3 and loc[0] == "kafka" and loc[1] in ("consumer_properties", "producer_properties")
            and bool(_SECRET_PROPERTY.search(str(loc[2]))))


def _unset_fix(name: str, loc: Loc) -> str:
    if not is_secret(loc):
        return f"export it, or write ${{{name}:-default}}"
    # Not a default: that would be a secret written in the file.
    if loc[0] == "collectors" and loc[2] == "token":
        return (f"set {name} where the relay runs (in Kubernetes from a Secret: env[].valueFrom.secretKeyRef), "
                "or read the token with token_env: NAME or token_file: /path/to/mounted/secret instead of token")
    return f"set {name} where the relay runs (in Kubernetes from a Secret: env[].valueFrom.secretKeyRef)"


@dataclass
class Interpolated:
    """A document with its references replaced. ``problems``: (key, message) for each value
    that could not be (an unset variable, a ``${`` that is no reference); such a value is ''
    in ``data``. ``referenced``: the keys whose value named at least one variable."""

    data: Any
    problems: list[tuple[Loc, str]] = field(default_factory=list)
    referenced: set[Loc] = field(default_factory=set)


def interpolate(value: Any) -> Interpolated:
    """``value`` with its environment references replaced; what a variable holds is taken as it
    is (a ``${`` in a password stays)."""
    out = Interpolated(None)
    out.data = _walk(value, (), out)
    return out


def _walk(value: Any, loc: Loc, out: Interpolated) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, (*loc, k), out) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, (*loc, i), out) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    if "${" in _ENV.sub(" ", value):  # what is left once the references are out
        out.problems.append((loc, "a ${ that is not an environment reference (nested, ${NAME:?message}, "
                                  f"a typo); {_ENV_FORMS}"))
        return ""
    unset: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        if name is None:
            return "${"
        out.referenced.add(loc)
        found = os.environ.get(name)
        if op is not None and (found is None or (op == ":-" and not found)):
            return default
        if found is None:
            unset.append(name)
            return ""
        return found

    text = _ENV.sub(sub, value)
    for name in dict.fromkeys(unset):
        out.problems.append((loc, f"environment variable {name} is not set; fix: {_unset_fix(name, loc)}"))
    return "" if unset else text


def inline_secrets(data: dict[str, Any], referenced: set[Loc]) -> list[Loc]:
    """The keys of secrets written in the file as they are, not taken from a variable: a
    collector's ``token``, a SASL setting or a password among the librdkafka properties."""
    found: list[Loc] = []
    collectors = data.get("collectors")
    for i, c in enumerate(collectors if isinstance(collectors, list) else []):
        if isinstance(c, dict) and isinstance(c.get("token"), str) and c["token"].strip():
            found.append(("collectors", i, "token"))
    kafka = data.get("kafka")
    for section in ("consumer_properties", "producer_properties"):
        props = kafka.get(section) if isinstance(kafka, dict) else None
        for key, value in (props.items() if isinstance(props, dict) else ()):
            if _INLINE_WARNED.search(str(key)) and isinstance(value, str) and value:
                found.append(("kafka", section, key))
    return [loc for loc in found if loc not in referenced]


class _Loader(yaml.SafeLoader):
    """Safe YAML whose numbers are YAML 1.2's: ``0755`` and ``12:30`` stay text, where
    YAML 1.1 read them as octal and base 60 (493 and 750): a property, a numeric password or
    an id with a leading zero changed silently on its way to librdkafka."""


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def _cyclic(value: Any, open_: set[int]) -> bool:
    """Whether a mapping or list contains itself (YAML builds that from ``&a {k: *a}``)."""
    if not isinstance(value, (dict, list)):
        return False
    if id(value) in open_:
        return True
    open_.add(id(value))
    try:
        return any(_cyclic(v, open_) for v in (value.values() if isinstance(value, dict) else value))
    finally:
        open_.discard(id(value))


def read_yaml(path: str | Path, content: bytes | None = None) -> dict[str, Any]:
    """The file's top-level mapping, references not yet replaced; ``content``: the file's
    bytes, already read (a pipe can be read once), ``path`` naming it in messages."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig") if content is None else content.decode("utf-8-sig")
        raw = yaml.load(text, Loader=_Loader) or {}  # noqa: S506 - a SafeLoader
    except OSError as err:
        raise ConfigError(f"cannot read config file {p}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p} is not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                          "fix: save it as UTF-8") from None
    except yaml.YAMLError as err:
        # Not PyYAML's message: it quotes the offending line, which may hold a secret.
        raise ConfigError(f"{p} is not valid YAML: {yaml_problem(err)}; fix: correct the YAML there "
                          "(quote a value holding ': ', ' #', '&' or '*')") from None
    if _cyclic(raw, set()):
        raise ConfigError(f"{p}: a YAML alias refers to itself (&name ... *name inside it); "
                          "fix: write the value out instead of the alias")
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping with keys kafka, collectors, ...")
    return raw
