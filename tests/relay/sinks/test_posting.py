"""relay.sinks.posting: the lean request path sends what session.post() sends, reuses the
pool, and fails with the same aiohttp exceptions. A raw TCP server on loopback records the
bytes of each request and answers as scripted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import aiohttp
import pytest
from yarl import URL

from relay.sinks import posting
from relay.sinks.posting import LeanPoster, poster

BODY = b'{"eventType":"START","run":{"runId":"r"},"job":{"namespace":"n","name":"j"}}'
OK = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"


class RawServer:
    """Reads one request at a time per connection (headers and a Content-Length body) and
    answers with ``answer`` (None: closes the connection without answering; ``close_after``:
    closes it after each answer)."""

    def __init__(self, answer: bytes | None = OK, *, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> URL:
        assert self._server is not None
        return URL(f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/api/v1/lineage")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                if self.answer is None:
                    break
                writer.write(self.answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _session(**kw) -> aiohttp.ClientSession:
    # As HttpCollector.start() builds it.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=4), headers={"Content-Type": "application/json",
                                                          "Authorization": "Bearer old", "User-Agent": "ua/1"},
        cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), raise_for_status=False, **kw)


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer rotated"}], ids=["defaults", "own_header"])
async def test_the_lean_path_sends_the_bytes_session_post_sends(headers):
    async with RawServer() as server, _session() as session:
        lean = poster(session, traced=False)
        assert isinstance(lean, LeanPoster)
        resp = await session.post(server.url, data=BODY, headers=headers, allow_redirects=False)
        resp.release()
        resp = await lean(server.url, BODY, headers)
        status = resp.status
        resp.release()
    assert status == 201
    assert len(server.requests) == 2
    assert server.requests[1] == server.requests[0]
    assert server.requests[1].endswith(b"\r\n\r\n" + BODY)
    expected = b"Bearer old" if headers is None else b"Bearer rotated"
    auth = [line for line in server.requests[1].split(b"\r\n") if line.lower().startswith(b"authorization:")]
    assert auth == [b"Authorization: " + expected]


async def test_the_lean_path_reuses_the_pools_connections():
    async with RawServer() as server, _session() as session:
        lean = poster(session, traced=False)

        async def one() -> int:
            resp = await lean(server.url, BODY, None)
            resp.release()
            return resp.status

        for _ in range(3):   # 3 rounds of 4 in flight, the connector's limit
            assert await asyncio.gather(*(one() for _ in range(4))) == [201] * 4
    # Reused: 12 requests over no more connections than the connector's limit.
    assert server.connections <= 4 < len(server.requests) == 12


async def test_an_answers_body_is_read_as_from_session_post():
    answer = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n"
              b'{"error":"x"}')
    async with RawServer(answer) as server, _session() as session:
        resp = await poster(session, traced=False)(server.url, BODY, None)
        assert (resp.status, await resp.read()) == (400, b'{"error":"x"}')
        resp.release()


#: A batch endpoint's partial success, its body ended by the server closing the connection.
_REPLY = b'{"status":"partial_success","failed_events":[{"index":1,"retriable":false}]}'


@pytest.mark.parametrize("head", [b"HTTP/1.0 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\n\r\n"], ids=["http10", "http11_close", "http11_no_length"])
async def test_a_body_ended_by_the_connections_close_is_read_as_from_session_post(head):
    """No Content-Length, not chunked: the body runs to the close. Read as empty, a batch
    reply listing failed events would count every event delivered (found in review)."""
    bodies = []
    async with RawServer(answer=head + _REPLY, close_after=True) as server, _session() as session:
        for send in (poster(session, traced=True), poster(session, traced=False)):
            resp = await asyncio.wait_for(send(server.url, BODY, None), 10)
            try:
                bodies.append((resp.status, await asyncio.wait_for(resp.read(), 10)))
            finally:
                resp.release()
        assert isinstance(send, LeanPoster)
    assert bodies == [(200, _REPLY), (200, _REPLY)]


#: A setting LeanPoster would not apply, as ClientSession's keyword and a value for it (built
#: in the test: a cookie jar wants a running loop).
_IGNORED = {"auth": lambda: aiohttp.BasicAuth("u", "p"), "raise_for_status": lambda: True,
            "skip_auto_headers": lambda: ["User-Agent"], "trust_env": lambda: True,
            "version": lambda: aiohttp.HttpVersion10, "cookie_jar": lambda: aiohttp.CookieJar(),
            "proxy": lambda: "http://127.0.0.1:9"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # aiohttp 3.14 deprecates a session's auth
@pytest.mark.parametrize("setting", sorted(_IGNORED))
async def test_a_session_setting_the_lean_path_would_not_apply_posts_through_session_post(setting):
    if setting == "proxy" and "proxy" not in aiohttp.ClientSession.__init__.__code__.co_varnames:
        pytest.skip("this aiohttp has no session-wide proxy")
    async with _session() as plain:
        assert posting.lean_ignores(plain) == [] and isinstance(poster(plain, traced=False), LeanPoster)
    kw = {setting: _IGNORED[setting]()}
    if setting in ("cookie_jar", "raise_for_status"):   # keywords _session() sets itself
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4), auto_decompress=False,
                                        **{"cookie_jar": aiohttp.DummyCookieJar(), **kw})
    else:
        session = _session(**kw)
    async with session:
        assert posting.lean_ignores(session) == [setting]
        assert not isinstance(poster(session, traced=False), LeanPoster)


async def test_no_answer_is_the_same_aiohttp_error_either_way():
    async with RawServer(answer=None) as server, _session() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.post(server.url, data=BODY, allow_redirects=False)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await poster(session, traced=False)(server.url, BODY, None)


async def test_a_refused_connection_is_the_same_aiohttp_error_either_way():
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = URL(f"http://127.0.0.1:{s.getsockname()[1]}/api/v1/lineage")
        async with _session() as session:
            errors = []
            for send in (lambda: session.post(url, data=BODY, allow_redirects=False),
                         lambda: poster(session, traced=False)(url, BODY, None)):
                with pytest.raises(aiohttp.ClientConnectorError) as caught:
                    await send()
                errors.append(type(caught.value))
    assert errors[0] is errors[1]


async def test_a_closed_session_refuses_like_session_post():
    session = _session()
    lean = poster(session, traced=False)
    await session.close()
    with pytest.raises(RuntimeError, match="Session is closed"):
        await lean(URL("http://127.0.0.1:9/x"), BODY, None)


async def test_a_traced_session_posts_through_session_post_and_its_traces_run():
    started = []

    async def on_start(_session, _ctx, params) -> None:
        started.append(params.url)

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    async with RawServer() as server, _session(trace_configs=[trace]) as session:
        send = poster(session, traced=True)
        assert not isinstance(send, LeanPoster)
        url = server.url
        resp = await send(url, BODY, None)
        resp.release()
    assert resp.status == 201
    assert started == [url]


async def test_an_aiohttp_the_lean_path_does_not_know_posts_through_session_post(monkeypatch, caplog):
    monkeypatch.setattr(posting, "_UNSUPPORTED", "aiohttp's ClientRequest or response parser takes no ssl")
    monkeypatch.setattr(posting, "_fallback_logged", False)
    caplog.set_level(logging.INFO, logger=posting.__name__)
    async with RawServer() as server, _session() as session:
        sends = [poster(session, traced=False) for _ in range(2)]
        assert not any(isinstance(send, LeanPoster) for send in sends)
        resp = await sends[0](server.url, BODY, None)
        resp.release()
    assert resp.status == 201
    offs = [r for r in caplog.records if r.getMessage() == "lean_posts_off"]
    assert len(offs) == 1   # logged once, naming what is missing
    assert "takes no ssl" in offs[0].fields["detail"]


@pytest.mark.parametrize(("version", "lean"), [
    ("3.10.0", True), ("3.14.5", True), ("3.9.5", False), ("3.15.0", False), ("3.15.0a1", False),
    ("4.0.0", False), ("2.3.10", False), ("garbage", False),
])
def test_the_lean_path_applies_only_to_the_aiohttp_releases_it_was_tested_with(version, lean):
    reason = posting._supported(version)
    assert (reason is None) is lean
    if not lean:   # the log line says which release and which ones are tested
        assert version in reason and "3.10 to 3.14" in reason


def test_the_installed_aiohttp_takes_the_lean_path_when_it_is_a_tested_release():
    # CI runs this module on the newest allowed aiohttp and on the lowest (.ci/run): a tested
    # release the lean path no longer fits (by signature) must be seen there, not fall back
    # unnoticed; a newer release than those tested falls back, saying so.
    first, last = posting.TESTED_AIOHTTP
    if first <= posting._minor(aiohttp.__version__) <= last:
        assert posting._UNSUPPORTED is None, posting._UNSUPPORTED
    else:
        assert "not among the releases the lean path is tested with" in posting._UNSUPPORTED
