"""Structured logs: one JSON object per line, ``{"ts", "level", "logger", "event", ...}``.

Call :func:`log_event` with an event name and key/value fields. Secrets never reach a
log line: configuration objects hold them as ``SecretStr`` and nothing logs headers.

A line stays a line a log pipeline keeps whole: a field bigger than :data:`FIELD_CAP`
bytes of JSON (:data:`EXCEPTION_CAP` for a traceback) is cut, with a marker saying how
much, and the line names the fields cut in ``truncated`` (a container runtime splits a
line at 16 KiB; a multi-megabyte one, from a value a producer controls, is worse).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import orjson

#: Fields every line of this process carries (a worker's ``worker`` index: see set_log_context).
_context: dict[str, Any] = {}

#: The environment variable that hands this process's log context to a child process that
#: logs as part of it (a decode child: see :func:`context_env`, :func:`inherit_log_context`).
LOG_CONTEXT_ENV = "LINEAGE_RELAY_LOG_CONTEXT"

#: Bytes (of its JSON) beyond which a field is cut, its start kept.
FIELD_CAP = 8 << 10
#: Bytes beyond which a traceback (``exception``) is cut: its start and its end (the
#: innermost frames and the error) are kept, the middle of a deep chain goes.
EXCEPTION_CAP = 16 << 10
#: Of a cut traceback, the bytes kept from its start (the rest of the cap from its end).
_EXCEPTION_HEAD = 4 << 10
#: Fields never cut (the line's own: short).
_UNCUT = frozenset({"ts", "level", "logger"})


def set_log_context(**fields: Any) -> None:
    """Add ``fields`` to every log line this process writes from now on."""
    _context.update(fields)


def context_env() -> dict[str, str]:
    """Environment for a child process whose lines are this process's (a decode child): its
    log context (a worker's ``worker`` index), read back there by :func:`inherit_log_context`."""
    return {LOG_CONTEXT_ENV: orjson.dumps(_context, default=str).decode()} if _context else {}


def inherit_log_context() -> None:
    """In a child process: the log context its parent handed over (see :func:`context_env`).
    Never raises: a context that cannot be read is left out."""
    raw = os.environ.get(LOG_CONTEXT_ENV)
    if not raw:
        return
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    if isinstance(fields, dict):
        set_log_context(**{str(k): v for k, v in fields.items()})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_context,
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        line = _dumps(out)
        if len(line) <= FIELD_CAP:  # the usual line: no field can be over its cap
            return line
        return _dumps(bounded(out))


class TextFormatter(logging.Formatter):
    """The same events for a person at a terminal (the demo): one line, ``level event
    key=value ...``; a value that is not a plain word is written as JSON. Fields are cut
    as in :class:`JsonFormatter`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = bounded({**_context, **(getattr(record, "fields", None) or {})})
        words = [record.levelname.lower(), record.getMessage()]
        words += [f"{key}={_word(value)}" for key, value in fields.items()]
        line = " ".join(words)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _word(value: Any) -> str:
    """``value`` bare when a plain word, else as JSON; printable either way: field values come
    from producers, and a control character (ESC, BEL, a C1 CSI) written raw is run by the
    terminal (orjson leaves DEL and C1 controls unescaped, so those are escaped as ASCII)."""
    if isinstance(value, str) and value and value.isprintable() and not any(c.isspace() or c in '"=' for c in value):
        return value
    text = _dumps({"v": value})[5:-1]
    if text.isprintable():
        return text
    return json.dumps(value, default=str, ensure_ascii=True, separators=(",", ":"))


def _dumps(out: dict[str, Any]) -> str:
    try:
        return orjson.dumps(out, default=str).decode()
    except TypeError:  # orjson refuses some strings (a lone surrogate) and keys: escaped instead
        return json.dumps(out, default=str, ensure_ascii=True, separators=(",", ":"))


def bounded(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with each field over its cap cut (see the module docstring); a field that is
    not a string is replaced by its JSON text, cut. Lists the fields cut in ``truncated``."""
    cut: list[str] = []
    for key, value in list(out.items()):
        if key in _UNCUT:
            continue
        cap = EXCEPTION_CAP if key == "exception" else FIELD_CAP
        text = value if isinstance(value, str) else _dumps({"v": value})[5:-1]
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= cap:
            continue
        out[key] = _cut(text, size, cap, head=_EXCEPTION_HEAD if key == "exception" else cap)
        cut.append(key)
    if cut:
        out["truncated"] = cut
    return out


def _cut(text: str, size: int, cap: int, head: int) -> str:
    """``text`` (``size`` bytes of UTF-8) in about ``cap`` bytes: its first ``head`` bytes and
    its last ``cap - head``, a marker between them (or at the end) saying how many went."""
    data = text.encode("utf-8", "surrogatepass")
    tail = cap - head
    marker = f" ...[{size - cap} bytes cut]... "
    start = data[:head].decode("utf-8", "ignore")
    end = data[size - tail:].decode("utf-8", "ignore") if tail > 0 else ""
    return start + marker + end


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"fields": fields})


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
