"""HttpCollector against a real aiohttp collector on loopback with scripted faults."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay.config import CollectorConfig
from relay.embedded.collector import RecordingCollector
from relay.metrics import RelayMetrics
from relay.sinks.http import HttpCollector
from tests.support.loopback_http import serve as _serve
from tests.support.waiting import until

BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'


def collector_for(server: RecordingCollector, **kw) -> tuple[HttpCollector, RelayMetrics]:
    metrics = RelayMetrics()
    kw.setdefault("retry", {"initial_backoff_s": 0.01, "max_backoff_s": 0.05})
    cfg = CollectorConfig(name="c", url=server.url, **kw)
    return HttpCollector(cfg, metrics.for_collector("c")), metrics


@pytest.fixture
def server():
    with RecordingCollector(token="tok") as s:
        yield s


async def test_retries_resets_timeouts_and_5xx_until_delivered(server):
    server.fail_next(1, reset=True)
    server.fail_next(1, 502)
    server.fail_next(1, delay_s=5.0)  # longer than the client timeout below
    server.fail_next(1, 408)
    # Not shorter: an answer that comes at once may take a while on a loaded machine, and
    # its timeout would be one more retry (and, for the success, a second event).
    http, metrics = collector_for(server, token="tok", timeout_s=2.0)
    await http.start()
    try:
        assert await http.deliver(BODY) is None
    finally:
        await http.close()
    assert server.count == 1
    assert [a.status for a in server.attempts][:2] == [None, 502]
    assert metrics.registry.get_sample_value("lineage_relay_delivery_retries_total", {"collector": "c"}) == 4


async def test_4xx_is_permanent_with_status_and_snippet(server):
    http, _ = collector_for(server)  # no token: the server answers 401
    await http.start()
    try:
        failure = await http.deliver(BODY)
    finally:
        await http.close()
    assert failure is not None and failure.reason == "collector_rejected" and failure.status == 401
    assert "unauthorized" in failure.detail
    assert len(server.attempts) == 1


async def test_max_attempts_gives_up_with_retries_exhausted(server):
    server.set_outage(503)
    http, _ = collector_for(server, token="tok", retry={"max_attempts": 3, "initial_backoff_s": 0.01, "max_backoff_s": 0.05})
    await http.start()
    try:
        failure = await http.deliver(BODY)
    finally:
        await http.close()
    assert failure is not None and failure.reason == "retries_exhausted" and failure.status == 503
    assert len(server.attempts) == 3


async def test_retry_after_blocks_every_request_to_that_collector(server):
    server.fail_next(1, 429, retry_after="2")
    http, _ = collector_for(server, token="tok")
    await http.start()
    try:
        first = asyncio.create_task(http.deliver(BODY))
        # That a Retry-After was taken lasts (a look for "inside the window now" could miss it
        # on a loop stalled for the window's length).
        await until(lambda: http._not_before > 0, "the client to have taken the Retry-After")
        second_started = time.monotonic()
        window_ends = http._not_before
        assert await http.deliver(BODY + b" ") is None
        assert await first is None
    finally:
        await http.close()
    ok_times = [a.at for a in server.attempts if a.status == 201]
    assert len(ok_times) == 2
    assert min(ok_times) - server.attempts[0].at >= 2.0, "a request overran the collector's Retry-After"
    assert second_started < window_ends, "the second request did not start inside the Retry-After window"


@pytest.mark.parametrize("header", ["86400", "Fri, 31 Dec 2100 23:59:59 GMT"])
async def test_a_retry_after_longer_than_max_retry_after_s_is_taken_as_it(server, header):
    """One 429 with ``Retry-After: 86400`` (a proxy's, or a date from a clock running ahead)
    held every request to the collector for an hour (the fixed cap), long after it recovered."""
    server.fail_next(1, 429, retry_after=header)
    http, _ = collector_for(server, token="tok", retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05,
                                                        "max_retry_after_s": 1.5})
    await http.start()
    try:
        assert await asyncio.wait_for(http.deliver(BODY), 30) is None
    finally:
        await http.close()
    ok_times = [a.at for a in server.attempts if a.status == 201]
    assert len(ok_times) == 1 and ok_times[0] - server.attempts[0].at >= 1.5


def test_max_retry_after_s_defaults_to_five_minutes_and_must_be_positive():
    assert CollectorConfig(name="c", url="http://x").retry.max_retry_after_s == 300.0
    with pytest.raises(ValueError, match="max_retry_after_s"):
        CollectorConfig(name="c", url="http://x", retry={"max_retry_after_s": 0})


async def test_401_with_a_token_file_rereads_it_and_delivers_once_fixed(server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("stale")
    http, metrics = collector_for(server, token_file=str(token_file))
    await http.start()
    try:
        delivery = asyncio.create_task(http.deliver(BODY))
        await until(lambda: len(server.attempts) >= 2, "two refusals (retried, not dead-lettered)")
        token_file.write_text("tok\n")
        assert await asyncio.wait_for(delivery, 10) is None
    finally:
        await http.close()
    statuses = [a.status for a in server.attempts]
    assert statuses[-1] == 201 and set(statuses[:-1]) == {401}
    assert server.received[0].headers["Authorization"] == "Bearer tok"


async def test_custom_auth_header_and_scheme():
    bare = RecordingCollector(token=None).start()
    try:
        http, _ = collector_for(bare, token="k-123", auth_header="X-API-Key", auth_scheme="",
                                headers={"X-Tenant": "data"})
        await http.start()
        try:
            assert await http.deliver(BODY) is None
        finally:
            await http.close()
        headers = bare.received[0].headers
        assert headers["X-API-Key"] == "k-123" and headers["X-Tenant"] == "data" and "Authorization" not in headers
    finally:
        bare.stop()


async def test_a_custom_header_replaces_the_relays_own_whatever_its_case():
    """Header names ignore case: ``content-type`` beside the relay's ``Content-Type`` went
    out twice, which the collector refused (400: every event dead-lettered)."""
    with RecordingCollector() as server:
        http, _ = collector_for(server, headers={"content-type": "application/json; charset=utf-8",
                                                 "user-agent": "acme-relay/1"})
        await http.start()
        try:
            assert await http.deliver(BODY) is None
        finally:
            await http.close()
        headers = server.received[0].headers
    assert headers["Content-Type"] == "application/json; charset=utf-8" and headers["User-Agent"] == "acme-relay/1"


async def test_connections_are_reused_whatever_the_success_answer_carries():
    """Keep-alive holds for every kind of 2xx answer: an empty body (Marquez's 201), a
    JSON body, and a body that comes after the headers (read before the connection goes
    back to the pool). Each answer's body is consumed: the next request on the connection
    gets its own answer, and no connection beyond the concurrency is ever opened."""
    from aiohttp import web

    peers: list[tuple[str, object]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind = request.match_info["kind"]
        peers.append((kind, request.transport.get_extra_info("peername") if request.transport else None))
        if kind == "empty":
            return web.Response(status=201)
        if kind == "json":
            return web.json_response({"status": "ok", "pad": "x" * 20_000}, status=200)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await asyncio.sleep(0.02)  # ok: the body comes in a later packet than the headers
        await response.write(b'{"late": true}')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/api/v1/lineage/{kind}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        for kind in ("empty", "json", "late"):
            cfg = CollectorConfig(name="c", url=f"http://127.0.0.1:{port}", endpoint=f"/api/v1/lineage/{kind}",
                                  concurrency=4)
            http = HttpCollector(cfg, RelayMetrics().for_collector("c"))
            await http.start()
            try:
                for _ in range(3):  # one at a time, then four at once, twice
                    assert await http.deliver(BODY) is None
                    assert await asyncio.gather(*(http.deliver(BODY) for _ in range(4))) == [None] * 4
            finally:
                await http.close()
    finally:
        await runner.cleanup()
    for kind in ("empty", "json", "late"):
        answered = [peer for k, peer in peers if k == kind]
        assert len(answered) == 15, (kind, len(answered))
        assert None not in answered and len(set(answered)) <= 4, (kind, len(set(answered)))


@pytest.mark.parametrize("status, relative", [(301, False), (302, False), (303, False), (307, False),
                                              (308, False), (301, True), (308, True)])
async def test_a_redirect_is_not_followed_and_the_event_is_not_taken_for_delivered(status, relative):
    """aiohttp follows redirects by default: a 301-303 (an http->https redirect, an SSO
    login page) was re-sent as a GET without the event, whose 200 counted as delivered;
    a 307/308 to another host took the event there with a custom auth header. Now the
    event is refused, and the detail says where it was sent and what to fix."""
    from aiohttp import web

    elsewhere: list[tuple[str, dict]] = []

    async def other(request: web.Request) -> web.Response:
        elsewhere.append((request.method, dict(request.headers)))
        return web.Response(status=200, text="<html>login</html>")

    other_runner, other_port = await _serve([("*", "/login", other)])

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        # Relative, as most are (a trailing slash added): it raised, so every event was a relay_error.
        return _redirect(status, "/login?next=x" if relative else f"http://127.0.0.1:{other_port}/login?next=x")

    runner, port = await _serve([("POST", "/api/v1/lineage", redirect)])
    try:
        cfg = CollectorConfig(name="c", url=f"http://127.0.0.1:{port}", token="k-s3cret", auth_header="X-API-Key",
                              auth_scheme="")
        http = HttpCollector(cfg, RelayMetrics().for_collector("c"))
        await http.start()
        try:
            failure = await http.deliver(BODY)
        finally:
            await http.close()
    finally:
        await runner.cleanup()
        await other_runner.cleanup()
    assert failure is not None and failure.reason == "collector_rejected" and failure.status == status
    where = f"http://127.0.0.1:{port if relative else other_port}/login"
    assert f"redirected to {where}:" in failure.detail and "next=x" not in failure.detail
    assert "set the collector's url" in failure.detail
    assert elsewhere == [], "nothing went to where the redirect pointed"


def _redirect(status: int, location: str):  # noqa: ANN202 - an aiohttp response
    from aiohttp import web

    return web.Response(status=status, headers={"Location": location})


async def test_a_request_waiting_out_a_retry_after_waits_for_a_longer_one_that_came_meanwhile():
    """Retry-After 1 s, then (from another request's answer) 3 s: a request that began
    waiting under the first waits for the second too, not only the 1 s it saw first."""
    http = HttpCollector(CollectorConfig(name="c", url="http://127.0.0.1:9"), RelayMetrics().for_collector("c"))
    began = time.monotonic()
    http._not_before = began + 1.0   # room for a stalled loop before the longer one comes
    waiting = asyncio.create_task(http._hold_back())
    await asyncio.sleep(0.1)  # ok: the first wait is under way when the longer Retry-After comes
    assert not waiting.done()
    http._not_before = began + 1.5
    assert await asyncio.wait_for(waiting, 5) is True
    assert time.monotonic() - began >= 1.5


class LongAnswer:
    """A collector on loopback whose first answer is a 200 with a 64 MiB body in 64 KiB
    writes (chunked, or announced by its Content-Length); it notes how much of it it got to
    write before the client went away. Later answers are a 201 with a short body. Each
    request's peer (host, port) is noted, to tell connections apart."""

    PIECE = b"x" * 65536
    SIZE = 64 * 1024 * 1024

    def __init__(self, framing: str) -> None:
        self.framing = framing
        self.written = 0
        self.finished = False
        self.ended = asyncio.Event()
        self.peers: list[object] = []
        self._runner = None
        self.url = ""

    async def _answer(self, request):  # noqa: ANN001, ANN202 - aiohttp handler
        from aiohttp import web

        await request.read()
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if len(self.peers) > 1:
            return web.Response(status=201, text='{"ok": true}')
        response = web.StreamResponse(status=200)
        if self.framing == "chunked":
            response.enable_chunked_encoding()
        else:
            response.content_length = self.SIZE
        try:
            await response.prepare(request)
            for _ in range(self.SIZE // len(self.PIECE)):
                await response.write(self.PIECE)
                self.written += len(self.PIECE)
            await response.write_eof()
            self.finished = True
        except OSError:  # the client went away: what was written so far is the measure
            pass
        finally:
            self.ended.set()
        return response

    async def __aenter__(self) -> LongAnswer:
        self._runner, port = await _serve([("POST", "/api/v1/lineage", self._answer)])
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
@pytest.mark.parametrize("path", ["first-attempt", "adaptive"])
async def test_a_2xx_with_a_huge_body_is_delivered_without_reading_the_body(framing, path):
    """The status of a 2xx is the acknowledgement; its body was read whole into memory
    (a 64 MiB one took 100 MiB, an endless one grew until the timeout, and was then
    retried although the collector had taken the event). Now at most _DRAIN_LIMIT is
    read, the connection is closed rather than reused mid-body, and the next request
    goes on a new connection and gets its own answer. Both ways to the POST: the inlined
    first attempt, and exchange() (taken with adaptive concurrency, and by retries)."""
    async with LongAnswer(framing) as server:
        extra = {"adaptive_concurrency": {}} if path == "adaptive" else {}
        http = HttpCollector(CollectorConfig(name="c", url=server.url, concurrency=1, retry={"max_attempts": 1},
                                             **extra), RelayMetrics().for_collector("c"))
        await http.start()
        try:
            assert await http.deliver(BODY) is None
            await asyncio.wait_for(server.ended.wait(), 10)  # the client went away mid-body
            assert await http.deliver(BODY) is None
        finally:
            await http.close()
    assert not server.finished
    # What the loopback's socket buffers take in besides the 64 KiB read: a few MiB.
    assert server.written <= LongAnswer.SIZE // 4, f"{server.written / 2**20:.0f} MiB written"
    assert len(server.peers) == 2 and server.peers[0] != server.peers[1], "the connection left mid-body was reused"


async def test_a_2xx_body_that_never_ends_is_cut_at_the_request_timeout():
    """A 2xx body that trickles (never over the read limit) is cut by timeout_s like any
    answer that does not come, and the attempt is retried (here: the only one)."""
    from aiohttp import web

    async def trickle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            for _ in range(1500):  # 30 s at most
                await response.write(b" ")
                await asyncio.sleep(0.02)  # ok: the pace of the trickle, not a wait for anything
        except OSError:
            pass
        return response

    runner, port = await _serve([("POST", "/api/v1/lineage", trickle)])
    try:
        http = HttpCollector(CollectorConfig(name="c", url=f"http://127.0.0.1:{port}", timeout_s=0.5,
                                             retry={"max_attempts": 1}), RelayMetrics().for_collector("c"))
        await http.start()
        try:
            began = time.monotonic()
            failure = await asyncio.wait_for(http.deliver(BODY), 10)
            took = time.monotonic() - began
        finally:
            await http.close()
    finally:
        await runner.cleanup()
    assert failure is not None and failure.reason == "retries_exhausted"
    assert "no answer within 0.5 s" in failure.detail
    assert 0.5 <= took < 3.0


async def test_a_started_collector_posts_through_the_lean_path_on_a_tested_aiohttp(server):
    """Its session has none of the settings the lean path would not apply: a setting added
    to it (or an aiohttp outside the tested releases) shows here, not as a silent slowdown."""
    from relay.sinks import posting

    http, _ = collector_for(server, token="tok")
    await http.start()
    try:
        assert posting.lean_ignores(http._session) == []
        if posting._UNSUPPORTED is None:
            assert isinstance(http._send, posting.LeanPoster)
        assert await http.deliver(BODY) is None
    finally:
        await http.close()
