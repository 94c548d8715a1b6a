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
#: A property's name, as librdkafka quotes it (an alias too: `max.in.flight`).
_PROPERTY_NAME = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+")
#: Fixes more precise than "check it against CONFIGURATION.md".
_FIXES = {"sasl.jaas.config": "remove it, and set sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), "
                              "sasl.username and sasl.password instead"}
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


def scrub(text: str, properties: dict[str, str]) -> str:
    """librdkafka's ``text`` without the values of ``properties``: it quotes them (``Invalid
    value "..."``, ``Unsupported SASL mechanism: ...``), and a value may be a password or come
    from a secret variable. A quoted part that is not a property's name, and any occurrence of
    a value, become ``<value>`` (a value under 8 characters only where it stands alone, so that
    ``SSL`` leaves ``ssl.ca.location`` as it is). A value quoted as if it were a name is
    still replaced as a value."""
    def kept(m: re.Match[str]) -> str:
        return m[0] if m[2] in properties or _PROPERTY_NAME.fullmatch(m[2]) else f"{m[1]}<value>{m[1]}"

    text = re.sub(r'(["`])(.*?)\1', kept, text)
    for value in sorted({v.strip() for v in properties.values() if v.strip()}, key=len, reverse=True):
        text = _occurrence(value).sub("<value>", text)
    return text


def _occurrence(value: str) -> re.Pattern[str]:
    """Where ``value`` stands in a message: anywhere when it is 8 characters or more, else
    only where it stands alone."""
    pattern = re.escape(value) if len(value) >= 8 else rf"(?<![\w.-]){re.escape(value)}(?![\w.-])"
    return re.compile(pattern, re.IGNORECASE)


def _culprit(text: str, checked: dict[str, str], kind: Literal["consumer", "producer"]) -> str | None:
    """The property a refusal that names none is about: the one whose value librdkafka
    quotes, else the one refused on its own, else the one without which the rest pass."""
    quoted = [k for k, v in checked.items() if v.strip() and _occurrence(v.strip()).search(text)]
    if len(quoted) == 1:
        return quoted[0]

    def refused(conf: dict[str, str]) -> bool:
        try:
            _make(conf, kind)
        except KafkaException:
            return True
        return False

    alone = [k for k in checked if refused({k: checked[k]})]
    if len(alone) == 1:
        return alone[0]
    needed = [k for k in checked if not refused({o: v for o, v in checked.items() if o != k})]
    return needed[0] if len(needed) == 1 else None


def problem(properties: dict[str, str], kind: Literal["consumer", "producer"],
            defaults: dict[str, str] | None = None) -> str | None:
    """What librdkafka finds wrong with ``properties`` (over the relay's ``defaults``) for a
    ``kind`` client, naming the property and the fix, never a value; None when it takes them."""
    checked = {k: v for k, v in {**(defaults or {}), **properties}.items() if not _FILE_KEYS.search(k)}
    checked.pop("bootstrap.servers", None)
    if not checked:
        return None
    try:
        other = _other_kind(_make(checked, kind))
    except KafkaException as err:
        text = err.args[0].str() if err.args else str(err)
        named = _NAMED.search(text)
        key = next((g for g in named.groups() if g), None) if named else None
        if key is None:
            key = _culprit(text, checked, kind)
        if key is not None and _SECRET.search(key):
            text = f"librdkafka refused the value of {key}"  # the value is not repeated
        else:  # names stay (librdkafka's alias too); the relay's own defaults are no secret
            text = scrub(text, {**{k: "" for k in (*checked, key) if k}, **properties})
        where = f"{key}: " if key else ""
        fix = _FIXES.get(key or "", "check it against librdkafka's CONFIGURATION.md, or remove it")
        return f"{where}{text}; fix: {fix}"
    if other is None:
        return None
    key, its_kind = other
    if key not in checked:  # librdkafka names an alias by its canonical name (linger.ms)
        key = next((k for k in checked if _other_kind(_make({k: checked[k]}, kind)) is not None), key)
    return (f"{key}: a {its_kind} property, which the {kind} ignores; fix: move it to "
            f"{its_kind}_properties, or remove it")
