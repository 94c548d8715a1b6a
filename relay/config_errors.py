"""A configuration's validation errors in plain words, each naming the key and the fix.

pydantic's own wording ("Extra inputs are not permitted", "Input should be a valid tuple")
says neither what was expected nor what to do; here an unknown key is given the known keys
it is closest to, a value of the wrong type what to write instead. The value itself is
never quoted (a token, a password), only what kind of value it is. A collector is named by
its ``name`` (``collectors.marquez.token``), as in the errors found at start-up.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from relay.config_file import Loc, is_secret

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def where(loc: Loc, data: Any) -> str:
    """``loc`` as the user reads it: dotted, a collector by its name when it has a unique one."""
    parts = [str(p) for p in loc]
    collectors = data.get("collectors") if isinstance(data, dict) else None
    if len(loc) >= 2 and loc[0] == "collectors" and isinstance(loc[1], int) and isinstance(collectors, list) \
            and loc[1] < len(collectors):
        names = [c.get("name") if isinstance(c, dict) else None for c in collectors]
        name = names[loc[1]]
        if isinstance(name, str) and _NAME.fullmatch(name) and names.count(name) == 1:
            parts[1] = name
    return ".".join(parts) or "(top level)"


def error_lines(err: ValidationError, data: Any, root: type[BaseModel], skip: tuple[Loc, ...] = ()) -> list[str]:
    """One line per error of ``err`` (``data`` validated as ``root``), but those about a key
    in ``skip`` (already reported: an unset variable), one of its sub-keys or the section
    holding it."""
    errors = [e for e in err.errors() if not any(_touches(tuple(e["loc"]), s) for s in skip)]
    renamed: set[Loc] = set()  # a key required where an unknown key is close to its name: a typo
    for e in errors:
        if e["type"] == "extra_forbidden":
            loc = tuple(e["loc"])
            for match in _close(str(loc[-1]), _known_keys(root, loc[:-1], data)):
                renamed.add((*loc[:-1], match))
    lines = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in renamed:
            continue
        lines.append(f"{where(loc, data)}: {_message(e, loc, root, data)}")
    return lines


def _touches(loc: Loc, skipped: Loc) -> bool:
    return loc[:len(skipped)] == skipped or loc == skipped[:-1]


def _message(e: Any, loc: Loc, root: type[BaseModel], data: Any) -> str:
    kind = e["type"]
    if kind == "extra_forbidden":
        known = _known_keys(root, loc[:-1], data)
        close = _close(str(loc[-1]), known)
        if close:
            return f"unknown key; did you mean {' or '.join(close)}? fix: rename it, or remove it"
        listed = f" (known keys here: {', '.join(sorted(known))})" if known else ""
        return f"unknown key; fix: remove it, or correct its spelling{listed}"
    translated = _TYPES.get(kind)
    if translated is not None:
        return translated(loc, e.get("input"))
    msg = e["msg"].removeprefix("Value error, ")
    fix = _FIXES.get(kind)
    return msg + (f"; fix: {fix}" if fix else "")


_FIXES = {
    "missing": "add it",
    "finite_number": "write a finite number (.inf and .nan are refused)",
}


def _list(loc: Loc, _value: Any) -> str:
    if loc == ("kafka", "topics"):
        return ("is not a list of topic names; fix: write a list such as [openlineage], or one string of "
                "comma-separated names such as \"ol.spark,ol.airflow\"")
    return "is not a list; fix: write a list such as [a, b] (a single item too: [a])"


def _number(_loc: Loc, _value: Any) -> str:
    return "is not a number; fix: write a number in digits, such as 10 or 0.5, without a unit or quotes"


def _whole(_loc: Loc, _value: Any) -> str:
    return "is not a whole number; fix: write a whole number in digits, such as 32, without a unit or quotes"


def _fraction(_loc: Loc, _value: Any) -> str:
    return "has a fractional part where a whole number is expected; fix: write a whole number, such as 32"


def _bool(_loc: Loc, _value: Any) -> str:
    return "is not true or false; fix: write true or false"


def _text(loc: Loc, value: Any) -> str:
    if isinstance(value, (list, tuple, dict)):
        return "is a list or a mapping where one text value is expected; fix: write one value"
    if isinstance(value, bool):  # before int, which bool subclasses: it is no number to the user
        what, why = "true or false", "YAML reads unquoted true, false, yes, no, on and off as one"
    else:
        what = "a number" if isinstance(value, (int, float)) else "not text"
        why = "YAML reads unquoted digits as a number"
    if is_secret(loc):
        return (f"is {what} where text is expected ({why}); fix: take it "
                f"from an environment variable ({loc[-1]}: ${{NAME}}, always text), or quote it")
    return f"is {what} where text is expected ({why}); fix: quote it"


def _mapping(_loc: Loc, _value: Any) -> str:
    return "is not a mapping; fix: write it as key: value pairs, such as {key: value}, or leave it out"


_TYPES = {
    "tuple_type": _list, "list_type": _list, "set_type": _list, "frozen_set_type": _list,
    "float_type": _number, "float_parsing": _number,
    "int_type": _whole, "int_parsing": _whole, "int_parsing_size": _whole,
    "int_from_float": _fraction,
    "bool_type": _bool, "bool_parsing": _bool,
    "string_type": _text,
    "dict_type": _mapping, "model_type": _mapping, "model_attributes_type": _mapping,
}


def _close(key: str, known: list[str]) -> list[str]:
    """The known keys ``key`` is a slip of: the closest, and any other about as close."""
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in known), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [k for ratio, k in scored if ratio >= 0.6 and ratio >= best - 0.1][:3]


def _known_keys(root: type[BaseModel], loc: Loc, data: Any) -> list[str]:
    """The keys the section at ``loc`` takes (names and aliases); [] when it is no section."""
    model = _model_at(root, loc, data)
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(root: type[BaseModel], loc: Loc, data: Any) -> type[BaseModel] | None:
    annotation: Any = root
    node = data
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(part, int):
            args = typing.get_args(annotation)
            if typing.get_origin(annotation) not in (tuple, list) or not args:
                return None
            annotation = args[0]
            node = node[part] if isinstance(node, list) and part < len(node) else None
            annotation = _collector_kind(annotation, node)
            continue
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        field = next((f for name, f in annotation.model_fields.items() if part in (name, f.alias)), None)
        if field is None:
            return None
        annotation = field.annotation
        node = node.get(part) if isinstance(node, dict) else None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _collector_kind(annotation: Any, node: Any) -> Any:
    """A collector entry's config class is its kind's (``type:``), which may add keys."""
    from relay.sinks.config import CollectorConfig

    if annotation is not CollectorConfig or not isinstance(node, dict):
        return annotation
    from relay.sinks.kinds import resolve_kind  # imports relay.config, which imports this module

    try:
        return resolve_kind(str(node.get("type", "http"))).config_class
    except ValueError:
        return annotation
