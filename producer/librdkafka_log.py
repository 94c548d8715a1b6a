"""librdkafka's own log lines, in proportion: logger ``producer.librdkafka``.

A library that observes a job must not drown the job's log. While Kafka is unreachable
librdkafka logs a connection failure (facility ``FAIL``, e.g. ``Failed to resolve
'kafka:9092'`` or ``Connection refused``) at every reconnect attempt -- several a second
-- and every librdkafka instance the producer builds during an outage (a stall rebuild)
starts over. The events are safe meanwhile: the producer's own ``event=journal_mode``
warning says so, once.

Guaranteed, per :class:`LibrdkafkaLog` (one per producer, shared by the instances it builds):

* The first line of a kind is logged with its full text: a connection failure (``FAIL``)
  at WARNING, any other line librdkafka logs at WARNING or above at its own level.
  A kind is the facility, the broker and the text with numbers left out (the
  ``(after 3ms in state CONNECT)`` suffix, ports of addresses, counts), so one broker's
  failures are one kind until their cause changes, and each broker has its own.
* Repeats of a kind are logged at DEBUG until :meth:`forget` (the producer calls it when
  Kafka acknowledges a record after it was down): the next outage is reported again.
* Lines librdkafka logs below WARNING (notices, info, ``debug=`` output) go to DEBUG.
* At most :data:`_MAX_KINDS` kinds are remembered; past that, new kinds go to DEBUG too,
  so the number of WARNING lines in an outage is bounded whatever its length.

The text is librdkafka's (``FACILITY [client] message``), unchanged but for a note on the
first line of a kind that repeats are at DEBUG. librdkafka does not put secrets in these lines.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

_log = logging.getLogger("producer.librdkafka")

#: How many kinds of line (see the module docstring) are remembered between two forget().
_MAX_KINDS = 256
#: ``[thrd:kafka:9092/bootstrap]: `` -- librdkafka's thread prefix (``log.thread.name``).
_THREAD = re.compile(r"\[thrd:[^\]]*\]: ")
#: ``kafka:9092/bootstrap: ``, ``sasl_ssl://b-1.example:9096/2: `` -- a broker's own line.
_BROKER = re.compile(r"(?P<broker>\S+:\d+/\w+): ")
_NUMBERS = re.compile(r"\d+")
#: ``(after 0ms in state CONNECT, 1 identical error(s) suppressed)``: librdkafka's own count
#: of the repeats it held back, not a cause of its own.
_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")


class LibrdkafkaLog:
    """What confluent-kafka calls with librdkafka's log lines (its ``logger``); see the
    module docstring. Thread-safe: lines come from the thread serving the instance, and
    from the constructing one while an instance is built."""

    def __init__(self, logger: logging.Logger = _log) -> None:
        self._logger = logger
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def log(self, level: int, fmt: str, *args: Any, **kwargs: Any) -> None:
        """confluent-kafka's call: ``log(level, "%s [%s] %s", facility, client, message)``,
        ``level`` already a :mod:`logging` level."""
        if len(args) != 3:     # not the call above: passed on as it is
            self._logger.log(level, fmt, *args, **kwargs)
            return
        if level < logging.WARNING:
            self._logger.log(logging.DEBUG, fmt, *args, **kwargs)
            return
        facility, _client, message = (str(a) for a in args)
        if self._first(line_kind(facility, message)):
            level = logging.WARNING if facility == "FAIL" else level
            self._logger.log(level, fmt + " (repeats are logged at DEBUG)", *args, **kwargs)
        else:
            self._logger.log(logging.DEBUG, fmt, *args, **kwargs)

    def forget(self) -> None:
        """Kafka took records again: the next line of every kind is logged at its level."""
        if self._seen:
            with self._lock:
                self._seen.clear()

    def _first(self, kind: tuple[str, str, str]) -> bool:
        with self._lock:
            if kind in self._seen or len(self._seen) >= _MAX_KINDS:
                return False
            self._seen.add(kind)
            return True


def line_kind(facility: str, message: str) -> tuple[str, str, str]:
    """A line's kind: its facility, the broker its message begins with (or ``""``) and the
    rest of its text with every number replaced by ``#`` (librdkafka's thread prefix and its
    count of the repeats it suppressed left out), so that one broker's repeated failures
    are one kind until their cause changes."""
    thread = _THREAD.match(message)
    text = message[thread.end():] if thread is not None else message
    text = _SUPPRESSED.sub("", text)
    broker = _BROKER.match(text)
    if broker is None:
        return facility, "", _NUMBERS.sub("#", text)
    return facility, broker["broker"], _NUMBERS.sub("#", text[broker.end():])
