"""Structured logs: one JSON object per line, ``{"ts", "level", "logger", "event", ...}``.

Call :func:`log_event` with an event name and key/value fields. Secrets never reach a
log line: configuration objects hold them as ``SecretStr`` and nothing logs headers.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

#: Fields every line of this process carries (a worker's ``worker`` index: see set_log_context).
_context: dict[str, Any] = {}


def set_log_context(**fields: Any) -> None:
    """Add ``fields`` to every log line this process writes from now on."""
    _context.update(fields)


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
        return orjson.dumps(out, default=str).decode()


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
