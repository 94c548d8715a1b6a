"""A collector's answer as :class:`~relay.sinks.http.HttpCollector` reads it: :class:`Reply`,
:class:`Retriable` (no answer, or one that deserves another try), and how a body is read
without holding more of it than wanted; :class:`ReplyTally`, what came back so far."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from yarl import URL

from relay.sinks.retry import CollectorRecord

if TYPE_CHECKING:
    from relay.sinks.auth import AnswerScrubber

#: How much of an answer's body a detail quotes.
SNIPPET = 300
#: How much of a 2xx answer to one event is read. Its status is the acknowledgement and its
#: body is not used: it is read (and dropped) only so the connection can carry the next
#: request. Enough for any ordinary body (an echo of the event, a JSON status); past it the
#: connection is closed instead, so a collector or proxy answering 200 with a huge or endless
#: body costs a new connection, not memory or the rest of the request's timeout.
DRAIN_LIMIT = 64 * 1024

#: What aiohttp raises when there is no answer: the attempt deserves another try.
NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class Retriable(Exception):
    """An attempt that deserves another try: no answer, or a retriable status."""

    def __init__(self, detail: str, status: int | None, wait_s: float | None, request: int = 0) -> None:
        super().__init__(detail)
        self.detail, self.status, self.wait_s = detail, status, wait_s
        #: The number of the request answered so (see relay.sinks.retry.CollectorRecord).
        self.request = request


def no_answer(err: BaseException, scrubber: AnswerScrubber) -> Retriable:
    """No (readable) answer: ``err`` as a detail, scrubbed as quotes of answers are. A
    malformed answer is one: aiohttp's parser error quotes its raw bytes (``Invalid header
    token: b'X Echo: Bearer <token>'``), and a gateway echoing the request puts the
    credentials there; the detail goes into delivery_retry lines and dead letters. Scrubbed
    as cut short: aiohttp may quote only the start of a line."""
    return Retriable(scrubber.text(f"{type(err).__name__}: {err}", cut=True), None, None)


@dataclass(slots=True)
class Reply:
    """A collector's answer: for 2xx the body the caller asked for (see
    :meth:`HttpCollector.exchange`), the first bytes otherwise (a batch's 4xx: its body
    too, as for a 2xx)."""

    status: int
    body: bytes
    #: Seconds from a Retry-After header, when the answer carried one.
    wait_s: float | None = None
    #: A body over the caller's limit: not read (``body`` is empty); a connection left
    #: mid-body is closed, not reused.
    unread: bool = False
    #: The request's number, as it was sent (see relay.sinks.retry.CollectorRecord).
    request: int = 0
    #: ``body`` is only the answer's first bytes: a quote of it may end inside a secret
    #: (see relay.sinks.auth.AnswerScrubber). Quote it with HttpCollector.quote, never raw.
    cut: bool = False
    #: Its Content-Encoding header, of an answer to a batch (its body is as it came:
    #: relay.sinks.batch_reply decodes it).
    encoding: str | None = None


async def read_body(resp: aiohttp.ClientResponse, limit: int, keep: int) -> bytes | None:
    """A body still arriving, read to its end: its first ``keep`` bytes, or None when it
    is over ``limit`` bytes: then no more of it is read and the connection is closed (it
    cannot carry another request before the body's end). Never holds more than ``keep``
    bytes and what aiohttp buffers: ``readany`` leaves aiohttp's flow control on, where
    ``read()`` turns it off and holds the whole body. A body that does not end is cut by
    the request's deadline."""
    content = resp.content
    length = resp.content_length
    if length is not None and length > limit:  # announced: not even its first bytes
        resp.close()
        return None
    chunks: list[bytes] = []
    kept = 0
    while chunk := await content.readany():
        if content.total_bytes > limit:  # what arrived, read or not
            resp.close()
            return None
        if kept < keep:
            chunks.append(chunk[:keep - kept])
            kept += len(chunks[-1])
    return b"".join(chunks)


def redirect_detail(resp: aiohttp.ClientResponse) -> str:
    """Where a redirect points, for a dead letter's detail and a log line: without what may
    carry a secret, its userinfo, query, fragment (``#access_token=...``, an OAuth implicit
    grant) and path parameters (``;jsessionid=...``)."""
    location = resp.headers.get("Location", "")
    try:  # usually relative (a trailing slash added): resolved against where the event went
        target = _bare(resp.url.join(URL(location))) if location else None
    except ValueError:  # not a URL: as given, from its last '@' on, up to its first '?', '#' or ';'
        target = re.split(r"[?#;]", location.rsplit("@", 1)[-1], maxsplit=1)[0][:200]
    return (f"redirected to {target or '(no Location)'}: the relay does not follow redirects (the event would "
            f"be lost, or sent elsewhere with its credentials); set the collector's url to where it points.")


def _bare(url: URL) -> URL:
    """``url`` without userinfo, query, fragment, or anything from a ``;`` in its path on."""
    url = url.with_user(None).with_password(None).with_query(None).with_fragment(None)
    path = url.raw_path
    return url.with_path(path.split(";", 1)[0], encoded=True) if ";" in path else url


async def read_reply(resp: aiohttp.ClientResponse, keep: int | None) -> Reply:
    """The answer: of a 2xx, its body up to ``keep`` bytes (None: a single event's, read
    on and dropped up to :data:`DRAIN_LIMIT`); of a 4xx to a batch too (it may say which
    events failed); of anything else its first bytes. A redirect's detail says where it
    pointed."""
    status = resp.status
    if 200 <= status < 300 or (keep is not None and 400 <= status < 500):
        limit, wanted = (DRAIN_LIMIT, SNIPPET) if keep is None else (keep, keep)
        content = resp.content
        if content.is_eof():  # all of it came with the headers, if any: no read to wait for
            reply = Reply(status, b"", unread=True) if content.total_bytes > limit \
                else Reply(status, content.read_nowait(wanted))
        else:
            body = await read_body(resp, limit, wanted)
            reply = Reply(status, b"", unread=True) if body is None else Reply(status, body)
        reply.cut = content.total_bytes > len(reply.body)
        if keep is not None:
            reply.encoding = resp.headers.get("Content-Encoding")
        if status < 300:
            return reply
    else:
        reply = Reply(status, await resp.content.read(SNIPPET))
        # More of it left (or its end not seen yet, which at worst hides a harmless tail).
        reply.cut = len(reply.body) == SNIPPET and not resp.content.at_eof()
    if 300 <= status < 400:
        # Not followed (allow_redirects=False): a 301-303 would be re-sent as a GET
        # without the event, whose 2xx would count as delivered, and a 307/308 to
        # another host would take the event there with any custom auth header.
        reply.body = redirect_detail(resp).encode() + b" " + reply.body
    return reply


class ReplyTally:
    """A collector's requests, numbered as they are sent, and what came back: how many were
    accepted (the highest number among them) and how many were answered a bare 500. What
    :func:`relay.sinks.retry.count_failure` reads to tell an event the collector fails on
    from an outage."""

    __slots__ = ("sent", "last_accepted", "accepted", "failed")

    def __init__(self) -> None:
        self.sent = self.last_accepted = self.accepted = self.failed = 0

    def accept(self, request: int) -> None:
        """Request number ``request`` was accepted (an event, or a batch with events)."""
        self.accepted += 1
        if request > self.last_accepted:
            self.last_accepted = request

    def record(self, request: int) -> CollectorRecord:
        """What came back so far, for a failure of request number ``request``."""
        return CollectorRecord(request, self.last_accepted, self.accepted, self.failed)

