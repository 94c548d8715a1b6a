"""What the relay quotes of a collector's answers (dead letters' detail, log lines): its
credentials are scrubbed from the quote, and only from the quote. A batch reply is read
as the collector wrote it (a short token such as ``true`` replaced inside its JSON changed
what it said); text that is no secret stays readable. Against a real aiohttp server on
loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from relay.config import CollectorConfig
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from relay.sinks.http import HttpCollector
from tests.support.loopback_http import deliver_once

BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'
FAST = {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}


class Server:
    """Answers each POST with the next of ``answers`` for its path (the last one repeats)."""

    def __init__(self, single: list[Callable[[web.Request], web.Response]],
                 batch: list[Callable[[web.Request], web.Response]] | None = None) -> None:
        self.answers = {"/api/v1/lineage": single, "/api/v1/lineage/batch": batch or single}
        self.posts = {path: 0 for path in self.answers}
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        answers = self.answers[request.path]
        self.posts[request.path] += 1
        return answers[min(self.posts[request.path], len(answers)) - 1](request)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Server], Server]]:
    runners = []

    async def start(server: Server) -> Server:
        app = web.Application()
        app.router.add_post("/api/v1/lineage", server.handle)
        app.router.add_post("/api/v1/lineage/batch", server.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return server
    yield start
    for runner in runners:
        await runner.cleanup()


def answer(status: int, text: str) -> Callable[[web.Request], web.Response]:
    return lambda _request: web.Response(status=status, text=text)


async def delivered(collector, body: bytes = BODY):
    return await deliver_once(collector, body)


@pytest.mark.parametrize("token", ["true", "index"])
async def test_a_batch_reply_means_what_it_says_whatever_the_token(serve, token):
    """Token ``true``: the retriable failure counted as delivered (lost); token ``index``:
    the failure could not be placed and every event was sent again alone."""
    failed = answer(200, '{"status":"partial_success","failed_events":[{"index":0,"reason":"busy","retriable":true}]}')
    server = await serve(Server([answer(201, "")], [failed, answer(204, "")]))
    cfg = CollectorConfig(name="b", url=server.url, token=token, batch={"linger_ms": 5}, retry=FAST)
    assert await delivered(BatchCollector(cfg, RelayMetrics().for_collector("b"))) is None
    assert server.posts == {"/api/v1/lineage/batch": 2, "/api/v1/lineage": 0}, "retried as a batch, not alone"


async def test_a_batch_reason_quoting_the_token_is_scrubbed_in_the_dead_letter(serve):
    reason = answer(200, '{"failed_events":[{"index":0,"reason":"bad token t0k-\\/9f8e7d6c","retriable":false}]}')
    server = await serve(Server([answer(400, "no")], [reason]))
    cfg = CollectorConfig(name="b", url=server.url, token="t0k-/9f8e7d6c", batch={"linger_ms": 5}, retry=FAST)
    failure = await delivered(BatchCollector(cfg, RelayMetrics().for_collector("b")))
    assert failure is not None and "9f8e" not in failure.detail and "bad token ***" in failure.detail, failure


async def test_a_complete_answer_is_quoted_whole_even_if_it_ends_like_a_secret_begins(serve):
    server = await serve(Server([answer(400, "unknown dataset namespace: ware")]))
    cfg = CollectorConfig(name="c", url=server.url, headers={"X-Api-Key": "warehouse-key-0001"}, retry=FAST)
    failure = await delivered(HttpCollector(cfg, RelayMetrics().for_collector("c")))
    assert failure is not None and failure.detail == "HTTP 400: unknown dataset namespace: ware", failure


async def test_header_values_that_are_no_secret_stay_readable(serve):
    server = await serve(Server([answer(415, "expected Content-Type application/json for tenant analytics, "
                                             "key hdr-api-key-5c6d")]))
    cfg = CollectorConfig(name="c", url=server.url, retry=FAST,
                          headers={"Accept": "application/json", "X-Tenant": "analytics",
                                   "X-Api-Key": "hdr-api-key-5c6d"})
    failure = await delivered(HttpCollector(cfg, RelayMetrics().for_collector("c")))
    assert failure is not None
    assert failure.detail == "HTTP 415: expected Content-Type application/json for tenant analytics, key ***", failure


@pytest.mark.parametrize("echo,quoted", [
    # A JSON encoder that escapes '/' (PHP's json_encode, some Java and .NET ones).
    ('{"error":"bad token abc\\/DEF+ghi\\/jkl=="}', '{"error":"bad token ***"}'),
    # The key of "ApiKey <key>" echoed alone.
    ("unknown key k3y-9f8e7d6c5b4a", "unknown key ***"),
])
async def test_secrets_in_other_forms_are_scrubbed(serve, echo, quoted):
    server = await serve(Server([answer(400, echo)]))
    cfg = CollectorConfig(name="c", url=server.url, token="abc/DEF+ghi/jkl==", retry=FAST,
                          headers={"X-Auth": "ApiKey k3y-9f8e7d6c5b4a"})
    failure = await delivered(HttpCollector(cfg, RelayMetrics().for_collector("c")))
    assert failure is not None and failure.detail == f"HTTP 400: {quoted}", failure
