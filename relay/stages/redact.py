"""Credentials out of text: ``user:password@`` in URLs, Oracle's ``user/password@``, and
secret query, fragment and ``;`` parameters.

:class:`Redactor` is what ``rewrite.redact_credentials`` applies to every string of an
event's job, datasets and facets (see :mod:`relay.stages.rewrite`). Pure; linear in the
text, with bounds on hostile input (no pattern backtracks over more than a bounded run).
"""

from __future__ import annotations

import re

#: Names of parameters whose values are secrets, case-insensitive; ``*`` stands for any run
#: of name characters (letters, digits, ``_``, ``.``, ``-``). A name holding one of the words
#: goes (``accessToken``, ``sslpassword``, ``OAuthAccessToken``, ``private_key_file_pwd``,
#: ``trustCertificateKeyStorePassword``, Azure's ``AccountKey`` and ``SharedAccessKey``), and
#: so does a non-secret one holding them (``tokenizer``, ``SharedAccessKeyName``): a
#: parameter's value is no part of a dataset's name, and a leak costs more than the loss.
DEFAULT_SECRET_QUERY_PARAMS: tuple[str, ...] = (
    "*password*", "*passwd*", "*pwd*", "*secret*", "*token*", "*signature*", "*accountkey*",
    "*sharedaccesskey*",
    "api_key", "api-key", "apikey", "access_key",
    # Azure SAS: sig is the secret; the rest dies with it and would make names unstable
    # (only where a sig is: see _SAS_ONLY).
    "sig", "sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd",
    "skoid", "sktid", "skt", "ske", "sks", "skv",
    "x-amz-credential", "x-goog-credential",
)

#: Azure SAS parameters that are no secret alone and common words elsewhere (``?st=open``):
#: removed only from a text that also has a ``sig=``.
_SAS_ONLY = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd", "skoid", "sktid", "skt",
                       "ske", "sks", "skv"})
_SAS_SIG = re.compile(r"[?&;#]sig=", re.IGNORECASE)
#: A parameter name, and how long one may be (a longer one is not looked at: bounded work).
_NAME_CHAR = r"[\w.\-]"
_NAME_MAX = 128
#: A parameter's value: up to ``&``, ``;``, ``#`` or what ends a URL (see _URL_END), and a
#: ``'`` only where it can close a quoted URL: before those, ``,``, ``)``, ``]``, ``}`` or
#: the text's end (``WHERE u = 'https://h/p?password=x'``). Elsewhere it is the value's
#: (``password=ab'cd``, a doubled ``''``): a secret cut short at it was sent on. So a value
#: that ends with ``'`` keeps that last quote in the text, and one quoted URL followed by
#: another character (``'...?token=x'||'y'``) loses what follows up to the next separator.
_VALUE = r"""(?:[^&;#\s"'<>]|'(?![&;#\s"<>,)\]}]|$))*"""

# Userinfo in scheme://userinfo@host (see _strip_userinfo). A scheme starts where a run of
# letters starts (after a digit too: "1postgres://"). A URL ends at whitespace, '"' or <>
# (none can be in one, nor in the JSON or XML around one); a URL opened by a quote ends at
# the closing one (a ' doubled, as SQL escapes it, does not close it). Elsewhere ' and `
# may be a password's: RFC 3986 allows ' raw in userinfo, and generated passwords hold both.
_SCHEME = re.compile(r"(?<![A-Za-z])[A-Za-z][A-Za-z0-9+.\-]{0,31}://")
_URL_END = re.compile(r"[\s\"<>]")
_QUOTED_URL_END = {"'": re.compile(r"[\s\"<>]|(?<!')'(?!')"), "`": re.compile(r"[\s\"<>`]")}
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
# What follows the ':' of host:port in a list of URLs or hosts, up to the next URL's "://"
# (kafka://b1:9092,b2:9092,postgres://...).
_PORT_THEN_URL = re.compile(r"[0-9]{1,5}(?:,[A-Za-z0-9._~%\-]{1,253}(?::[0-9]{1,5})?){0,31}"
                            r",[A-Za-z][A-Za-z0-9+.\-]{0,31}")
#: Schemes whose password-less userinfo is taken for a token (https://<token>@github.com/...).
_USER_IS_TOKEN = frozenset({"http", "https", "git+https", "git+http", "ws", "wss"})
# Oracle's JDBC URLs put credentials as user/password@ with no "//" before them
# (jdbc:oracle:thin:scott/tiger@//db:1521/svc, ...@db:1521:orcl, ...@(DESCRIPTION=...)).
_ORACLE = re.compile(r"jdbc:oracle:[a-z0-9]{1,8}:(?=[^@/\s\"'<>:]{1,128}/)", re.IGNORECASE)
# What follows the '@' that ends Oracle's credentials: //host, a TNS descriptor, or a host
# then ':' or '/' or the URL's end.
_ORACLE_HOST = re.compile(r"//|\(|[A-Za-z0-9._\-]{1,253}(?:[:/]|$)")
#: Where a removed secret parameter began a query or a fragment (see Redactor.text).
_MARK_QUERY, _MARK_FRAGMENT = "\x00", "\x01"
_MARKED = re.compile(r"[\x00\x01][&;]*(?=(?P<rest>[^&;#\s\"'<>\x00\x01]?))")
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
        if "@" in out and ":" in out:
            if "://" in out:
                out = _strip_userinfo(out)
            if _ORACLE.search(out) is not None:
                out = _strip_oracle_userinfo(out)
        if "=" in out and (self._always is not None or self._sas is not None):
            # A removed parameter that began a query or a fragment leaves a mark, so that
            # only there is it tidied up (``?&b=2`` -> ``?b=2``, a bare ``?`` or ``#``
            # dropped): not every ``?`` in the text (a SQL placeholder, a question).
            marked = _MARK_QUERY not in out and _MARK_FRAGMENT not in out
            query, fragment = (_MARK_QUERY, _MARK_FRAGMENT) if marked else ("?", "#")

            def start(m: re.Match[str]) -> str:
                sep = m.group("sep")
                return query if sep == "?" else fragment if sep == "#" else ""

            count = 0
            for pattern in (self._always, self._sas if _SAS_SIG.search(out) else None):
                if pattern is not None:
                    out, n = pattern.subn(start, out)
                    count += n
            if count and marked:
                out = _MARKED.sub(_tidy_query, out)
        return out


def _param_pattern(names: list[str]) -> re.Pattern[str] | None:
    """``?name=value``, ``&name=value``, ``;name=value`` or ``#name=value`` for any of
    ``names`` (case-insensitive, ``*`` any run of name characters); a JDBC value may be
    braced (``password={a;b}``)."""
    if not names:
        return None
    # Names of the shape *word* share one alternative: one pass over a name, not one per word.
    words = [n[1:-1] for n in names if len(n) > 2 and n[0] == n[-1] == "*" and "*" not in n[1:-1]]
    alternatives = [_glob(n) for n in names if not (len(n) > 2 and n[1:-1] in words and n[0] == n[-1] == "*")]
    if words:
        anywhere = f"{_NAME_CHAR}{{0,{_NAME_MAX}}}"
        # The lookahead on first letters is only for speed: most positions fail at once.
        first = "".join(sorted({re.escape(w[0]) for w in words}))
        alternatives.insert(0, f"{anywhere}?(?=[{first}])(?:{'|'.join(re.escape(w) for w in words)}){anywhere}+")
    # The lookahead first: only a name (of bounded length) followed by '=' is looked into.
    return re.compile(rf"(?P<sep>[?&;#])(?={_NAME_CHAR}{{1,{_NAME_MAX}}}+=)(?:{'|'.join(alternatives)})="
                      rf"(?:\{{[^}}]{{0,256}}\}}|{_VALUE})", re.IGNORECASE)



def _glob(name: str) -> str:
    """A name with ``*`` as a pattern; a trailing ``*`` takes the rest of the name at once."""
    parts = [re.escape(part) for part in name.split("*")]
    lazy, rest = f"{_NAME_CHAR}{{0,{_NAME_MAX}}}?", f"{_NAME_CHAR}{{0,{_NAME_MAX}}}+"
    if len(parts) > 1 and not parts[-1]:
        return lazy.join(parts[:-1]) + rest
    return lazy.join(parts)


def _tidy_query(m: re.Match[str]) -> str:
    """A marked query or fragment start: ``?`` (``#``) before the parameters left, nothing
    when none is left."""
    if not m.group("rest"):
        return ""
    return "?" if m.group()[0] == _MARK_QUERY else "#"


def _strip_userinfo(text: str) -> str:
    """``text`` without the credentials in its URLs' userinfo (``text`` itself if none).

    ``user:password@`` always goes, whatever follows the host. The password may hold ``/``,
    ``@``, ``'``, even ``://`` (AWS secret keys and generated passwords do; see
    _before_next_url), and so may the user (Azure's
    ``user@server``): the userinfo ends at the first ``@`` followed by a host list and the
    end of the authority; failing that, at the first followed by a host and punctuation
    that ends the URL; failing that, at the last ``@`` that can end userinfo (whatever
    follows it: a backtick, ``。``, a non-ASCII host, a template): a password is never cut.
    It is not userinfo when a path comes before its ``:`` (``host/a@b``), when ``:`` is a
    port followed by a path, query or fragment (``host:8080/a@b``), or when ``[]{}?#`` come
    before its ``:`` (IPv6 literals, templates, queries); after it they are the password's.
    A user alone stays (``postgres://readonly@db``, Azure's ``container@account``), except
    over http(s), where ``https://<token>@github.com`` is a credential."""
    out: list[str] = []
    done = 0
    for m in _SCHEME.finditer(text):
        start = m.end()
        if start <= done:
            continue
        limit = min(len(text), start + _URL_MAX)
        following = text.find("://", start, limit)
        if following >= 0:
            limit = _before_next_url(text, start, following, limit)
        scheme = m.group()[:-3].lower()
        quoted = _QUOTED_URL_END.get(text[m.start() - 1] if m.start() else "")
        if quoted is None:
            found = _userinfo_end(_url(text, start, limit, _URL_END), scheme, strict=False)
        else:
            # Quoted: up to the closing quote; past it (a password holding the quote) only
            # where the userinfo's end is beyond doubt, not a quoted e-mail further on.
            found = _userinfo_end(_url(text, start, limit, quoted), scheme, strict=False)
            if found < 0:
                found = _userinfo_end(_url(text, start, limit, _URL_END), scheme, strict=True)
        if found >= 0:
            out.append(text[done:start])
            done = start + found + 1
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _before_next_url(text: str, start: int, following: int, limit: int) -> int:
    """Where the URL whose authority begins at ``start`` ends at the latest, given the next
    ``://`` in the text, at ``following``: there, where it begins another URL
    (``http://a.com,postgres://u:p@db``); past it, up to the next ``://`` after the first
    ``@`` beyond it, where it is in a password (``postgres://u:SEC://RET@db``: a ``:`` of
    ``user:`` comes before it, and an ``@`` after it). Such a password taken for another URL
    was left whole in the text. Bounded: one more ``://`` and one ``@`` looked for."""
    colon = text.find(":", start, following)
    if colon < 0 or any(c in text[start:colon] for c in "/[]{}?#") or _PORT_THEN_MORE.match(text, colon + 1, limit) \
            or _PORT_THEN_URL.fullmatch(text, colon + 1, following):
        return following  # no user:password before it (see _is_userinfo), or host:port,<next URL>
    at = text.find("@", following + 3, limit)
    if at < 0:
        return following  # no userinfo past it
    after = text.find("://", at + 1, limit)
    return after if after >= 0 else limit


def _url(text: str, start: int, limit: int, end: re.Pattern[str]) -> str:
    end_m = end.search(text, start, limit)
    return text[start:end_m.start() if end_m else limit]


def _userinfo_end(url: str, scheme: str, strict: bool) -> int:
    """Where in ``url`` (the text after ``://``) the userinfo's ``@`` is, or -1; with
    ``strict``, only an ``@`` followed by a host list and the end of the authority."""
    at, in_text, last = url.find("@"), -1, -1
    for _ in range(_AT_MAX):
        if at < 0:
            break
        if _is_userinfo(url[:at], scheme):
            if _HOSTS.match(url, at + 1):
                return at
            if in_text < 0 and _HOSTS_IN_TEXT.match(url, at + 1):
                in_text = at
            last = at
        at = url.find("@", at + 1)
    if strict:
        return -1
    return in_text if in_text >= 0 else last


def _is_userinfo(user: str, scheme: str) -> bool:
    colon = user.find(":")
    name = user if colon < 0 else user[:colon]
    if any(c in name for c in "/[]{}?#"):
        return False  # a path, an IPv6 literal, a template or a query before any ':'
    if colon < 0:
        return bool(user) and scheme in _USER_IS_TOKEN
    # The password may hold anything a URL in text can (generated ones hold '#', '?', '[').
    return _PORT_THEN_MORE.match(user, colon + 1) is None  # else host:port/path, not user:password


def _strip_oracle_userinfo(text: str) -> str:
    """``text`` without ``user/password`` in its Oracle JDBC URLs, the ``@`` kept
    (``jdbc:oracle:thin:@//db:1521/svc``, the URL without credentials). The password ends
    at the first ``@`` followed by ``//``, ``(`` or a host and ``:``, ``/`` or the URL's
    end; failing that, at the last ``@`` of the URL (a password is never cut)."""
    out: list[str] = []
    done = 0
    matches = list(_ORACLE.finditer(text))
    for i, m in enumerate(matches):
        start = m.end()
        if start < done:
            continue
        # Not past the next Oracle URL: its credentials are its own.
        limit = min(len(text), start + _URL_MAX, matches[i + 1].start() if i + 1 < len(matches) else len(text))
        url = _url(text, start, limit, _QUOTED_URL_END.get(text[m.start() - 1] if m.start() else "", _URL_END))
        at, found, last = url.find("@"), -1, -1
        for _ in range(_AT_MAX):
            if at < 0:
                break
            if _ORACLE_HOST.match(url, at + 1):
                found = at
                break
            last = at
            at = url.find("@", at + 1)
        found = found if found >= 0 else last
        if found >= 0:
            out.append(text[done:start])
            done = start + found  # the '@' stays: jdbc:oracle:thin:@host
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)
