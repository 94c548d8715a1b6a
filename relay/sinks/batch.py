"""A batch collector: events go to the collector's batch endpoint, many per POST.

:meth:`BatchCollector.deliver` keeps the contract of :class:`~relay.sinks.base.Collector`:
it returns once *this* event was acknowledged (``None``) or given up on
(:class:`Undeliverable`), never drops it silently. Events of concurrent ``deliver`` calls
are gathered into one batch, sent when it holds ``max_events`` events, when the next event
would take it over ``max_bytes``, or ``linger_ms`` after its first event; at most
``max_requests`` batches are in flight.

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
  ``max_bytes`` on its own also goes alone.
* Offsets: each event settles only when its ``deliver`` returns, so an offset is committed
  only after every event at or below it was delivered or dead-lettered.

Not guaranteed: an event that was delivered but whose batch answer was lost (timeout,
reset) is sent again (at-least-once, as for single events).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from yarl import URL

from relay.config import CollectorConfig
from relay.logs import log_event
from relay.metrics import CollectorMetrics
from relay.sinks.base import Undeliverable
from relay.sinks.batch_reply import BatchReading, EventOutcome, read_batch_reply
from relay.sinks.http import HttpCollector, Retriable
from relay.sinks.retry import Verdict, classify

log = logging.getLogger("relay.sinks.batch")

#: Builds a batch request body from the events' JSON bodies (no re-encoding).
Envelope = Callable[[list[bytes]], bytes]
#: Bytes the widest envelope adds around the events (``{"events":[`` ... ``]}``).
_ENVELOPE_BYTES = 16


def json_array(bodies: list[bytes]) -> bytes:
    """The spec's batch body: a JSON array of events."""
    return b"[" + b",".join(bodies) + b"]"


@dataclass(slots=True, eq=False)
class _Item:
    body: bytes
    done: asyncio.Future[tuple[EventOutcome, float | None]]
    at: float


class BatchCollector:
    def __init__(self, config: CollectorConfig, metrics: CollectorMetrics,
                 classify_status: Callable[[int | None], Verdict] = classify,
                 envelope: Envelope = json_array) -> None:
        assert config.batch is not None and config.batch_target is not None
        self.name = config.name
        self.config = config
        self._metrics = metrics
        #: The connection, shared; also delivers events that go alone.
        self.single = HttpCollector(config, metrics, classify_status)
        self._envelope = envelope
        self._url = URL(config.batch_target)
        b = config.batch
        self._max_events, self._max_bytes, self._linger_s = b.max_events, b.max_bytes, b.linger_ms / 1000
        self._max_requests = b.max_requests
        self._queue: deque[_Item] = deque()
        self._queued_bytes = 0
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._slots: asyncio.Semaphore | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

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
        for item in self._queue:
            item.done.cancel()
        self._queue.clear()
        await self.single.close()

    async def deliver(self, body: bytes) -> Undeliverable | None:
        if len(body) + _ENVELOPE_BYTES > self._max_bytes:
            return await self.single.deliver(body)
        max_attempts = self.config.retry.max_attempts
        attempt = 1
        while True:
            outcome, wait_s = await self._submit(body)
            kind = outcome.outcome
            if kind == "delivered":
                return None
            if kind == "single":
                return await self.single.deliver(body)
            if kind == "reject":
                return Undeliverable("collector_rejected", outcome.detail, outcome.status)
            if max_attempts is not None and attempt >= max_attempts:
                return Undeliverable("retries_exhausted", f"after {attempt} attempts: {outcome.detail}",
                                     outcome.status)
            # Logged once per batch by _send; counted here per event, like single deliveries.
            self._metrics.retried.inc()
            await asyncio.sleep(self.single.backoff_s(attempt, wait_s))
            attempt += 1

    def _submit(self, body: bytes) -> asyncio.Future[tuple[EventOutcome, float | None]]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[EventOutcome, float | None]] = loop.create_future()
        self._queue.append(_Item(body, done, loop.time()))
        self._queued_bytes += len(body) + 1
        self._arrived.set()
        if len(self._queue) >= self._max_events or self._queued_bytes + _ENVELOPE_BYTES >= self._max_bytes:
            self._full.set()
        return done

    async def _flush_forever(self) -> None:
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            # Linger only while the batch could still grow; a full one goes at once.
            if len(self._queue) < self._max_events and self._queued_bytes + _ENVELOPE_BYTES < self._max_bytes:
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
        size = _ENVELOPE_BYTES
        queue = self._queue
        while queue and len(batch) < self._max_events:
            item = queue[0]
            cost = len(item.body) + 1
            if batch and size + cost > self._max_bytes:
                break
            queue.popleft()
            self._queued_bytes -= cost
            if item.done.done():  # its deliver() was cancelled (revocation, shutdown)
                continue
            batch.append(item)
            size += cost
        return batch

    async def _send(self, batch: list[_Item]) -> None:
        assert self._slots is not None
        wait_s: float | None = None
        try:
            try:
                reply = await self.single.exchange(self._url, self._envelope([item.body for item in batch]))
            except Retriable as err:
                outcome = EventOutcome("retry", f"batch: {err.detail}")
                reading = BatchReading([outcome] * len(batch), "retry")
            else:
                wait_s = reply.wait_s
                reading = read_batch_reply(reply.status, reply.body, len(batch), self.single.verdict)
        except Exception as err:  # noqa: BLE001 - never leave a deliver() waiting forever
            log_event(log, logging.ERROR, "batch_send_error", collector=self.name, error=repr(err)[:300])
            reading = BatchReading([EventOutcome("retry", f"batch: {type(err).__name__}")] * len(batch), "retry")
        finally:
            self._slots.release()
        self._metrics.batch_requests(reading.result).inc()
        if reading.result != "ok":
            failed = sum(1 for o in reading.outcomes if o.outcome != "delivered")
            first = next((o.detail for o in reading.outcomes if o.outcome != "delivered"), "")
            log_event(log, logging.WARNING, "batch_not_all_delivered", collector=self.name,
                      result=reading.result, events=len(batch), failed=failed, detail=first[:200],
                      note=reading.note or None)
        for item, outcome in zip(batch, reading.outcomes):
            if not item.done.done():
                item.done.set_result((outcome, wait_s))
