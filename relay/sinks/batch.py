"""A batch collector: events go to the collector's batch endpoint, many per POST.

:meth:`BatchCollector.deliver` keeps the contract of :class:`~relay.sinks.base.Collector`:
it returns once *this* event was acknowledged (``None``) or given up on
(:class:`Undeliverable`), never drops it silently. Events of concurrent ``deliver`` calls
are gathered into one batch, sent when it holds ``max_events`` events, when the next event
would take it over ``max_bytes``, or ``linger_ms`` after its first event; at most
``max_requests`` batches are in flight.

:meth:`BatchCollector.deliver_soon` is the same without a coroutine per event: it queues
the event and calls ``done(token, verdict)`` once, from the event loop, when ``deliver``
would have returned (retries included). The dispatcher uses it: a task resumption, a
future and a wake-up per event cost more than the event's share of the batch's POST
(measured: ~30% of the event loop's time in the batch case).

What this guarantees, and why:

* **Order per run.** The dispatcher (:mod:`relay.dispatch`) calls ``deliver`` for a run's
  next event only after the previous one returned, so a run has at most one event in any
  batch, and an event being retried holds back its run's later events.
* **Partial success** (:mod:`relay.sinks.batch_reply`): an event the reply lists as failed
  and retriable goes into a later batch after its own backoff (honouring Retry-After);
  one listed as permanently failed returns :class:`Undeliverable` (``collector_rejected``,
  the collector's reason in the detail) and is dead-lettered; the others are done.
* A batch refused whole with a permanent status, or a reply that cannot say which events
  failed, sends each of its events alone to the single-event endpoint, so one bad event
  does not take its neighbours to the dead-letter topic. An event larger than
  ``max_bytes`` on its own also goes alone. So does an event whose batches were answered
  a bare 500 ``retry.poison_after_attempts`` times while the collector accepted other
  events (:func:`relay.sinks.retry.count_failure`): the batch cannot say whether this
  event is the one it fails on, the single-event endpoint can. For the same reason an
  event's last attempt (``retry.max_attempts``, 2 or more) goes alone: it is
  ``retries_exhausted`` only on its own answer (with 1, a batch answered 500 is dead-lettered
  whole). ``max_attempts`` counts an event's POSTs in batches and alone, but not a batch
  whose answer said nothing of it (refused whole, 404, unattributed). Events sent alone
  share ``batch.max_requests`` (or the adaptive limit) with the batches.
* A 404, 405 or 501 to a batch sends its events alone. ``batch.unsupported_after`` such
  answers in a row (:mod:`relay.sinks.batch_fallback`; one may come from a proxy or an old
  instance during a rolling deploy) give the batch endpoint up: every event goes alone
  (``batch_unsupported``: ERROR the first time, WARNING after; the gauge
  ``lineage_relay_batch_fallback`` is 1), and one batch tries the endpoint again every
  ``batch.reprobe_after_s``: accepted, batching resumes (``batch_resumed``); answered 404,
  405 or 501, single events for another interval (``batch_still_unsupported``). Answers to
  batches sent before such a switch do not switch back. The clock is ``clock`` (injectable).
* Offsets: each event settles only when its ``deliver`` returns, so an offset is committed
  only after every event at or below it was delivered or dead-lettered.

Not guaranteed: an event that was delivered but whose batch answer was lost (timeout,
reset) is sent again (at-least-once, as for single events).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from yarl import URL

from relay.config import CollectorConfig
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.base import DeliveryStopped, Undeliverable, relay_error
from relay.sinks.batch_fallback import BatchFallback
from relay.sinks.batch_reply import MAX_REPLY_BYTES, BatchReading, EventOutcome, read_batch_reply
from relay.sinks.envelope import ENVELOPE_BYTES, Envelope, json_array
from relay.sinks.http import HttpCollector, Refuse, Retriable
from relay.sinks.retry import EventFailures, Verdict, classify, count_failure

log = logging.getLogger("relay.sinks.batch")

#: Called once per event with the caller's token and the verdict: None (delivered) or why not.
Done = Callable[[Any, "Undeliverable | None"], None]


@dataclass(slots=True, eq=False)
class _Item:
    body: bytes
    done: Done
    token: Any
    at: float
    attempt: int = 1
    #: What its failed attempts said so far (a batch answered a bare 500 counts).
    failures: EventFailures = EventFailures()
    #: Set when the caller stopped waiting (its ``deliver`` was cancelled, or :meth:`cancel`):
    #: not sent again, and no verdict.
    dropped: bool = False

    #: The task delivering it alone (the batch could not say what became of it), if any.
    alone: asyncio.Task[Any] | None = None

    def cancel(self) -> None:
        """The caller no longer wants this event delivered (see ``deliver_soon``)."""
        self.dropped = True
        if self.alone is not None:
            self.alone.cancel()


class _Unsupported(Exception):
    """The batch endpoint is given up (and no probe is due): the batch is not sent."""


def _set_verdict(future: asyncio.Future[Undeliverable | None], verdict: Undeliverable | None) -> None:
    if not future.done():
        future.set_result(verdict)


def _no_verdict(done: Done, token: Any, stopped: DeliveryStopped | None = None) -> None:
    """No verdict will come for this event: a ``deliver`` waiting for it is cancelled (or
    raises ``stopped``: the collector's check stopped the request)."""
    if done is _set_verdict and not token.done():
        if stopped is None:
            token.cancel()
        else:
            token.set_exception(stopped)


class BatchCollector:
    def __init__(self, config: CollectorConfig, metrics: CollectorMetrics,
                 classify_status: Callable[[int | None], Verdict] = classify,
                 envelope: Envelope = json_array, refuse: Refuse | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert config.batch is not None and config.batch_target is not None
        self.name = config.name
        self.config = config
        self._metrics = metrics
        #: The connection, shared; also delivers events that go alone.
        self.single = HttpCollector(config, metrics, classify_status, refuse)
        b = config.batch
        #: Whether batches go to the batch endpoint, or events alone (it answered 404s).
        self.fallback = BatchFallback(b.unsupported_after, b.reprobe_after_s)
        self._clock = clock
        self._fallback_gauge = metrics.batch_fallback()
        self._fallback_gauge.set(0)
        self._envelope = envelope
        self._url = URL(config.batch_target)
        # Logs name the URL without a query or fragment: a key may be in one.
        self._logged_url = str(self._url.with_query(None).with_fragment(None))
        self._max_events, self._max_bytes, self._linger_s = b.max_events, b.max_bytes, b.linger_ms / 1000
        self._max_requests = b.max_requests
        self._queue: deque[_Item] = deque()
        self._queued_bytes = 0
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._slots: asyncio.Semaphore | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[Any]] = set()
        #: Events waiting out their backoff before they go into a later batch.
        self._backing_off: dict[_Item, asyncio.TimerHandle] = {}

    def check_before_requests(self, check: Callable[[], None]) -> None:
        """See :meth:`HttpCollector.check_before_requests`: batches and events sent alone alike."""
        self.single.check_before_requests(check)

    async def start(self) -> None:
        await self.single.start()
        self._slots = asyncio.Semaphore(self._max_requests)
        self._flusher = asyncio.create_task(self._flush_forever(), name=f"batch-{self.name}")

    async def close(self) -> None:
        tasks = [t for t in (self._flusher, *self._sending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flusher = None
        # Queued and backing-off events are abandoned: no verdict comes for them (at-least-once:
        # their offsets are not committed), and a waiting ``deliver`` is cancelled.
        for item, handle in self._backing_off.items():
            handle.cancel()
            _no_verdict(item.done, item.token)
        self._backing_off.clear()
        for item in self._queue:
            _no_verdict(item.done, item.token)
        self._queue.clear()
        await self.single.close()

    async def deliver(self, body: bytes) -> Undeliverable | None:
        future: asyncio.Future[Undeliverable | None] = asyncio.get_running_loop().create_future()
        handle = self.deliver_soon(body, _set_verdict, future)
        try:
            return await future
        finally:
            if not future.done():
                handle.cancel()  # cancelled: whoever waits for it re-reads it (revocation, shutdown)

    def deliver_soon(self, body: bytes, done: Done, token: Any) -> _Item | asyncio.Task[Any]:
        """Queue ``body``; ``done(token, verdict)`` follows once, on the event loop, never
        from inside this call. Returns what stops the delivery (``cancel()``, then no
        verdict comes): the queued item, or the task of an event that goes alone."""
        loop = asyncio.get_running_loop()
        if (self.fallback.single and self.fallback.sends_alone(self._clock())  # no clock read while batching
                or len(body) + ENVELOPE_BYTES > self._max_bytes):
            return self._alone(body, done, token)
        item = _Item(body, done, token, loop.time())
        self._enqueue(item)
        return item

    def _enqueue(self, item: _Item) -> None:
        self._queue.append(item)
        self._queued_bytes += len(item.body) + 1
        self._arrived.set()
        if len(self._queue) >= self._max_events or self._queued_bytes + ENVELOPE_BYTES >= self._max_bytes:
            self._full.set()

    def _alone(self, body: bytes, done: Done, token: Any, before: int = 0) -> asyncio.Task[Any]:
        """Deliver ``body`` to the single-event endpoint (retries included: those
        ``retry.max_attempts`` leaves after ``before`` attempts in batches), then ``done``;
        cancelling the task returned means no verdict."""
        task = asyncio.create_task(self.single.deliver_after(body, before) if before else self.single.deliver(body))
        self._sending.add(task)

        def finished(task: asyncio.Task[Undeliverable | None]) -> None:
            self._sending.discard(task)
            if task.cancelled():  # closing, or the caller's cancel()
                _no_verdict(done, token)
            elif isinstance(err := task.exception(), DeliveryStopped):  # not sent: no verdict
                _no_verdict(done, token, err)
            elif err is not None:  # a bug: its verdict still comes
                log.error("delivery_error", exc_info=err, extra={"fields": {"collector": self.name}})
                done(token, relay_error(err))
            else:
                done(token, task.result())

        task.add_done_callback(finished)
        return task

    def _settle(self, item: _Item, outcome: EventOutcome, wait_s: float | None, request: int) -> None:
        """What ``deliver`` does with one event's outcome in a batch reply."""
        kind = outcome.outcome
        if kind == "delivered":
            item.done(item.token, None)
        elif kind == "single":  # this batch said nothing of it: not counted, the retries before it are
            item.alone = self._alone(item.body, item.done, item.token, item.attempt - 1)
        elif kind == "reject":
            item.done(item.token, Undeliverable("collector_rejected", outcome.detail, outcome.status))
        else:
            retry = self.config.retry
            record = self.single.tally.record(request)
            item.failures, failed_event = count_failure(item.failures, outcome.status, record,
                                                        retry.poison_after_attempts)
            max_attempts = retry.max_attempts
            left = max_attempts is None or item.attempt < max_attempts
            if failed_event and left:  # alone, it is judged on its own (a 500 there is its own)
                item.alone = self._alone(item.body, item.done, item.token, item.attempt)
                return
            if not left:  # max_attempts 1 (later, the last attempt went alone: see below)
                item.done(item.token, Undeliverable("retries_exhausted",
                                                    f"after {item.attempt} attempt{'s' if item.attempt > 1 else ''}: "
                                                    f"{outcome.detail}", outcome.status))
                return
            # Logged once per batch by _send; counted here per event, like single deliveries.
            self._metrics.retried.inc()
            delay = self.single.backoff_s(item.attempt, wait_s)
            item.attempt += 1
            # The last attempt goes alone: retries_exhausted on a batch's bare 500 would
            # dead-letter the neighbours of the one event the collector fails on.
            again = self._again if max_attempts is None or item.attempt < max_attempts else self._last_alone
            self._backing_off[item] = asyncio.get_running_loop().call_later(delay, again, item)

    def _again(self, item: _Item) -> None:
        """``item``'s backoff is over: into the next batch."""
        del self._backing_off[item]
        if not item.dropped:
            item.at = asyncio.get_running_loop().time()
            self._enqueue(item)

    def _last_alone(self, item: _Item) -> None:
        """``item``'s backoff is over and its next attempt is its last: alone, so that
        only its own answer decides."""
        del self._backing_off[item]
        if not item.dropped:
            item.alone = self._alone(item.body, item.done, item.token, item.attempt - 1)

    async def _flush_forever(self) -> None:
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            # Linger only while the batch could still grow; a full one goes at once.
            if len(self._queue) < self._max_events and self._queued_bytes + ENVELOPE_BYTES < self._max_bytes:
                self._full.clear()
                delay = self._queue[0].at + self._linger_s - loop.time()
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._full.wait(), delay)
                    except TimeoutError:
                        pass
            # Waiting for a free request slot lets the next batch fill up meanwhile.
            await self._slots.acquire()
            batch = self._take()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    def _take(self) -> list[_Item]:
        """The next batch: queued events in arrival order, within both limits."""
        batch: list[_Item] = []
        size = ENVELOPE_BYTES
        queue = self._queue
        while queue and len(batch) < self._max_events:
            item = queue[0]
            cost = len(item.body) + 1
            if batch and size + cost > self._max_bytes:
                break
            queue.popleft()
            self._queued_bytes -= cost
            if item.dropped:  # its deliver() was cancelled (revocation, shutdown)
                continue
            batch.append(item)
            size += cost
        return batch

    async def _send(self, batch: list[_Item]) -> None:
        assert self._slots is not None
        wait_s: float | None = None
        request = 0  # its number once sent (see relay.sinks.retry.CollectorRecord)
        ticket = self.fallback.ticket(self._clock())
        try:
            if ticket is None:  # given up, perhaps while this batch was waiting to go
                raise _Unsupported
            try:
                reply = await self.single.exchange(self._url, self._envelope([item.body for item in batch]),
                                                   MAX_REPLY_BYTES)
            except Retriable as err:  # its detail scrubbed (again: cheap, and what no answer quotes is raw)
                outcome = EventOutcome("retry", f"batch: {self.single.scrubber.text(err.detail, cut=True)}")
                reading = BatchReading([outcome] * len(batch), "retry")
            else:
                wait_s, request = reply.wait_s, reply.request
                reading = read_batch_reply(reply.status, None if reply.unread else reply.body, len(batch),
                                           self.single.verdict, self.single.scrubber.text,
                                           lambda _: self.single.quote(reply), reply.encoding)
        except _Unsupported:  # not sent: no request to count
            reading = BatchReading([EventOutcome("single", "batch endpoint unsupported")] * len(batch), "")
        except asyncio.CancelledError:  # closing: no verdict comes for these
            for item in batch:
                _no_verdict(item.done, item.token)
            raise
        except DeliveryStopped as err:  # the check_before_requests check: not sent, no verdict
            for item in batch:
                _no_verdict(item.done, item.token, err)
            return
        except Exception as err:  # noqa: BLE001 - never leave a deliver() waiting forever
            # A bug, not the collector's answer: retrying the batch would raise again, for
            # ever with unlimited attempts (no verdict, commits held). Each event goes alone,
            # where such a failure is its own dead letter (relay_error) at worst.
            # Scrubbed: an exception's text may quote the answer (or the request) it failed on.
            scrub = self.single.scrubber.text
            log_event(log, logging.ERROR, "batch_send_error", collector=self.name,
                      error=scrub(repr(err), cut=True)[:300])
            reading = BatchReading([EventOutcome("single", scrub(f"batch: {type(err).__name__}: {err}", cut=True))]
                                   * len(batch), "refused")
        finally:
            self._slots.release()
        self._note_reading(reading, len(batch), request, ticket)
        settle = self._settle
        for item, outcome in zip(batch, reading.outcomes):
            if not item.dropped:
                try:
                    settle(item, outcome, wait_s, request)
                except Exception as err:  # noqa: BLE001 - one failing caller must not strand the others
                    log_event(log, logging.ERROR, "batch_settle_error", collector=self.name, error=repr(err)[:300])

    def _note_reading(self, reading: BatchReading, events: int, request: int, ticket: int | None) -> None:
        """Counts what a batch reply said (a metric; request ``request`` accepted when it
        delivered any event: see ReplyTally), tells the fallback (batch ``ticket``) and logs
        what was odd about it."""
        if not reading.result:
            return
        self._metrics.batch_requests(reading.result).inc()
        if any(o.outcome == "delivered" for o in reading.outcomes):
            self.single.tally.accept(request)
        if ticket is not None:
            self._fallback_changed(self.fallback.answered(ticket, reading.result, self._clock()), reading)
        if reading.result not in ("ok", "unsupported"):  # unsupported: logged when it switches
            failed = sum(1 for o in reading.outcomes if o.outcome != "delivered")
            first = next((o.detail for o in reading.outcomes if o.outcome != "delivered"), "")
            log_event(log, logging.WARNING, "batch_not_all_delivered", collector=self.name,
                      result=reading.result, events=events, failed=failed, detail=first[:200],
                      note=reading.note or None)
        elif reading.note:  # delivered, but the reply was odd (too long to read)
            log_event(log, logging.WARNING, "batch_reply_not_read", collector=self.name, events=events,
                      note=reading.note)

    def _fallback_changed(self, change: str | None, reading: BatchReading) -> None:
        if change is None:
            return
        assert self.config.batch is not None
        reprobe, after = self.config.batch.reprobe_after_s, self.config.batch.unsupported_after
        again = "until the relay restarts" if reprobe is None else f"batch endpoint tried again in {reprobe:g} s"
        detail = reading.outcomes[0].detail[:300] if reading.outcomes else ""
        if change == "resumed":
            self._fallback_gauge.set(0)
            log_event(log, logging.INFO, "batch_resumed", collector=self.name, url=self._logged_url,
                      note="the batch endpoint accepted a batch: events go in batches again")
        elif change == "still_unsupported":
            log_event(log, logging.WARNING, "batch_still_unsupported", collector=self.name, url=self._logged_url,
                      detail=detail, note=f"events still go alone to the single-event endpoint; {again}")
        else:
            self._fallback_gauge.set(1)
            first = self.fallback.gave_up == 1
            log_event(log, logging.ERROR if first else logging.WARNING, "batch_unsupported", collector=self.name,
                      url=self._logged_url, detail=detail,
                      note=f"{after} batches in a row answered 404, 405 or 501: every event "
                           f"now goes alone to the single-event endpoint; {again}; set batch: null if the "
                           "collector has no batch endpoint")
