"""An HTTP collector: POSTs each event to ``<url><endpoint>`` with keep-alive.

Retries (tenacity) on connection errors, timeouts, 408, 429 and 5xx with capped
exponential backoff and full jitter; a Retry-After header sets a collector-wide
"not before" time, so no other request to that collector overruns it. Any other 4xx
is permanent: the event is returned as :class:`Undeliverable` for the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import aiohttp
from yarl import URL
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, stop_never

from relay import __version__
from relay.config import CollectorConfig
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.base import Undeliverable
from relay.sinks.retry import Verdict, backoff, classify, retry_after

log = logging.getLogger("relay.sinks.http")
_SNIPPET = 300


class _Retriable(Exception):
    def __init__(self, detail: str, status: int | None, wait_s: float | None) -> None:
        super().__init__(detail)
        self.detail, self.status, self.wait_s = detail, status, wait_s


class HttpCollector:
    def __init__(self, config: CollectorConfig, metrics: CollectorMetrics) -> None:
        self.name = config.name
        self.config = config
        self._metrics = metrics
        # Parsed once: parsing the URL string was a measurable share of each POST.
        self._target = URL(config.target)
        self._session: aiohttp.ClientSession | None = None
        self._not_before = 0.0
        self._rand = random.Random()
        headers = {"Content-Type": "application/json", "User-Agent": f"lineage-relay/{__version__}",
                   **config.headers}
        if config.token is not None:
            headers["Authorization"] = f"Bearer {config.token.get_secret_value()}"
        self._headers = headers

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.concurrency, keepalive_timeout=30, ttl_dns_cache=300)
        # Collectors set no cookies and answer small bodies: skipping the cookie jar,
        # compression negotiation and decompression is measurably cheaper per POST.
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept-Encoding",), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.config.timeout_s), raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _attempt(self, body: bytes) -> Undeliverable | None:
        """One POST. Raises _Retriable for what deserves another try."""
        wait = self._not_before - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        assert self._session is not None
        try:
            async with self._session.post(self._target, data=body) as resp:
                status = resp.status
                verdict = classify(status)
                if verdict is Verdict.SUCCESS:
                    await resp.read()
                    return None
                snippet = (await resp.content.read(_SNIPPET)).decode("utf-8", "replace")
                if verdict is Verdict.REJECT:
                    return Undeliverable("collector_rejected", f"HTTP {status}: {snippet}", status)
                after = retry_after(resp.headers.get("Retry-After"))
                if after:
                    self._not_before = max(self._not_before, time.monotonic() + after)
                raise _Retriable(f"HTTP {status}: {snippet}", status, after)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise _Retriable(f"{type(err).__name__}: {err}", None, None) from err

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        jitter = backoff(state.attempt_number + 1, initial_s=self.config.retry.initial_backoff_s,
                         cap_s=self.config.retry.max_backoff_s, rand=self._rand.random)
        after = getattr(exc, "wait_s", None) or 0.0
        return max(jitter, after)

    def _before_sleep(self, state: RetryCallState) -> None:
        self._metrics.retried.inc()
        exc = state.outcome.exception() if state.outcome else None
        log_event(log, logging.WARNING, "delivery_retry", collector=self.name,
                  attempt=state.attempt_number, status=getattr(exc, "status", None),
                  detail=getattr(exc, "detail", str(exc))[:200])

    async def deliver(self, body: bytes) -> Undeliverable | None:
        try:
            # Fast path: most deliveries succeed first time; skip the retry machinery.
            return await self._attempt(body)
        except _Retriable as first:
            failure = first
        max_attempts = self.config.retry.max_attempts
        if max_attempts == 1:
            return Undeliverable("retries_exhausted", f"after 1 attempt: {failure.detail}", failure.status)
        self._before_sleep_once(failure)
        await asyncio.sleep(self._wait_first(failure))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max_attempts - 1) if max_attempts else stop_never,
            wait=self._wait, retry=retry_if_exception_type(_Retriable),
            before_sleep=self._before_sleep, reraise=True)
        try:
            return await retrying(self._attempt, body)
        except _Retriable as last:
            return Undeliverable("retries_exhausted", f"after {max_attempts} attempts: {last.detail}", last.status)

    def _before_sleep_once(self, failure: _Retriable) -> None:
        self._metrics.retried.inc()
        log_event(log, logging.WARNING, "delivery_retry", collector=self.name, attempt=1,
                  status=failure.status, detail=failure.detail[:200])

    def _wait_first(self, failure: _Retriable) -> float:
        jitter = backoff(1, initial_s=self.config.retry.initial_backoff_s,
                         cap_s=self.config.retry.max_backoff_s, rand=self._rand.random)
        return max(jitter, failure.wait_s or 0.0)
