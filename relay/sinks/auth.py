"""Where a collector's credentials come from: the bearer token and the TLS context.

:class:`TokenSource` gives the token to send. An inline token or one from ``token_env`` is
fixed for the process's life; a ``token_file`` (a mounted secret) is re-read when it
changes: its identity (inode, mtime, size) is checked at most once per ``check_every_s``,
and at once when the collector answers 401, so a rotated secret is used without restart.

Secrets never print: nothing here logs a token or puts it in an exception message, and
:meth:`TokenSource.__repr__` shows where the token comes from, not what it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import time
from collections.abc import Callable

from relay.config import CollectorConfig
from relay.errors import ConfigError
from relay.logs import log_event

log = logging.getLogger("relay.sinks.auth")

#: A token file is stat()ed at most this often (plus on every 401).
CHECK_EVERY_S = 1.0
#: Tokens of a rotating file scrubbed from answers: the current one and those before it (an
#: answer to a request sent just before a rotation may quote the old one).
TOKENS_REMEMBERED = 4
#: Secret header values shorter than this are not scrubbed from answers: so short a value is
#: no key, and replacing it everywhere would garble the answer (tokens are always scrubbed).
MIN_HEADER_SECRET = 8
#: A secret's first bytes at the end of an answer cut short are scrubbed from this many on.
_PREFIX_MIN = 4


class TokenSource:
    """The current token of one collector (``None``: it sends no credentials)."""

    def __init__(self, config: CollectorConfig, *, clock: Callable[[], float] = time.monotonic,
                 check_every_s: float = CHECK_EVERY_S) -> None:
        self._where = f"collectors.{config.name}"
        self._file = config.token_file
        self._clock = clock
        self._check_every_s = check_every_s
        self._next_check = 0.0
        self._stamp: tuple[int, int, int] | None = None
        self._bad_stamp: tuple[int, int, int] | None = None
        self._token: str | None = None
        #: The tokens sent so far, latest last (at most TOKENS_REMEMBERED): see AnswerScrubber.
        self.sent: list[str] = []
        if config.token is not None:
            # Stripped as the other sources are: a value from ${VAR} often ends in a newline
            # (a Secret made from a file), which no HTTP header can carry.
            self._token = config.token.get_secret_value().strip()
        elif config.token_env is not None:
            # Judged stripped, as it is sent: a Secret made from a file holding only a newline
            # gives "\n", and passed for a token (every request then carried "Bearer ").
            value = os.environ.get(config.token_env, "").strip()
            if not value:
                raise ConfigError(f"{self._where}.token_env: environment variable {config.token_env} is not set "
                                  "or empty (or only spaces and line breaks); export it (e.g. from a Secret) or "
                                  "use token_file")
            self._token = value
            if not self._token.isprintable():  # an inline token is checked by CollectorConfig
                raise ConfigError(f"{self._where}.token_env: the token holds a line break or a control character, "
                                  "which no HTTP header can carry; set the token alone")
        #: True when the token can change while the relay runs.
        self.rotates = self._file is not None
        if self._file is not None:
            self._read(initial=True)
        if self._token:
            self.sent.append(self._token)

    def __repr__(self) -> str:
        source = f"file {self._file}" if self._file else ("fixed" if self._token else "none")
        return f"TokenSource({self._where}, {source})"

    def current(self) -> str | None:
        """The token to send now; for a token file, re-read if it changed (cheap: one
        ``stat`` per ``check_every_s`` at most)."""
        if self._file is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._check_every_s
                self._read()
        return self._token

    def refresh(self) -> bool:
        """Re-read a token file now (the collector refused the token). True if it changed."""
        if self._file is None:
            return False
        self._next_check = self._clock() + self._check_every_s
        return self._read()

    def _read(self, *, initial: bool = False) -> bool:
        assert self._file is not None
        try:
            st = os.stat(self._file)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return False
            # utf-8-sig: a byte order mark (Notepad, PowerShell 5's Out-File) is no part of
            # the token; it failed as "a line break or a control character inside the token".
            with open(self._file, encoding="utf-8-sig") as f:
                token = f.read().strip()
        except OSError as err:
            if initial:
                raise ConfigError(f"{self._where}.token_file: cannot read {self._file} ({err.strerror}); "
                                  "mount the secret there or fix the path") from None
            return False  # mid-rotation (file briefly absent): keep the last token
        except UnicodeDecodeError:
            # Never the error itself: it quotes the file's bytes, the token.
            return self._unusable(stamp, initial, "is not UTF-8 text (saved as UTF-16?)")
        if not token:
            if initial:
                raise ConfigError(f"{self._where}.token_file: {self._file} is empty; write the token into it")
            return False
        if not token.isprintable():
            # A header value cannot hold a line break or a control character: every request
            # would fail before it is sent.
            return self._unusable(stamp, initial, "holds a line break or a control character inside the token")
        self._stamp = stamp
        changed = token != self._token
        self._token = token
        if changed and not initial:
            self.sent = [*self.sent, token][-TOKENS_REMEMBERED:]
        return changed

    def _unusable(self, stamp: tuple[int, int, int], initial: bool, why: str) -> bool:
        """A token file that cannot be a token: fails at start-up; later the last good token
        stays in use (logged once per change of the file, never with its content)."""
        message = f"{self._where}.token_file: {self._file} {why}; write the token alone, as UTF-8 text"
        if initial:
            raise ConfigError(message)
        if stamp != self._bad_stamp:
            self._bad_stamp = stamp
            log_event(log, logging.WARNING, "token_file_unusable", error=message, hint="the last token stays in use")
        return False


class AnswerScrubber:
    """Takes a collector's credentials out of the text the relay quotes from its answers
    (dead letters' ``detail``, log lines): a collector or a gateway that echoes the request
    (``invalid token Bearer ...``, a debug echo of the headers) would otherwise put the token
    there. Its token(s) and the values of its custom headers whose name says they are secret
    (:data:`SECRET_HEADER`) become ``***``: as sent, as JSON escapes them, with ``/`` escaped
    as ``\\/``, and a value's key alone after its scheme word (``ApiKey <key>``).

    Only quoted text is scrubbed, never a body before it is read: a short token (``true``,
    ``index``) replaced inside a batch reply's JSON changed what the reply said. A 2xx
    answer that is not quoted costs nothing."""

    __slots__ = ("_tokens", "_headers", "_sent", "_forms")

    def __init__(self, config: CollectorConfig, tokens: TokenSource) -> None:
        self._tokens = tokens
        self._headers = [form for name, value in config.headers.items() if SECRET_HEADER.search(name)
                         for secret in _header_secrets(value) for form in _forms(secret)]
        self._sent: list[str] | None = None  # the tokens self._forms was made of
        self._forms: list[str] = []

    def text(self, text: str, *, cut: bool = False) -> str:
        """``text`` quoted from an answer, scrubbed; ``cut``: the answer was read (or
        quoted) only in part, so it may end inside a secret."""
        if not text:
            return text
        if self._tokens.sent is not self._sent:  # a new list on each rotation
            self._sent = self._tokens.sent
            # Longest first: a form inside a longer one must not leave the rest of it behind.
            self._forms = sorted({*(f for token in self._sent for f in _forms(token)), *self._headers},
                                 key=len, reverse=True)
        for form in self._forms:
            if form in text:
                text = text.replace(form, "***")
        if cut:
            for form in self._forms:
                text = _cut_short(text, form)
        return text

    def quote(self, body: bytes, limit: int, *, cut: bool) -> str:
        """The first ``limit`` characters of an answer's ``body``, scrubbed (``cut``: the
        body itself was read only in part)."""
        if not body:
            return ""
        # Scrubbed past the limit first: a secret across it is whole there, and what is
        # replaced gets shorter. A secret past the window's end is still cut short there.
        window = 3 * limit
        text = self.text(body[:window].decode("utf-8", "replace"))
        return self.text(text[:limit], cut=cut or len(text) > limit or len(body) > window)


#: Custom header names whose values are secrets (scrubbed from answers); other values (a
#: tenant's name, a content type) are no secret, and replacing them garbled the answer.
SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie|signature|password|credential", re.IGNORECASE)
#: A header value of a scheme word and a key (``ApiKey <key>``, ``Basic <base64>``).
_SCHEME_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9._-]*\s+(\S.*)")


def _header_secrets(value: str) -> list[str]:
    """A secret header's value, and its key alone when it follows a scheme word (a collector
    may echo the key without it); neither when shorter than :data:`MIN_HEADER_SECRET`."""
    value = value.strip()
    secrets = [value]
    if (scheme := _SCHEME_VALUE.fullmatch(value)) is not None:
        secrets.append(scheme.group(1).strip())
    return [secret for secret in secrets if len(secret) >= MIN_HEADER_SECRET]


def _cut_short(text: str, form: str) -> str:
    """``text`` without a start of ``form`` it ends with (a quote cut short may end inside
    a secret). Linear in ``form``'s length."""
    head = form[:_PREFIX_MIN]
    at = text.find(head, max(0, len(text) - len(form) + 1))
    while at != -1:
        if form.startswith(text[at:]):
            return text[:at] + "***"
        at = text.find(head, at + 1)
    return text


def _forms(secret: str) -> list[str]:
    """How ``secret`` can appear in an answer: as is, inside a JSON string, and so with
    ``/`` escaped as ``\\/`` (PHP's json_encode, some Java and .NET encoders); and as
    aiohttp quotes the raw bytes of a malformed answer (a Python bytes literal, its ``'``
    escaped or not), and that again inside the repr of the error's message. For a token of
    plain characters these are all the same string."""
    escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
    literal = _bytes_literal(secret)
    literals = (literal, literal.replace("'", "\\'"))
    in_repr = [form.replace("\\", "\\\\") for form in literals]
    return list(dict.fromkeys((secret, escaped, escaped.replace("/", "\\/"), *literals,
                               *in_repr, *(form.replace("'", "\\'") for form in in_repr))))


def _bytes_literal(secret: str) -> str:
    """``secret``'s UTF-8 bytes as inside ``repr(bytes)``, leaving ``'`` as is."""
    named = {0x5C: "\\\\", 0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    return "".join(named.get(b) or (chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}") for b in secret.encode())


def session_headers(config: CollectorConfig, tokens: TokenSource, user_agent: str) -> dict[str, str]:
    """What every request to the collector carries: the relay's own headers, the configured
    ``headers``, and a token that does not rotate (a rotating one goes per request).

    A configured header replaces the relay's of the same name in any case: header names
    ignore case, and ``content-type`` beside the relay's ``Content-Type`` was sent twice,
    which servers refuse (400: every event dead-lettered). Accept-Encoding is set here
    rather than through aiohttp's skip_auto_headers, which copies the headers on every
    request (measured: ~4% of the relay's CPU per event)."""
    own = {"Content-Type": "application/json", "User-Agent": user_agent, "Accept-Encoding": "identity"}
    given = {name.lower() for name in config.headers}
    headers = {name: value for name, value in own.items() if name.lower() not in given}
    headers.update(config.headers)
    token = tokens.current()
    if token is not None and not tokens.rotates:
        headers[config.auth_header] = auth_header_value(config, token)
    return headers


def auth_header_value(config: CollectorConfig, token: str) -> str:
    return f"{config.auth_scheme} {token}" if config.auth_scheme else token


def ssl_context(config: CollectorConfig) -> ssl.SSLContext | None:
    """The TLS context for ``config.tls``, or None for the defaults (system CAs, verified).

    Raises :class:`ConfigError` naming the key when a file cannot be loaded."""
    tls = config.tls
    if tls.ca_bundle is None and tls.client_cert is None and tls.verify:
        return None
    where = f"collectors.{config.name}.tls"
    try:
        context = ssl.create_default_context(cafile=tls.ca_bundle)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"{where}.ca_bundle: cannot load {tls.ca_bundle} ({_why(err)}); "
                          "give a readable PEM file of the CA certificate(s)") from None
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.client_cert is not None:
        try:
            # A password callback, so that OpenSSL never prompts for an encrypted key's
            # passphrase on the terminal: the relay (or check-config) would wait there.
            context.load_cert_chain(tls.client_cert, tls.client_key, password=_no_passphrase)
        except _EncryptedKey:
            key = "client_key" if tls.client_key else "client_cert"  # the key may be in the cert's file
            raise ConfigError(f"{where}.{key}: the private key in {tls.client_key or tls.client_cert} is "
                              "encrypted (it needs a passphrase, which the relay cannot be given); give it "
                              "unencrypted, e.g. openssl pkey -in <key> -out <plain key>, and mount it as a "
                              "secret") from None
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"{where}.client_cert: cannot load {tls.client_cert}"
                              f"{' with ' + tls.client_key if tls.client_key else ''} ({_why(err)}); "
                              "give PEM files of the client certificate and its unencrypted key") from None
    return context


class _EncryptedKey(Exception):
    """The client key asked for a passphrase."""


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _why(err: Exception) -> str:
    return getattr(err, "strerror", None) or getattr(err, "reason", None) or type(err).__name__
