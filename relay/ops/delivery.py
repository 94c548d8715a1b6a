"""Deliver a finite set of events to one collector, in run order, as the relay would.

:func:`plan` and :func:`plan_for` (:mod:`relay.ops.run_plan`, re-exported here) are pure:
they turn events into *chains* (one per run, by the relay's sequencer or the collector's
delivery mode; one per event without a run) and name what they left out. :class:`BatchDelivery`
sends chains through the collector the relay would build for it (its kind, same retries,
same credentials, batches where it has ``batch``) after the collector's ``rewrite``: the
events of a chain one at a time, up to the collector's ``concurrency`` chains at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from relay.config import CollectorConfig
from relay.events import LineageEvent
from relay.metrics import RelayMetrics
from relay.ops.run_plan import AFTER_TERMINAL, Plan, plan, plan_for  # noqa: F401 - re-exported
from relay.sinks.base import DeliveryStopped
from relay.sinks.kinds import build_collector
from relay.stages.rewrite import Rewriter


@dataclass(frozen=True)
class Failure:
    event: LineageEvent
    reason: str
    detail: str


#: Called when an event reached the collector (after retries).
OnDelivered = Callable[[LineageEvent], None]
#: Called when it did not; its chain goes on (the relay dead-letters and goes on too).
OnFailed = Callable[[Failure], None]
#: The body to send for an event whose ``body`` was not kept (read back when it is sent);
#: raising :class:`BodyUnavailable` fails that event alone.
LoadBody = Callable[[LineageEvent], Awaitable[bytes]]

#: Failure reason: the event's body could not be read back.
BODY_UNAVAILABLE = "body_unavailable"


class BodyUnavailable(Exception):
    """A :data:`LoadBody` could not give the event's body; the message says why."""


#: Attempts per event for the operator commands when neither ``--max-attempts`` nor the
#: collector's ``retry.max_attempts`` bounds them: the relay retries for ever (it pauses
#: instead), a command run while the collector is down must end.
OPS_MAX_ATTEMPTS = 10


def collector_config(config: CollectorConfig, max_attempts: int | None) -> CollectorConfig:
    """``config`` with ``retry.max_attempts`` replaced when ``max_attempts`` is given, or
    :data:`OPS_MAX_ATTEMPTS` when neither bounds it."""
    if max_attempts is None:
        if config.retry.max_attempts is not None:
            return config
        max_attempts = OPS_MAX_ATTEMPTS
    return config.model_copy(update={"retry": config.retry.model_copy(update={"max_attempts": max_attempts})})


class BatchDelivery:
    """Delivers chains to one collector. ``dry_run`` does everything but the POST
    (the rewrite still runs, so events it would reject are reported). ``before_post`` is
    called right before each HTTP request is written (each attempt, each batch: the
    collector's ``check_before_requests``, see :mod:`relay.sinks.base`); what it raises
    ends the delivery, the request not sent, and :meth:`run` raises it (``dlq redrive``'s
    lease check). A collector kind without that hook gets it called before each event."""

    def __init__(self, config: CollectorConfig, *, dry_run: bool = False,
                 before_post: Callable[[], None] | None = None) -> None:
        self.config = config
        self.dry_run = dry_run
        rewriter = Rewriter(config.rewrite)
        self._rewriter = None if rewriter.is_noop else rewriter
        self._metrics = RelayMetrics()
        self._http = build_collector(config, self._metrics.for_collector(config.name))
        self._before_event = before_post
        hook = getattr(self._http, "check_before_requests", None)
        if before_post is not None and hook is not None:
            def check() -> None:
                try:
                    before_post()
                except Exception as err:
                    raise DeliveryStopped(str(err)) from err

            hook(check)
            self._before_event = None

    @property
    def retries(self) -> int:
        """Delivery attempts retried so far."""
        value = self._metrics.registry.get_sample_value("lineage_relay_delivery_retries_total",
                                                        {"collector": self.config.name})
        return int(value or 0)

    async def run(self, chains: list[list[LineageEvent]], *, on_delivered: OnDelivered,
                  on_failed: OnFailed, load_body: LoadBody | None = None) -> None:
        """Send ``chains``; with ``load_body``, each event's body is asked for right
        before it is sent (so at most ``concurrency`` bodies are held)."""
        queue = deque(chains)

        async def worker() -> None:
            while queue:
                for event in queue.popleft():
                    if load_body is None:
                        body = event.body
                    else:
                        try:
                            body = await load_body(event)
                        except BodyUnavailable as err:
                            on_failed(Failure(event, BODY_UNAVAILABLE, str(err)))
                            continue
                    failure = await self._deliver(event, body)
                    if failure is None:
                        on_delivered(event)
                    else:
                        on_failed(failure)

        if not self.dry_run:
            await self._http.start()
        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.config.concurrency, len(chains)))]
        try:
            await asyncio.gather(*workers)
        except DeliveryStopped as stopped:  # what before_post raised, as it raised it
            cause = stopped.__cause__
            if isinstance(cause, Exception):
                raise cause from None
            raise
        finally:
            for task in workers:  # one raised: the others stop too (an answer not read: not done)
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await self._http.close()

    async def _deliver(self, event: LineageEvent, body: bytes) -> Failure | None:
        if self._rewriter is not None:
            result = self._rewriter.apply(orjson.loads(body), original=body, big_int=event.big_int)
            if result.rejection is not None:
                return Failure(event, *result.rejection)
            body = result.body
        if self.dry_run:
            return None
        if self._before_event is not None:
            self._before_event()
        outcome = await self._http.deliver(body)
        return None if outcome is None else Failure(event, outcome.reason, outcome.detail)
