"""Credentials out of text: ``user:password@`` in URLs and secret query parameters.

:class:`Redactor` is what ``rewrite.redact_credentials`` applies to every string of an
event's job, datasets and facets (see :mod:`relay.stages.rewrite`). Pure; linear in the
text, with bounds on hostile input.
"""

from __future__ import annotations

import re

DEFAULT_SECRET_QUERY_PARAMS: tuple[str, ...] = (
    "password", "passwd", "pwd", "secret", "client_secret", "token", "access_token", "refresh_token",
    "id_token", "api_key", "apikey", "access_key", "secret_key", "sessiontoken", "session_token",
    # Azure SAS: sig is the secret; the rest dies with it and would make names unstable
    # (only where a sig is: see _SAS_ONLY).
    "sig", "signature", "sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd",
    "skoid", "sktid", "skt", "ske", "sks", "skv",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential",
)

#: Azure SAS parameters that are no secret alone and common words elsewhere (``?st=open``):
#: removed only from a text that also has a ``sig=``.
_SAS_ONLY = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd", "skoid", "sktid", "skt",
                       "ske", "sks", "skv"})
_SAS_SIG = re.compile(r"[?&;]sig=", re.IGNORECASE)

# Userinfo in scheme://userinfo@host (see _strip_userinfo). A scheme starts only at the
# start of a run of scheme characters; a URL ends at whitespace, a quote or <>.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,31}://")
_URL_END = re.compile(r"[\s\"'<>]")
# A host, an IPv6 literal, each with an optional port; several, comma-separated (MongoDB);
# then the end of the authority: a path, a query, a fragment, JDBC's ';', or the URL's end.
_HOST_PART = r"(?:\[[0-9A-Fa-f:.]{2,64}\]|[A-Za-z0-9._~%\-]{1,253})(?::[0-9]{0,5})?"
_HOSTS = re.compile(rf"{_HOST_PART}(?:,{_HOST_PART}){{0,31}}(?=[/?#;]|$)")
# The same, ending with punctuation that closes a URL quoted in a message ("...@db:5432,",
# "(...@db)", "...@db:5432."): taken only where no '@' of the URL ends as above, so that
# a password holding '@' is never cut there ("pa@ss!2024@db/x").
_HOSTS_IN_TEXT = re.compile(rf"{_HOST_PART}(?:,{_HOST_PART}){{0,31}}(?=[.,:;!?)\]}}]+$)")
# What follows the ':' of host:port when a path, query or fragment comes next.
_PORT_THEN_MORE = re.compile(r"[0-9]{1,5}[/?#]")
#: Schemes whose password-less userinfo is taken for a token (https://<token>@github.com/...).
_USER_IS_TOKEN = frozenset({"http", "https", "git+https", "git+http", "ws", "wss"})
#: Where a removed secret parameter began a query (see Redactor.text).
_MARK = "\x00"
_MARKED_QUERY = re.compile(r"\x00[&;]*(?=(?P<rest>[^&;#\s\"'<>]?))")
#: Bounds on hostile input: characters of a URL looked at, '@' tried per URL.
_URL_MAX = 4096
_AT_MAX = 32


class Redactor:
    """Removes credentials from text; built once per collector."""

    __slots__ = ("_always", "_sas")

    def __init__(self, secret_query_params: tuple[str, ...] = DEFAULT_SECRET_QUERY_PARAMS) -> None:
        always = [n for n in secret_query_params if n.lower() not in _SAS_ONLY]
        sas = [n for n in secret_query_params if n.lower() in _SAS_ONLY]
        self._always = _param_pattern(always)
        self._sas = _param_pattern(sas)

    def text(self, text: str) -> str:
        """``text`` itself when there is nothing to redact, so callers can test identity."""
        out = text
        if "://" in out and "@" in out:
            out = _strip_userinfo(out)
        if "=" in out and (self._always is not None or self._sas is not None):
            # A removed parameter that began a query leaves a mark, so that only there is
            # the query tidied up (``?&b=2`` -> ``?b=2``, a bare ``?`` dropped): not every
            # ``?`` in the text (a SQL placeholder, a question).
            marked = _MARK not in out
            start = _MARK if marked else "?"
            count = 0
            for pattern in (self._always, self._sas if _SAS_SIG.search(out) else None):
                if pattern is not None:
                    out, n = pattern.subn(lambda m: start if m.group("sep") == "?" else "", out)
                    count += n
            if count and marked:
                out = _MARKED_QUERY.sub(_tidy_query, out)
        return out


def _param_pattern(names: list[str]) -> re.Pattern[str] | None:
    """``?name=value``, ``&name=value`` or ``;name=value`` for any of ``names`` (case-
    insensitive); a JDBC value may be braced (``password={a;b}``)."""
    if not names:
        return None
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf"(?P<sep>[?&;])(?:{alternatives})=(?:\{{[^}}]*\}}|[^&;#\s\"'<>]*)", re.IGNORECASE)


def _tidy_query(m: re.Match[str]) -> str:
    """A marked query start: ``?`` before the parameters left, nothing when none is left."""
    return "?" if m.group("rest") else ""


def _strip_userinfo(text: str) -> str:
    """``text`` without the credentials in its URLs' userinfo (``text`` itself if none).

    ``user:password@`` always goes. The password may hold ``/`` and ``@`` (AWS secret keys
    do), and so may the user (Azure's ``user@server``): the userinfo ends at the first
    ``@`` followed by a host list and the end of the authority. It is not userinfo when a
    path comes before its ``:`` (``host/a@b``), when ``:`` is a port followed by a path, query
    or fragment (``host:8080/a@b``), or when ``[]{}?#`` come before its ``:`` (IPv6
    literals, templates, queries); after it they are the password's.
    A user alone stays (``postgres://readonly@db``, Azure's ``container@account``), except
    over http(s), where ``https://<token>@github.com`` is a credential."""
    out: list[str] = []
    done = 0
    for m in _SCHEME.finditer(text):
        start = m.end()
        if start <= done:
            continue
        end_m = _URL_END.search(text, start, start + _URL_MAX)
        url = text[start:end_m.start() if end_m else min(len(text), start + _URL_MAX)]
        scheme = m.group()[:-3].lower()
        at, found, in_text = url.find("@"), -1, -1
        for _ in range(_AT_MAX):
            if at < 0:
                break
            if _is_userinfo(url[:at], scheme):
                if _HOSTS.match(url, at + 1):
                    found = at
                    break
                if in_text < 0 and _HOSTS_IN_TEXT.match(url, at + 1):
                    in_text = at
            at = url.find("@", at + 1)
        found = found if found >= 0 else in_text
        if found >= 0:
            out.append(text[done:start])
            done = start + found + 1
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _is_userinfo(user: str, scheme: str) -> bool:
    if "://" in user:
        return False
    colon = user.find(":")
    name = user if colon < 0 else user[:colon]
    if any(c in name for c in "/[]{}?#"):
        return False  # a path, an IPv6 literal, a template or a query before any ':'
    if colon < 0:
        return bool(user) and scheme in _USER_IS_TOKEN
    # The password may hold anything a URL in text can (generated ones hold '#', '?', '[').
    return _PORT_THEN_MORE.match(user, colon + 1) is None  # else host:port/path, not user:password
