"""Kafka Java client producer properties as librdkafka reads them (used by :mod:`producer.config`).

A config copied from the OpenLineage Java (Spark) Kafka transport carries Java client
properties, which librdkafka refuses ("No such configuration property"). Each one is:

* translated when librdkafka has the same setting (:data:`RENAMED`: ``max.request.size`` is
  ``message.max.bytes``; a PEM truststore is ``ssl.ca.location``/``ssl.ca.pem``; a PLAIN or
  SCRAM ``sasl.jaas.config`` is ``sasl.username``/``sasl.password``; ...); a librdkafka
  property given as well wins (when the two come from different configuration sources, the
  higher source's wins: :func:`shadowed` removes the lower librdkafka one first);
* dropped with one warning when it only tunes the Java client or has no librdkafka
  counterpart and changes nothing in what is sent (:data:`JAVA_ONLY_PROPERTIES`);
* refused, naming the key and the librdkafka setting to use, when dropping it would change
  how the producer connects or logs in (a JKS truststore, another JAAS login module).

Messages name keys, never values (``sasl.jaas.config`` holds a password).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

log = logging.getLogger("producer.config")

#: Kafka Java client properties librdkafka does not have and that change nothing in what is
#: sent: record serializers (the producer sends bytes), plug-in classes (interceptors,
#: partitioner, metric reporters, security providers), Java-side memory, blocking and login
#: refresh tuning (``queue_max_events`` bounds memory here; ``emit`` never blocks), and the
#: TLS protocol versions (librdkafka has no such setting: OpenSSL negotiates the highest
#: version both sides enable). Dropped with one warning.
JAVA_ONLY_PROPERTIES = frozenset({
    "key.serializer", "value.serializer", "interceptor.classes",
    "partitioner.class", "partitioner.ignore.keys", "partitioner.adaptive.partitioning.enable",
    "partitioner.availability.timeout.ms",
    "metric.reporters", "metrics.num.samples", "metrics.sample.window.ms", "metrics.recording.level",
    "auto.include.jmx.reporter", "buffer.memory", "max.block.ms",
    "metadata.max.idle.ms", "socket.connection.setup.timeout.max.ms", "security.providers",
    "ssl.protocol", "ssl.enabled.protocols", "ssl.provider", "ssl.keymanager.algorithm",
    "ssl.trustmanager.algorithm", "ssl.secure.random.implementation", "ssl.engine.factory.class",
    "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.buffer.seconds",
    "sasl.login.connect.timeout.ms", "sasl.login.read.timeout.ms", "sasl.login.retry.backoff.ms",
    "sasl.login.retry.backoff.max.ms", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.kerberos.ticket.renew.jitter",
})
#: Java name -> (librdkafka name, librdkafka's range). Java's -1 (the OS default) for a socket
#: buffer is librdkafka's 0.
RENAMED = {
    "max.request.size": ("message.max.bytes", 1000, 1_000_000_000),
    "send.buffer.bytes": ("socket.send.buffer.bytes", 0, 100_000_000),
    "receive.buffer.bytes": ("socket.receive.buffer.bytes", 0, 100_000_000),
}
#: Java's per-codec level (Kafka 3.8+) -> librdkafka's ``compression.level`` for the codec in use.
_LEVELS = {"compression.gzip.level": "gzip", "compression.lz4.level": "lz4", "compression.zstd.level": "zstd"}
_TRUSTSTORE = ("ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
               "ssl.truststore.certificates")
_KEYSTORE_PEM = {"ssl.keystore.key": "ssl.key.pem", "ssl.keystore.certificate.chain": "ssl.certificate.pem"}

_JAAS_MODULES = ("org.apache.kafka.common.security.plain.PlainLoginModule",
                 "org.apache.kafka.common.security.scram.ScramLoginModule")
_JAAS_FLAGS = frozenset({"REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL"})
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def to_librdkafka(props: Mapping[str, str], default_codec: str) -> dict[str, str]:
    """``props`` with every Java client property translated or dropped (see the module
    docstring); ValueError names a key that can be neither. ``default_codec`` is the
    compression type used when ``props`` set none."""
    out = {key: value for key, value in props.items() if not _is_java(key)}
    dropped = sorted(key for key in props if key in JAVA_ONLY_PROPERTIES)
    for java, (name, low, high) in RENAMED.items():
        if java in props and name not in props:
            out[name] = _in_range(java, name, props[java], low, high)
    codec = str(props.get("compression.type", props.get("compression.codec", default_codec))).lower()
    for java, level_codec in _LEVELS.items():
        if java not in props:
            continue
        if level_codec == codec and "compression.level" not in props and _level(props[java]) is not None:
            out["compression.level"] = str(_level(props[java]))
        else:
            dropped.append(java)   # another codec's level, or out of librdkafka's range: no effect
    if props.get("ssl.endpoint.identification.algorithm") == "":
        # Java's "" turns the check off. Only a value written on purpose gets here (openlineage.yml,
        # explicit arguments: a blank environment variable is not set), and never silently.
        out["ssl.endpoint.identification.algorithm"] = "none"
        log.warning("event=tls_hostname_verification_off key=ssl.endpoint.identification.algorithm reason=an "
                    "empty value (the Kafka Java client's way to turn it off) is read as none: the broker's "
                    "certificate is not checked against its host name fix=remove it to keep the check (https), "
                    "or write none to turn it off without this warning")
    dropped += _truststore(props, out) + _keystore(props, out)
    if "sasl.jaas.config" in props:
        for name, secret in _from_jaas(props["sasl.jaas.config"]).items():
            out.setdefault(name, secret)   # an explicit librdkafka property wins
    if dropped:
        log.warning("event=java_properties_ignored keys=%s reason=Kafka Java client settings librdkafka "
                    "does not have; they do not change what is sent (TLS versions: OpenSSL negotiates the "
                    "highest both sides enable)", ",".join(sorted(dropped)))
    return out


def shadowed(props: Mapping[str, object], ranks: Mapping[str, int], default_codec: str) -> set[str]:
    """The librdkafka properties of ``props`` that a Java property from a higher source replaces.

    ``props`` are merged from several sources, ``ranks`` the precedence of the source each came
    from (higher wins). :func:`to_librdkafka` lets a librdkafka property win over its Java
    equivalent, which is right within one source only: across sources the higher one's must win
    (Spark conf's ``sasl.jaas.config`` over ``OPENLINEAGE__TRANSPORT__PROPERTIES__SASL_PASSWORD``,
    its ``max.request.size`` over openlineage.yml's ``message.max.bytes``). Removing these first
    gives that."""
    codec = str(props.get("compression.type", props.get("compression.codec", default_codec))).lower()
    pairs: list[tuple[str, tuple[str, ...]]] = [(java, (name,)) for java, (name, _low, _high) in RENAMED.items()]
    pairs += [(java, ("compression.level",)) for java, level_codec in _LEVELS.items() if level_codec == codec]
    pairs += [(java, (name,)) for java, name in _KEYSTORE_PEM.items()]
    pairs += [(java, ("ssl.ca.location", "ssl.ca.pem")) for java in ("ssl.truststore.location",
                                                                      "ssl.truststore.certificates")]
    pairs.append(("sasl.jaas.config", ("sasl.username", "sasl.password")))
    out: set[str] = set()
    for java, names in pairs:
        if java in props:
            out.update(name for name in names if name in props and ranks.get(name, 0) < ranks.get(java, 0))
    return out


def _is_java(key: str) -> bool:
    return (key in JAVA_ONLY_PROPERTIES or key in RENAMED or key in _LEVELS or key in _TRUSTSTORE
            or key in _KEYSTORE_PEM or key in ("ssl.keystore.type", "sasl.jaas.config"))


def _in_range(java: str, name: str, raw: str, low: int, high: int) -> str:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{java} (librdkafka's {name}) must be a whole number of bytes, without a unit") from None
    if value == -1 and low == 0:
        return "0"
    if not low <= value <= high:
        raise ValueError(f"{java} (librdkafka's {name}) must be {low}..{high} bytes")
    return str(value)


def _level(raw: str) -> int | None:
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None
    return value if -1 <= value <= 12 else None


def _truststore(props: Mapping[str, str], out: dict[str, str]) -> list[str]:
    """A PEM truststore as ``ssl.ca.location``/``ssl.ca.pem``; the names dropped. A JKS or PKCS12
    one (Java's default type is JKS) librdkafka cannot read: refused unless a CA is given too."""
    given = [key for key in _TRUSTSTORE if key in props]
    if not given or "ssl.ca.location" in props or "ssl.ca.pem" in props:
        return given   # a librdkafka CA given as well wins
    pem = str(props.get("ssl.truststore.type", "JKS")).strip().upper() == "PEM"
    for java, name in (("ssl.truststore.location", "ssl.ca.location"), ("ssl.truststore.certificates", "ssl.ca.pem")):
        if java not in props:
            continue
        if not pem:
            raise ValueError(
                f"{java} is a Java truststore (JKS or PKCS12), which librdkafka cannot read: export its CA "
                "certificates to a PEM file (keytool -exportcert -rfc -keystore <truststore> -alias <ca> -file "
                "ca.pem), set ssl.ca.location to that file and remove ssl.truststore.*")
        out[name] = props[java]
        given.remove(java)
        break
    return given


def _keystore(props: Mapping[str, str], out: dict[str, str]) -> list[str]:
    """librdkafka's ``ssl.keystore.location`` is PKCS#12; a PEM keystore's key and chain are
    ``ssl.key.pem``/``ssl.certificate.pem``. A JKS or PEM keystore file is refused."""
    for java, name in _KEYSTORE_PEM.items():
        if java in props and name not in props:
            out[name] = props[java]
    location = props.get("ssl.keystore.location")
    given = props.get("ssl.keystore.type")
    kind = str(given or (_keystore_kind(str(location)) if location is not None else "PKCS12")).strip().upper()
    if kind != "PKCS12" and location is not None:
        raise ValueError(
            "ssl.keystore.location is a JKS or PEM keystore (its ssl.keystore.type, or without one the file "
            "itself): librdkafka reads a PKCS#12 keystore "
            "only: convert it (keytool -importkeystore -deststoretype PKCS12 ...) or set ssl.certificate.location "
            "and ssl.key.location to PEM files, and remove ssl.keystore.type")
    return ["ssl.keystore.type"] if "ssl.keystore.type" in props else []


def _keystore_kind(location: str) -> str:
    """The type of a keystore file given without ``ssl.keystore.type``. Java's default type, JKS,
    reads a JKS or a PKCS#12 file (keystore.type.compat), and librdkafka's own
    ``ssl.keystore.location`` is PKCS#12, so the file tells: a JKS/JCEKS one (by its magic number,
    else by a ``.jks``/``.jceks`` name when it is not PKCS#12 DER or cannot be read here) or a PEM
    one is refused as with that type, anything else is left to librdkafka."""
    try:
        with open(location, "rb") as file:
            head = file.read(11)
    except OSError:
        head = b""
    if head[:4] in (b"\xfe\xed\xfe\xed", b"\xce\xce\xce\xce"):
        return "JKS"
    if head.startswith(b"-----BEGIN"):
        return "PEM"
    if head[:1] != b"\x30" and location.lower().endswith((".jks", ".jceks")):
        return "JKS"
    return "PKCS12"


def _from_jaas(jaas: str) -> dict[str, str]:
    """``sasl.username``/``sasl.password`` from a Java ``sasl.jaas.config`` of the PLAIN or
    SCRAM login module, read as Kafka's JaasConfig reads it; anything else raises ValueError
    naming the librdkafka properties. The value is never part of a message: it holds the password."""
    try:
        module, options = parse_jaas(jaas)
    except ValueError as err:
        problem: str | None = str(err)
    else:
        problem = None
        if module in _JAAS_MODULES and set(options) == {"username", "password"}:
            return {"sasl.username": options["username"], "sasl.password": options["password"]}
    hint = ""
    if problem is None and module == "software.amazon.msk.auth.iam.IAMLoginModule":
        hint = ("AWS MSK IAM authentication needs the AWS library's token callback, which this producer cannot "
                "load: use SASL/SCRAM or mutual TLS on the MSK cluster; ")
    elif problem is not None:
        hint = f"it cannot be read as Kafka reads it ({problem}); "
    raise ValueError(
        f"sasl.jaas.config is a Kafka Java client setting librdkafka does not read, and only the PLAIN/SCRAM "
        f"login module with exactly the username and password options is translated; {hint}set the librdkafka "
        "properties instead: sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, GSSAPI), "
        "sasl.username and sasl.password (or sasl.oauthbearer.* / sasl.kerberos.*), and remove sasl.jaas.config")


def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """``(login module, options)`` of a ``sasl.jaas.config`` holding one entry,
    ``<module> <flag> [key=value ...];``, with the grammar of Kafka's JaasConfig
    (``java.io.StreamTokenizer``): values quoted with ``"`` or ``'`` (backslash escapes) or
    bare words, a control flag in any case, bare or quoted, ``//`` and ``/* */`` comments. ValueError
    (naming no value) otherwise."""
    tokens = list(_tokens(text))
    entries: list[tuple[str, dict[str, str]]] = []
    pos = 0

    def take() -> tuple[str, str | None]:
        nonlocal pos
        token = tokens[pos] if pos < len(tokens) else ("eof", None)
        pos += 1
        return token

    while pos < len(tokens):
        kind, module = take()
        if kind not in ("word", "quoted") or not module:
            raise ValueError("no login module class name")
        kind, flag = take()
        # Kafka takes the token's string value, so a quoted flag ("required") counts too.
        if kind not in ("word", "quoted") or str(flag).upper() not in _JAAS_FLAGS:
            raise ValueError("no control flag (required, requisite, sufficient or optional)")
        options: dict[str, str] = {}
        while True:
            kind, key = take()
            if kind in (";", "eof"):
                break
            if kind not in ("word", "quoted") or take()[0] != "=":
                raise ValueError("an option that is not key=value")
            kind, value = take()
            if kind not in ("word", "quoted"):
                raise ValueError(f"no value for option {key}")
            options[str(key)] = str(value)
        if kind != ";":
            raise ValueError("the entry does not end with ';'")
        entries.append((str(module), options))
    if len(entries) != 1:
        raise ValueError(f"{len(entries)} login modules, should be 1")
    return entries[0]


def _word_char(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c in "_$") or "\u00a0" <= c


def _numeric(c: str) -> bool:
    return "0" <= c <= "9" or c == "."


def _tokens(text: str) -> Iterator[tuple[str, str | None]]:
    """StreamTokenizer's tokens as JaasConfig sets it up: ``("word", text)``, ``("quoted",
    text)``, ``("number", None)`` (no value for Kafka) or ``(character, None)``."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c <= " ":
            i += 1
        elif c == "/":   # "/*...*/"; "//" and a lone "/" (its comment character) run to the end of the line
            if text.startswith("/*", i):
                end = text.find("*/", i + 2)
                i = n if end < 0 else end + 2
            else:
                while i < n and text[i] not in "\r\n":
                    i += 1
        elif _numeric(c) or (c == "-" and i + 1 < n and _numeric(text[i + 1])):
            i += 1
            while i < n and _numeric(text[i]):
                i += 1
            yield "number", None
        elif _word_char(c):
            start = i
            while i < n and (_word_char(text[i]) or _numeric(text[i]) or text[i] == "-"):
                i += 1
            yield "word", text[start:i]
        elif c in "'\"":
            value, i = _quoted(text, i + 1, c)
            yield "quoted", value
        else:
            i += 1
            yield c, None


def _quoted(text: str, i: int, quote: str) -> tuple[str, int]:
    """A quoted string from ``i`` (after the opening quote) to the closing quote or the end
    of the line, with StreamTokenizer's escapes; and the index after it."""
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != quote and text[i] not in "\r\n":
        c = text[i]
        i += 1
        if c == "\\" and i < n:
            c = text[i]
            i += 1
            if "0" <= c <= "7":
                digits = c
                while i < n and len(digits) < (3 if c <= "3" else 2) and "0" <= text[i] <= "7":
                    digits += text[i]
                    i += 1
                c = chr(int(digits, 8))
            else:
                c = _ESCAPES.get(c, c)
        out.append(c)
    return "".join(out), (i + 1 if i < n and text[i] == quote else i)
