"""An HTTP collector: POSTs each event to ``<url><endpoint>`` with keep-alive.

Retries (tenacity) on connection errors, timeouts, 408, 429 and 5xx with capped
exponential backoff and full jitter (the attempts after the first:
:mod:`relay.sinks.event_retries`); a Retry-After header sets a collector-wide
"not before" time, so no other request to that collector overruns it. Any other 4xx
is permanent: the event is returned as :class:`Undeliverable` for the dead-letter topic.
Which statuses mean what is the collector kind's ``classify`` (:mod:`relay.sinks.kinds`);
with a ``token_file``, a 401 re-reads the file and is retried, so a rotated secret is
picked up without restart (and a wrong one pauses delivery instead of dead-lettering).
A kind may also recognise an answer by its body as a failure of its own (``refuse``: e.g.
Atlan's 401 for a connector that is not enabled), dead-lettered under its own reason even
with a token file, and logged once.

An event answered a bare 500 again and again while the collector accepts others is one it
fails on, not an outage: it is dead-lettered (``collector_failed_event``; see
:func:`relay.sinks.retry.count_failure`, fed by :class:`~relay.sinks.reply.ReplyTally`).

The connection (session, TLS, credentials, the Retry-After gate) is shared with
:class:`~relay.sinks.batch.BatchCollector` through :meth:`HttpCollector.exchange`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp
from yarl import URL

from relay import __version__
from relay.config import CollectorConfig
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.adaptive import AdaptiveLimit, FixedLimit, Outcome
from relay.sinks.auth import AnswerScrubber, TokenSource, auth_header_value, session_headers, ssl_context
from relay.sinks.base import DeliveryStopped, Undeliverable
from relay.sinks.deadlines import Deadlines
from relay.sinks.event_retries import EventRetries
from relay.sinks.posting import Post, poster
from relay.sinks.reply import (
    DRAIN_LIMIT,
    NO_ANSWER,
    SNIPPET,
    Reply,
    ReplyTally,
    Retriable,
    no_answer,
    read_body,
    read_reply,
)
from relay.sinks.retry import FAILED_EVENT_STATUS, Verdict, classify, retry_after

__all__ = ["HttpCollector", "Refuse", "Reply", "Retriable"]

log = logging.getLogger("relay.sinks.http")
#: A kind's reading of an answer that is not a success (status, first bytes of the body):
#: a failure it recognises, with its own reason, or None.
Refuse = Callable[[int, bytes], "Undeliverable | None"]
#: An adaptive limit that shrinks is logged at most this often per collector.
_LIMIT_LOG_EVERY_S = 10.0


class HttpCollector(EventRetries):
    def __init__(self, config: CollectorConfig, metrics: CollectorMetrics,
                 classify_status: Callable[[int | None], Verdict] = classify, refuse: Refuse | None = None) -> None:
        self.name = config.name
        self.config = config
        self._metrics = metrics
        self._classify = classify_status
        self._refuse = refuse
        #: Reasons of recognised refusals already logged (each is logged once).
        self._refusals_logged: set[str] = set()
        #: Its requests and what came back (single or batches): whether it accepted others
        #: between two failures of one event tells a failing event from an outage.
        self.tally = ReplyTally()
        # Parsed once: parsing the URL string was a measurable share of each POST.
        self._target = URL(config.target)
        self._session: aiohttp.ClientSession | None = None
        #: How a request is sent (relay.sinks.posting): set by start().
        self._send: Post | None = None
        #: aiohttp request tracing: the check of :meth:`check_before_requests`, if any.
        self._trace_configs: list[aiohttp.TraceConfig] = []
        #: ``timeout_s`` per request, enforced here rather than by aiohttp (see relay.sinks.deadlines).
        self._deadlines = Deadlines(config.timeout_s)
        self._not_before = 0.0
        self._rand = random.Random()
        self._tokens = TokenSource(config)
        #: Takes its credentials out of what is quoted from its answers (never out of a body read).
        self.scrubber = AnswerScrubber(config, self._tokens)
        self._auth: dict[str, str] | None = None  # per-request header of a rotating token
        self._auth_token: str | None = None
        self._headers = session_headers(config, self._tokens, f"lineage-relay/{__version__}")
        #: 2xx statuses the kind counts as success (a kind may refuse some 2xx).
        self._successes = frozenset(s for s in range(200, 300) if classify_status(s) is Verdict.SUCCESS)
        #: With adaptive_concurrency, every request waits for room under the learnt limit
        #: (requests are then batch POSTs when the collector batches: their size, not the
        #: collector's load, sets their latency, so only overload signals count). A batch
        #: collector's requests, batches and events sent alone alike, wait for room under
        #: ``batch.max_requests`` without it too: the dispatcher's ``concurrency`` (events
        #: in flight, max_events x max_requests by default) would let hundreds of events sent
        #: alone go at once. The gauge shows the limit enforced.
        self._gate: AdaptiveLimit | None = None
        self._adaptive: AdaptiveLimit | None = None
        self._next_limit_log = 0.0
        adaptive = config.adaptive_concurrency
        ceiling = config.batch.max_requests if config.batch is not None else config.concurrency
        limit_gauge = metrics.concurrency_limit()
        if adaptive is not None:
            self._gate = self._adaptive = AdaptiveLimit(
                minimum=adaptive.min, maximum=ceiling, initial=adaptive.initial,
                latency_tolerance=adaptive.latency_tolerance, use_latency=config.batch is None,
                on_change=limit_gauge.set)
        else:
            if config.batch is not None:
                self._gate = FixedLimit(ceiling)
            limit_gauge.set(ceiling)

    @property
    def gate(self) -> AdaptiveLimit | None:
        """The adaptive limit on requests in flight, or None (a fixed ceiling)."""
        return self._adaptive

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.concurrency, keepalive_timeout=30, ttl_dns_cache=300,
                                         ssl=ssl_context(self.config) or True)
        # Collectors set no cookies and answer small bodies: skipping the cookie jar,
        # compression negotiation and decompression is measurably cheaper per POST.
        # No total timeout in aiohttp: self._deadlines limits each request, connecting
        # included, without a timer per request (aiohttp still limits a new connection's
        # socket connect, which costs nothing on a reused one).
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.timeout_s), raise_for_status=False,
            trace_configs=self._trace_configs or None)
        self._send = poster(self._session, traced=bool(self._trace_configs))

    def check_before_requests(self, check: Callable[[], None]) -> None:
        """Before :meth:`start`: call ``check`` when each request starts and again once its
        connection is ready (new or reused), right before it is written; what it raises
        (:class:`~relay.sinks.base.DeliveryStopped`) comes out of :meth:`deliver` or
        :meth:`exchange`, the request not sent. Without a check aiohttp traces nothing.

        A stop once a *new* connection is made leaves that socket open outside the pool
        (aiohttp neither closes nor pools it; :meth:`close` does not reach it): it lasts
        until the collector closes it or the process ends. At most ``concurrency`` such
        sockets per collector, in a redrive that is about to exit (a reused connection goes
        back to the pool)."""
        async def run(_session: object, _ctx: object, _params: object) -> None:
            check()

        trace = aiohttp.TraceConfig()
        for signal in (trace.on_request_start, trace.on_connection_create_end, trace.on_connection_reuseconn):
            signal.append(run)
        self._trace_configs.append(trace)

    async def close(self) -> None:
        self._deadlines.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._send = None

    def _auth_headers(self) -> dict[str, str] | None:
        if not self._tokens.rotates:
            return None
        token = self._tokens.current()
        if token != self._auth_token:
            self._auth_token = token
            self._auth = {self.config.auth_header: auth_header_value(self.config, token)} if token else None
        return self._auth

    def verdict(self, status: int | None) -> Verdict:
        """The kind's verdict, except that a 401 is retried when the token comes from a
        file (re-read by :meth:`exchange`): fixing the file resumes delivery."""
        if status == 401 and self._tokens.rotates:
            return Verdict.RETRY
        return self._classify(status)

    async def exchange(self, url: URL, body: bytes, keep: int | None = None) -> Reply:
        """One POST to ``url``, after any Retry-After wait. Raises :class:`Retriable` when
        there is no answer (connection error, reset, timeout; the answer's body included:
        it must end within ``timeout_s`` too).

        ``keep``: how much of a 2xx or 4xx body the caller wants (a batch reply); a longer
        one is not read (``Reply.unread``). None (single events): its first bytes, for the detail
        of a 2xx the kind refuses; the body is read on (and dropped) up to
        :data:`DRAIN_LIMIT`, and a longer one is not read either."""
        gate = self._gate
        if gate is None:
            await self._hold_back()
            return await self._post(url, body, keep)
        # Room first, then the Retry-After check: a 429 may have come while this waited.
        sent = await gate.acquire()
        outcome = Outcome.NEUTRAL  # cancelled before an answer: says nothing about the collector
        try:
            if await self._hold_back():
                sent = (time.monotonic(), sent[1])  # its latency starts now
            outcome = Outcome.OVERLOAD  # unless an answer says otherwise: no answer, a timeout
            reply = await self._post(url, body, keep)
            outcome = self._outcome(reply.status)
            return reply
        except (asyncio.CancelledError, DeliveryStopped):
            outcome = Outcome.NEUTRAL  # a stop, not the collector
            raise
        finally:
            decreases = gate.decreases
            gate.release(sent, outcome)
            if gate.decreases != decreases:
                self._limit_reduced(outcome)

    def _limit_reduced(self, outcome: Outcome) -> None:
        """Logs that the adaptive limit shrank, at most every :data:`_LIMIT_LOG_EVERY_S`."""
        now = time.monotonic()
        if now < self._next_limit_log:
            return
        self._next_limit_log = now + _LIMIT_LOG_EVERY_S
        assert self._gate is not None
        log_event(log, logging.INFO, "collector_concurrency_reduced", collector=self.name,
                  limit=int(self._gate.limit), cause="overload" if outcome is Outcome.OVERLOAD else "latency")

    async def _hold_back(self) -> bool:
        """Wait out a Retry-After the collector asked for; True when there was one. Until
        none is left: another answer may have asked for a longer one meanwhile."""
        waited = False
        while (wait := self._not_before - time.monotonic()) > 0:
            await asyncio.sleep(wait)
            waited = True
        return waited

    async def _post(self, url: URL, body: bytes, keep: int | None) -> Reply:
        send = self._send
        assert send is not None
        deadlines = self._deadlines
        task = deadlines.begin()
        tally = self.tally
        tally.sent += 1
        request = tally.sent
        try:
            resp = await send(url, body, self._auth_headers())
            try:
                reply = await self._reply(resp, keep)
            finally:
                resp.release()
            reply.request = request
            if reply.status == FAILED_EVENT_STATUS:
                tally.failed += 1
            return reply
        except NO_ANSWER as err:
            raise no_answer(err, self.scrubber) from err
        except asyncio.CancelledError:
            if deadlines.expired(task):
                raise self._timed_out() from None
            raise
        finally:
            deadlines.end(task)

    def _outcome(self, status: int) -> Outcome:
        """What an answer says about the collector's load (see relay.sinks.adaptive): what
        the kind retries (408, 429, 5xx) is overload. The kind's own verdict, not
        :meth:`verdict`: a 401 retried for a token file says nothing about load."""
        verdict = self._classify(status)
        if verdict is Verdict.SUCCESS:
            return Outcome.OK
        return Outcome.OVERLOAD if verdict is Verdict.RETRY else Outcome.NEUTRAL

    def _timed_out(self) -> Retriable:
        return Retriable(f"TimeoutError: no answer within {self.config.timeout_s:g} s", None, None)

    async def _reply(self, resp: aiohttp.ClientResponse, keep: int | None) -> Reply:
        """The answer: of a 2xx, its body up to ``keep`` bytes (see :meth:`exchange`); of a
        4xx to a batch too (it may say which events failed); of anything else its first
        bytes, and a 401 re-reads the token file, a Retry-After on a retriable status holds
        back every request to this collector."""
        reply = await read_reply(resp, keep)
        status = reply.status
        if status < 300:
            return reply
        if status == 401:
            self._tokens.refresh()
        after = retry_after(resp.headers.get("Retry-After"), limit_s=self.config.retry.max_retry_after_s)
        if after and self.verdict(status) is Verdict.RETRY:
            reply.wait_s = after
            self._not_before = max(self._not_before, time.monotonic() + after)
        return reply

    def refused(self, reply: Reply) -> Undeliverable | None:
        """The kind's own reading of an answer that is not a success (see ``refuse``), or
        None. Each reason is logged once, as an ERROR line of its own name."""
        if self._refuse is None or reply.status in self._successes:
            return None
        known = self._refuse(reply.status, reply.body)
        if known is None:
            return None
        cut = reply.cut or len(reply.body) > SNIPPET  # its detail may quote the answer
        known = replace(known, detail=self.scrubber.text(known.detail, cut=cut))
        if known.reason not in self._refusals_logged:
            self._refusals_logged.add(known.reason)
            log_event(log, logging.ERROR, known.reason, collector=self.name, status=reply.status,
                      detail=known.detail[:400])
        return known

    def _judge(self, reply: Reply) -> Undeliverable | None:
        """None for a success; an Undeliverable for a refusal; raises Retriable otherwise."""
        if (known := self.refused(reply)) is not None:
            return known
        verdict = self.verdict(reply.status)
        if verdict is Verdict.SUCCESS:
            self.tally.accept(reply.request)
            return None
        if verdict is Verdict.REJECT:
            return Undeliverable("collector_rejected", f"HTTP {reply.status}: {self.quote(reply)}", reply.status)
        raise Retriable(f"HTTP {reply.status}: {self.quote(reply)}", reply.status, reply.wait_s, reply.request)

    def quote(self, reply: Reply) -> str:
        """An answer's first bytes as details and log lines quote them (see AnswerScrubber)."""
        return self.scrubber.quote(reply.body, SNIPPET, cut=reply.cut)

    async def _attempt(self, body: bytes) -> Undeliverable | None:
        """One POST of one event. Raises Retriable for what deserves another try."""
        return self._judge(await self.exchange(self._target, body))

    async def deliver(self, body: bytes) -> Undeliverable | None:
        # The first attempt, inlined: nearly every event takes only this path, and each
        # coroutine level between the delivering task and aiohttp is paid again every time
        # the task resumes (measured: ~4% of the relay's CPU per event for the two levels
        # of _attempt and exchange). Later attempts go through the retry machinery
        # (relay.sinks.event_retries).
        # The request goes out through relay.sinks.posting (aiohttp's pool without the
        # per-call set-up of session.post()); `release()` rather than `async with` spares
        # the four coroutines of a context manager's enter and exit.
        send = self._send
        try:
            if send is None or self._gate is not None or self._not_before > time.monotonic():
                return await self._attempt(body)
            deadlines = self._deadlines
            task = deadlines.begin()
            tally = self.tally
            tally.sent += 1
            request = tally.sent
            try:
                resp = await send(self._target, body, self._auth_headers())
                try:
                    if resp.status in self._successes:  # no Reply to build and judge
                        # The status is the acknowledgement; the body is only read so the
                        # connection can be reused. One that came whole with the headers
                        # (none: Marquez's 201; a small JSON) needs no read: aiohttp gave the
                        # connection back at its end, and release() spares the three
                        # coroutines of read() (measured: ~1.8 of ~52 us per POST). One still
                        # arriving is drained up to DRAIN_LIMIT; past it, the connection is
                        # closed and the event still delivered.
                        if not resp.content.is_eof():
                            await read_body(resp, DRAIN_LIMIT, 0)
                        tally.accept(request)
                        return None
                    reply = await self._reply(resp, None)
                    reply.request = request
                    if reply.status == FAILED_EVENT_STATUS:
                        tally.failed += 1
                finally:
                    resp.release()
            except NO_ANSWER as err:
                raise no_answer(err, self.scrubber) from err
            except asyncio.CancelledError:
                if deadlines.expired(task):
                    raise self._timed_out() from None
                raise
            finally:
                deadlines.end(task)
            return self._judge(reply)
        except Retriable as first:
            failure = first
        return await self._later_attempts(body, failure)
