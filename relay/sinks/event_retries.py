"""The attempts of one event after its first POST failed: the half of
:meth:`HttpCollector.deliver <relay.sinks.http.HttpCollector.deliver>` that retries (a
mixin of :class:`~relay.sinks.http.HttpCollector`, whose state it uses as declared here).

Guarantees:

* An event is POSTed at most ``retry.max_attempts`` times in all, its first attempt
  included (none set: until it is delivered, refused or found failing), its failed
  attempts in batches included (:meth:`EventRetries.deliver_after`; a batch whose answer
  said nothing of the event, such as a 404, is not counted).
* Before each later attempt it waits :meth:`EventRetries.backoff_s`: capped exponential
  backoff with full jitter, at least what a Retry-After asked for. Each wait counts one
  ``retried`` and logs one ``delivery_retry`` WARNING on the collector's logger.
* It ends in None (delivered) or an :class:`~relay.sinks.base.Undeliverable`: a later
  answer the kind refuses or rejects; ``collector_failed_event`` once the collector keeps
  failing on this event while it accepts others (:func:`relay.sinks.retry.count_failure`,
  the first failure counted); ``retries_exhausted`` with the last failure's detail. A
  :class:`~relay.sinks.reply.Retriable` never escapes; a cancellation does.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, stop_never

from relay.config import CollectorConfig
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.base import Undeliverable
from relay.sinks.reply import ReplyTally, Retriable
from relay.sinks.retry import EventFailures, backoff, count_failure

# The collector's own logger: its retry lines are the collector's, wherever the code lives.
log = logging.getLogger("relay.sinks.http")


class EventRetries:
    """The retrying half of :class:`~relay.sinks.http.HttpCollector`."""

    name: str
    config: CollectorConfig
    tally: ReplyTally
    _metrics: CollectorMetrics
    _rand: random.Random
    _attempt: Callable[[bytes], Awaitable[Undeliverable | None]]  # HttpCollector's

    def _failed_again(self, seen: EventFailures, failure: Retriable) -> tuple[EventFailures, Undeliverable | None]:
        """One more failed attempt of an event (see :func:`relay.sinks.retry.count_failure`):
        what is known of its failures now, and the dead letter when they say the collector
        fails on this event (it accepts others) rather than being down."""
        seen, failed_event = count_failure(seen, failure.status, self.tally.record(failure.request),
                                           self.config.retry.poison_after_attempts)
        if not failed_event:
            return seen, None
        return seen, Undeliverable(
            "collector_failed_event",
            f"HTTP {failure.status} to this event {seen.strikes} times while the collector accepted other events "
            f"in between ({seen.attempts} attempts in all): the collector fails on this event, it is not down "
            f"(retry.poison_after_attempts={self.config.retry.poison_after_attempts}). Last answer: {failure.detail}",
            failure.status)

    def backoff_s(self, attempt: int, wait_s: float | None) -> float:
        """How long to wait after failed attempt number ``attempt`` (1-based): full jitter,
        at least what a Retry-After asked for."""
        jitter = backoff(attempt, initial_s=self.config.retry.initial_backoff_s,
                         cap_s=self.config.retry.max_backoff_s, rand=self._rand.random)
        return max(jitter, wait_s or 0.0)

    def _wait(self, state: RetryCallState, before: int) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return self.backoff_s(before + state.attempt_number + 1, getattr(exc, "wait_s", None))

    def _before_sleep(self, state: RetryCallState, before: int) -> None:
        self._metrics.retried.inc()
        exc = state.outcome.exception() if state.outcome else None
        log_event(log, logging.WARNING, "delivery_retry", collector=self.name,
                  attempt=before + state.attempt_number + 1, status=getattr(exc, "status", None),
                  detail=getattr(exc, "detail", str(exc))[:200])

    async def deliver_after(self, body: bytes, before: int) -> Undeliverable | None:
        """``deliver`` for an event already POSTed ``before`` times (in batches: see
        :mod:`relay.sinks.batch`): it gets only the attempts ``retry.max_attempts`` leaves,
        at least one, and its backoff goes on from there. A bare 500 counts against it
        afresh (alone, a 500 is its own)."""
        try:
            return await self._attempt(body)
        except Retriable as failure:
            return await self._later_attempts(body, failure, before)

    async def _later_attempts(self, body: bytes, failure: Retriable, before: int = 0) -> Undeliverable | None:
        """What becomes of an event whose first attempt here (after ``before`` others)
        failed with ``failure``."""
        max_attempts = self.config.retry.max_attempts
        if max_attempts is not None and before + 1 >= max_attempts:
            n = before + 1
            return Undeliverable("retries_exhausted", f"after {n} attempt{'s' if n > 1 else ''}: {failure.detail}",
                                 failure.status)
        seen = self._failed_again(EventFailures(), failure)[0]
        self._metrics.retried.inc()
        log_event(log, logging.WARNING, "delivery_retry", collector=self.name, attempt=before + 1,
                  status=failure.status, detail=failure.detail[:200])
        await asyncio.sleep(self.backoff_s(before + 1, failure.wait_s))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max_attempts - before - 1) if max_attempts else stop_never,
            wait=lambda state: self._wait(state, before), retry=retry_if_exception_type(Retriable),
            before_sleep=lambda state: self._before_sleep(state, before), reraise=True)

        async def attempt() -> Undeliverable | None:
            nonlocal seen
            try:
                return await self._attempt(body)
            except Retriable as err:
                seen, failed_event = self._failed_again(seen, err)
                if failed_event is not None:
                    return failed_event
                raise
        try:
            return await retrying(attempt)
        except Retriable as last:
            return Undeliverable("retries_exhausted", f"after {max_attempts} attempts: {last.detail}", last.status)
