"""A collector's POSTs through aiohttp's connection pool, without ``ClientSession.request``.

``session.post()`` sets up, for every call, what a collector's requests never use:
redirects, cookies, proxies, ``netrc``, middlewares, per-request timeouts and timer
contexts, trace hooks, a closure and a context-manager wrapper. Measured on the reference
machine (32 POSTs of 3.5 KB in flight to a loopback collector, uvloop): ~42-47 µs of the
client's CPU per POST through ``session.post()``, ~31-35 through :class:`LeanPoster`. The
relay's single-event delivery is mostly this cost (see ``bench/README.md``).

:class:`LeanPoster` does what ``ClientSession._request`` does for such a request and
nothing else: it builds aiohttp's own ``ClientRequest`` with the session's default headers
(a request's own headers, such as a rotated token, replace them), takes a connection from
the session's connector (its pool, limit, TLS context and keep-alive), sets the response
parser up, sends, and reads the status line and headers. What goes on the wire is what
``session.post(url, data=body, headers=..., allow_redirects=False)`` sends (a test compares
the two), and failures come out as the same aiohttp exceptions: a connection that cannot
be made, ``ClientConnectorError``; no answer, ``ServerDisconnectedError``; any other
``OSError``, ``ClientOSError``; a connect timeout, ``ConnectionTimeoutError``. The answer
is an ``aiohttp.ClientResponse``, read and released as one from ``session.post()``.

Not covered, so :func:`poster` falls back to ``session.post()``: a session with trace
configs (``HttpCollector.check_before_requests``: the checks hang on aiohttp's request
traces) or with a setting the lean path would not apply (:func:`lean_ignores`: auth,
proxy, cookies, ...; none that ``HttpCollector`` sets), and an aiohttp this module was not
tested with: a minor release outside
:data:`TESTED_AIOHTTP`, or one whose ``ClientRequest`` or response parser take other
arguments than those this module passes (checked once, by version and signature; the
fallback is logged once). The lean path reaches into aiohttp's internals, which a minor
release may change without notice; ``session.post()`` is the public API and always works.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from aiohttp import ClientRequest, ClientResponse, ClientSession
from aiohttp.client_exceptions import ClientOSError, ConnectionTimeoutError
from aiohttp.client_proto import ResponseHandler
from multidict import CIMultiDict
from yarl import URL

from relay.logs import log_event

log = logging.getLogger(__name__)

#: ``(url, body, headers or None) -> response``, the headers replacing the session's defaults.
Post = Callable[[URL, bytes, "Mapping[str, str] | None"], Awaitable[ClientResponse]]

_REQUEST_ARGS = frozenset({"headers", "data", "loop", "response_class", "session", "ssl"})
_RESPONSE_ARGS = frozenset({"read_until_eof", "auto_decompress"})
_fallback_logged = False
#: The aiohttp minor releases the lean path is tested with (first, last), both included:
#: tests/relay/sinks run on each (3.10.11, 3.11.18, 3.12.15, 3.13.5 and 3.14.5 on 2026-11-29;
#: CI runs them on the lowest, see .ci/run). Extend it only after the same check.
TESTED_AIOHTTP = ((3, 10), (3, 14))


def _minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``3.14.5`` or ``3.15.0a1``; None if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def _supported(version: str = aiohttp.__version__) -> str | None:
    """None when the lean path applies to this aiohttp (``version``), else why not."""
    minor = _minor(version)
    first, last = TESTED_AIOHTTP
    if minor is None or not first <= minor <= last:
        return (f"aiohttp {version} is not among the releases the lean path is tested with "
                f"({first[0]}.{first[1]} to {last[0]}.{last[1]}); requests go through session.post()")
    try:
        request = set(inspect.signature(ClientRequest.__init__).parameters)
        response = set(inspect.signature(ResponseHandler.set_response_params).parameters)
    except (AttributeError, TypeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    missing = sorted((_REQUEST_ARGS - request) | (_RESPONSE_ARGS - response))
    if missing:
        return "aiohttp's ClientRequest or response parser takes no " + ", ".join(missing)
    for name in ("connect", "close"):
        if not callable(getattr(aiohttp.BaseConnector, name, None)):
            return f"aiohttp's connector has no {name}()"
    return None


_UNSUPPORTED = _supported()


class LeanPoster:
    """POSTs through ``session``'s connector (see the module docstring). Built on the
    session's event loop; the session stays the owner of the connector and closes it."""

    def __init__(self, session: ClientSession) -> None:
        self._session = session
        self._connector = session.connector
        self._timeout = session.timeout
        self._headers = CIMultiDict(session.headers)
        self._auto_decompress = session.auto_decompress
        self._loop = asyncio.get_running_loop()

    async def __call__(self, url: URL, body: bytes, headers: Mapping[str, str] | None = None) -> ClientResponse:
        if self._session.closed:
            raise RuntimeError("Session is closed")
        if headers:
            merged = self._headers.copy()
            merged.update(headers)
        else:
            merged = self._headers
        req = ClientRequest("POST", url, headers=merged, data=body, loop=self._loop,
                            response_class=ClientResponse, session=self._session, ssl=True)
        connector = self._connector
        assert connector is not None
        try:
            conn = await connector.connect(req, traces=[], timeout=self._timeout)
        except asyncio.TimeoutError as exc:
            raise ConnectionTimeoutError(f"Connection timeout to host {req.url}") from exc
        except aiohttp.ClientError:
            raise
        except OSError as exc:
            raise ClientOSError(*exc.args) from exc
        try:
            assert conn.protocol is not None
            conn.protocol.set_response_params(read_until_eof=True, auto_decompress=self._auto_decompress)
            resp = await req.send(conn)
            try:
                await resp.start(conn)
            except BaseException:
                resp.close()
                raise
        except BaseException as exc:
            conn.close()
            if isinstance(exc, OSError) and not isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError)):
                raise ClientOSError(*exc.args) from exc
            raise
        return resp


def lean_ignores(session: ClientSession) -> list[str]:
    """The settings of ``session`` that :class:`LeanPoster` would not apply (it sends as a
    session built the way ``HttpCollector.start()`` builds one: no auth, proxy, base url,
    middlewares, skipped headers or cookies, HTTP/1.1, answers not raised for status)."""
    ignored = []
    if session.auth is not None:
        ignored.append("auth")
    if session.raise_for_status is not False:
        ignored.append("raise_for_status")
    if session.skip_auto_headers:
        ignored.append("skip_auto_headers")
    if session.trust_env:
        ignored.append("trust_env")
    if session.version != aiohttp.HttpVersion11:
        ignored.append("version")
    if not isinstance(session.cookie_jar, aiohttp.DummyCookieJar):
        ignored.append("cookie_jar")
    for name, attr in (("proxy", "_default_proxy"), ("base_url", "_base_url"), ("middlewares", "_middlewares")):
        if getattr(session, attr, None):
            ignored.append(name)
    return ignored


def poster(session: ClientSession, *, traced: bool) -> Post:
    """How ``session``'s collector POSTs: a :class:`LeanPoster`, or ``session.post()`` where
    the lean path does not apply (``traced``, an aiohttp it does not know, or a session
    with a setting it would not apply: :func:`lean_ignores`)."""
    global _fallback_logged
    if not traced and _UNSUPPORTED is None and not lean_ignores(session):
        return LeanPoster(session)
    if _UNSUPPORTED is not None and not _fallback_logged:
        _fallback_logged = True
        log_event(log, logging.INFO, "lean_posts_off", aiohttp=aiohttp.__version__, detail=_UNSUPPORTED)

    async def post(url: URL, body: bytes, headers: Mapping[str, str] | None = None) -> ClientResponse:
        return await session.post(url, data=body, headers=headers, allow_redirects=False)

    return post
