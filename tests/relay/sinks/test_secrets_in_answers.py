"""A collector's credentials never come back through its answers: what a collector (or a
gateway in front of it) answers is quoted in dead letters' ``detail`` header and in log
lines, and some echo the request (``invalid token: Bearer ...``, a debug echo of the
headers). The token (inline, from a file, rotated) and custom header values are scrubbed.
Against a real aiohttp server on loopback that echoes what it got."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from relay.config import CollectorConfig
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from relay.sinks.http import HttpCollector
from tests.support.loopback_http import deliver_once, serve

BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'
TOKEN = "s3cr3t-token-8a7b"
API_KEY = "hdr-api-key-5c6d"


def echoed(request: web.Request) -> str:
    """What an echoing collector says back: the credentials it was sent."""
    return f"invalid credentials: {request.headers.get('Authorization')} key={request.headers.get('X-Api-Key')}"


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, list[int]]]:
    """Single events: a 503 (retried), then 400s, each quoting the credentials. Batches: a
    200 listing every event as failed, not retriable, with the credentials as the reason
    (JSON-escaped, as a JSON encoder writes them)."""
    statuses = [503]

    async def single(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=statuses.pop(0) if statuses else 400, text=echoed(request))

    async def batch(request: web.Request) -> web.Response:
        events = json.loads(await request.read())
        failed = [{"index": i, "reason": echoed(request), "retriable": False} for i in range(len(events))]
        return web.json_response({"failed_events": failed})

    runner, port = await serve([("POST", "/api/v1/lineage", single), ("POST", "/api/v1/lineage/batch", batch)])
    yield f"http://127.0.0.1:{port}", statuses
    await runner.cleanup()


def log_text(caplog) -> str:
    return "\n".join(f"{r.getMessage()} {r.__dict__.get('fields')}" for r in caplog.records)


async def test_an_echoed_token_and_api_key_reach_neither_the_dead_letter_nor_the_log(echo, caplog):
    url, _ = echo
    caplog.set_level(logging.DEBUG)
    cfg = CollectorConfig(name="c", url=url, token=TOKEN, headers={"X-Api-Key": API_KEY},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05})
    failure = await deliver_once(HttpCollector(cfg, RelayMetrics().for_collector("c")), BODY)
    assert failure is not None and failure.reason == "collector_rejected" and failure.status == 400
    assert "invalid credentials: Bearer *** key=***" in failure.detail, failure.detail
    logged = log_text(caplog)
    assert "delivery_retry" in logged and "invalid credentials" in logged, "the 503 was logged with its answer"
    for secret in (TOKEN, API_KEY):
        assert secret not in failure.detail and secret not in logged


async def test_a_rotated_token_file_is_scrubbed_old_and_new(echo, tmp_path):
    url, statuses = echo
    path = tmp_path / "token"
    path.write_text("old-token-1234\n")
    cfg = CollectorConfig(name="c", url=url, token_file=str(path), retry={"max_attempts": 1})
    http = HttpCollector(cfg, RelayMetrics().for_collector("c"))
    await http.start()
    try:
        statuses.clear()
        first = await http.deliver(BODY)
        path.write_text("new-token-56789\n")
        http._tokens.refresh()  # as a 401 would; the file's own check comes at most once a second
        second = await http.deliver(BODY)
    finally:
        await http.close()
    assert first is not None and second is not None
    assert "old-token" not in first.detail and "Bearer ***" in first.detail, first.detail
    assert "new-token" not in second.detail and "Bearer ***" in second.detail, second.detail


async def test_a_batch_reply_quoting_the_token_in_its_reasons_is_scrubbed(echo, caplog):
    url, _ = echo
    caplog.set_level(logging.DEBUG)
    # A token with a quote and a backslash: in the reply's JSON it is escaped.
    token = 'batch"tok\\en-9e8f'
    cfg = CollectorConfig(name="b", url=url, token=token, batch={"linger_ms": 5},
                          retry={"initial_backoff_s": 0.01, "max_backoff_s": 0.05})
    failure = await deliver_once(BatchCollector(cfg, RelayMetrics().for_collector("b")), BODY)
    assert failure is not None and failure.reason == "collector_rejected"
    assert "invalid credentials: Bearer ***" in failure.detail, failure.detail
    for text in (failure.detail, log_text(caplog)):
        assert "tok\\en" not in text and "tok\\\\en" not in text


async def test_an_answer_cut_short_inside_the_token_leaks_no_part_of_it():
    """Only the first 300 bytes of an error answer are read (the detail's snippet): one
    that echoes the token there may end inside it."""
    async def cut(request: web.Request) -> web.Response:
        await request.read()
        head = "x" * (300 - len("Bearer ") - 12)  # the read ends 12 characters into the token
        return web.Response(status=400, text=f"{head}{request.headers['Authorization']} and more")

    runner, port = await serve([("POST", "/api/v1/lineage", cut)])
    try:
        cfg = CollectorConfig(name="c", url=f"http://127.0.0.1:{port}", token=TOKEN)
        failure = await deliver_once(HttpCollector(cfg, RelayMetrics().for_collector("c")), BODY)
    finally:
        await runner.cleanup()
    assert failure is not None and failure.status == 400
    assert failure.detail.endswith("Bearer ***"), failure.detail[-40:]
    assert TOKEN[:12] not in failure.detail


async def malformed_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A gateway answering malformed HTTP (a header name with a space) that echoes the
    credentials it got: aiohttp's parser refuses the answer with an error quoting the raw
    line, which comes to the relay as no answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        if not (chunk := await reader.read(65536)):
            break
        data += chunk
    head = dict(line.split(b": ", 1) for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:])
    writer.write(b"HTTP/1.1 401 Unauthorized\r\nX Echo: " + head.get(b"Authorization", b"") + b" key="
                 + head.get(b"X-Api-Key", b"") + b"\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    writer.close()


# A plain token, and one whose quote and backslash aiohttp's quote escapes (twice).
@pytest.mark.parametrize("token", [TOKEN, "malformed'tok\\en-7a6b"])
@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_a_malformed_answer_echoing_the_credentials_is_scrubbed(caplog, token, batch):
    """The detail of no answer (a parser error quoting the answer's bytes) goes into
    delivery_retry and batch_not_all_delivered lines and the retries_exhausted dead letter."""
    caplog.set_level(logging.DEBUG)
    server = await asyncio.start_server(malformed_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = CollectorConfig(name="c", url=f"http://127.0.0.1:{port}", token=token, headers={"X-Api-Key": API_KEY},
                          retry={"max_attempts": 2, "initial_backoff_s": 0.01, "max_backoff_s": 0.01},
                          batch={"linger_ms": 1} if batch else None)
    kind = BatchCollector if batch else HttpCollector
    try:
        failure = await asyncio.wait_for(deliver_once(kind(cfg, RelayMetrics().for_collector("c")), BODY), 10)
    finally:
        server.close()
    assert failure is not None and failure.reason == "retries_exhausted", failure
    logged = log_text(caplog)
    assert ("batch_not_all_delivered" if batch else "delivery_retry") in logged
    if "X Echo" in failure.detail:   # this aiohttp's parser quotes the answer (older ones say nothing)
        assert "Bearer *** key=***" in failure.detail, failure.detail  # the quote, scrubbed
    for secret in (token, token[:9], token[-7:], API_KEY):  # nor a part of it, escaped or not
        assert secret not in failure.detail and secret not in logged, secret


@pytest.mark.parametrize("token", [TOKEN, "malformed'tok\\en-7a6b"])
def test_a_no_answer_detail_quoting_the_credentials_is_scrubbed(token):
    """Whatever aiohttp version parses the answer: an error quoting the raw line, as recent
    parsers do (a bytes literal, escaped once more in the message), is scrubbed."""
    from relay.sinks.reply import no_answer

    cfg = CollectorConfig(name="c", url="http://127.0.0.1:9", token=token, headers={"X-Api-Key": API_KEY})
    scrubber = HttpCollector(cfg, RelayMetrics().for_collector("c")).scrubber
    raw = b"X Echo: Bearer " + token.encode() + b" key=" + API_KEY.encode()
    for err in (ValueError(f"Invalid header token: {raw!r}"), ValueError(repr(f"Invalid header token: {raw!r}"))):
        detail = no_answer(err, scrubber).detail
        assert "***" in detail, detail
        for secret in (token, token[:9], token[-7:], API_KEY):
            assert secret not in detail, (secret, detail)
