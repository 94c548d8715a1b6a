"""librdkafka properties checked when the configuration is read, not when a client is made.

A misspelt or mistyped ``consumer_properties``/``producer_properties`` entry would otherwise
pass ``check-config`` and fail only at start-up, after the dead-letter topic's creation had
waited for the broker, in librdkafka's own words. librdkafka checks names and values when a
client is created, without any network: so a client is created here, without
``bootstrap.servers``, and closed at once (~1-15 ms). A property of the other kind (a
producer property among the consumer's) is refused too: librdkafka would ignore it.

Properties naming files (``ssl.ca.location``, keytabs, ...) are left out: the files are
often mounted only where the relay runs, and librdkafka reads them at start-up, where a
missing one stops the relay with its name.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaException, Producer

#: Values that name a file (librdkafka opens them when the client is created).
_FILE_KEYS = re.compile(r"(\.location|\.keytab|^plugin\.library\.paths|^ssl_engine_location)$")
#: The property a librdkafka message is about: ``... property "name"``, ``Expected bool value
#: for "name"`` or ``Failed to create consumer: name failed: ...``.
_NAMED = re.compile(r'(?:property:?|value for) "([^"]+)"|create (?:consumer|producer): ([A-Za-z0-9._]+) failed')
#: ``Configuration property linger.ms is a producer property and will be ignored by this consumer instance``
_OTHER_KIND = re.compile(r"Configuration property (\S+) is a (consumer|producer) property and will be ignored")
_SECRET = re.compile(r"password|secret|token|key\b|\.key|credentials", re.IGNORECASE)


class _Warnings:
    """Collects librdkafka's configuration warnings (CONFWARN) while the client is made."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, _level: int, _fmt: str, facility: str = "", _client: str = "", message: str = "",
            *_rest: Any) -> None:
        if facility == "CONFWARN":
            self.lines.append(message)


def _make(conf: dict[str, Any], kind: Literal["consumer", "producer"]) -> list[str]:
    """Creates and closes a ``kind`` client on ``conf``; returns librdkafka's configuration
    warnings (raises KafkaException for what it refuses)."""
    warnings = _Warnings()
    conf = {**conf, "logger": warnings}
    if kind == "consumer":
        conf.setdefault("group.id", "lineage-relay-config-check")
        Consumer(conf).close()
    else:
        Producer(conf).flush(0)
    return warnings.lines


def _other_kind(lines: list[str]) -> tuple[str, str] | None:
    """(property, its kind) of the first "is a producer/consumer property" warning."""
    for line in lines:
        found = _OTHER_KIND.search(line)
        if found is not None:
            return found[1], found[2]
    return None


def problem(properties: dict[str, str], kind: Literal["consumer", "producer"]) -> str | None:
    """What librdkafka finds wrong with ``properties`` for a ``kind`` client, naming the
    property and the fix; None when it takes them."""
    checked = {k: v for k, v in properties.items() if not _FILE_KEYS.search(k)}
    checked.pop("bootstrap.servers", None)
    if not checked:
        return None
    try:
        other = _other_kind(_make(checked, kind))
    except KafkaException as err:
        text = err.args[0].str() if err.args else str(err)
        named = _NAMED.search(text)
        key = next((g for g in named.groups() if g), None) if named else None
        if key is not None and _SECRET.search(key):
            text = f"librdkafka refused the value of {key}"  # the value is not repeated
        where = f"{key}: " if key else ""
        return f"{where}{text}; fix: check it against librdkafka's CONFIGURATION.md, or remove it"
    if other is None:
        return None
    key, its_kind = other
    if key not in checked:  # librdkafka names an alias by its canonical name (linger.ms)
        key = next((k for k in checked if _other_kind(_make({k: checked[k]}, kind)) is not None), key)
    return (f"{key}: a {its_kind} property, which the {kind} ignores; fix: move it to "
            f"{its_kind}_properties, or remove it")
