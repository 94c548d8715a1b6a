"""Concurrent delivery that keeps each run's events in order.

:class:`RunOrderedDispatcher` runs up to ``concurrency`` deliveries at once, but events
that share a key (the run id) are delivered one at a time, in submission order: the
next event of a run is sent only after the previous one was acknowledged (or given
up on). Events without a run (dataset/job events) have no ordering constraint. A run can
also be made to wait for one event of another run (``submit(event, after=...)``), which is
how a child run's START follows its parent's.

A delivery is ``settle(event, await deliver(prepare(event)))`` (``prepare`` returning
None means the event was taken care of otherwise). The three parts are separate so that
the delivering task's coroutine chain is only the dispatcher's worker and the collector:
each level of it is paid again every time the task resumes.

A collector that can call back (``deliver_soon(item, done, token)``, then
``done(token, verdict)`` once, later, on the loop) is driven without worker tasks: up to
``concurrency`` events are handed to it at once, and each verdict settles its event and
hands over the run's next one right away. A batch collector gains the most: per event,
no task wake-up and no future (its share of the POST is small).

Deliveries under way can be stopped (:meth:`RunOrderedDispatcher.abort_where`): the relay
does so for the events of partitions another member now owns, which it sends again.

``prepare``, ``deliver`` and ``deliver_soon`` are not meant to raise (a collector gives up
with a verdict). If one does anyway (a bug, a third-party collector kind), the event is
settled with ``failed(error)`` (the relay dead-letters it with reason ``relay_error``),
``delivery_error`` is logged with the traceback, and delivery goes on: a worker that died
with it would have left the event's offset, and so its partition's commits, stuck.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from relay.events import LineageEvent

log = logging.getLogger("relay.dispatch")


def _same(event: LineageEvent) -> LineageEvent:
    return event


def _nothing(event: LineageEvent, result: object) -> None:
    return None


def _error(err: Exception) -> Exception:
    return err


class RunOrderedDispatcher:
    def __init__(self, deliver: Callable[[Any], Awaitable[Any]], concurrency: int, *,
                 prepare: Callable[[LineageEvent], Any] = _same,
                 settle: Callable[[LineageEvent, Any], None] = _nothing,
                 deliver_soon: Callable[[Any, Callable[[Any, Any], None], Any], Any] | None = None,
                 failed: Callable[[Exception], Any] = _error) -> None:
        self._deliver = deliver
        self._failed = failed
        self._deliver_soon = deliver_soon
        #: Callback mode: events handed to ``deliver_soon`` and not settled yet.
        self._in_flight = 0
        self._pumping = False
        self._stopped = False
        self._prepare = prepare
        self._settle = settle
        self._concurrency = concurrency
        self._queues: dict[Any, deque[LineageEvent]] = {}
        # Keys whose next event can go; idle workers wait on a future each (handed a key
        # directly), so ``_ready`` is empty whenever a worker is idle. Cheaper per event
        # than an asyncio.Queue.
        self._ready: deque[Any] = deque()
        self._idle_workers: deque[asyncio.Future[Any]] = deque()
        # id(event) -> keys whose first event waits for that event to be done
        self._gates: dict[int, list[Any]] = {}
        # id(event) -> (event, what stops its delivery, key, queue) for the events being
        # delivered (see sending_where and abort_where): the worker task delivering it, or
        # what ``deliver_soon`` returned.
        self._sending: dict[int, tuple[LineageEvent, Any, Any, deque[LineageEvent]]] = {}
        # Worker mode: ids of events whose delivery abort_where cancelled, until their
        # worker has seen the cancellation.
        self._aborted: set[int] = set()
        self._workers: list[asyncio.Task[None]] = []
        self.pending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        self._stopped = False
        if self._deliver_soon is not None:
            return  # no workers: see _pump
        self._workers = [asyncio.create_task(self._work(), name=f"deliver-{i}") for i in range(self._concurrency)]

    def submit(self, event: LineageEvent, after: LineageEvent | None = None) -> None:
        """Queue ``event`` behind its run's earlier events. With ``after`` (an event submitted
        or still to be submitted here), a run with nothing queued starts only once ``after``
        was delivered or removed; the caller must make sure it will be."""
        key = event.run_id if event.run_id is not None else object()
        self.pending += 1
        self._idle.clear()
        queue = self._queues.get(key)
        if queue is not None:
            # The key is either being delivered, waiting in _ready or waiting at a gate.
            queue.append(event)
        else:
            self._queues[key] = deque((event,))
            if after is None:
                self._make_ready(key)
            else:
                self._gates.setdefault(id(after), []).append(key)

    def forget_gate(self, event: LineageEvent) -> None:
        """``event`` will never be submitted: runs waiting for it go on."""
        self._open_gate(event)

    def _open_gate(self, event: LineageEvent) -> None:
        for key in self._gates.pop(id(event), ()):
            self._make_ready(key)

    def _make_ready(self, key: Any) -> None:
        if self._deliver_soon is not None:
            self._ready.append(key)
            self._pump()
            return
        idle = self._idle_workers
        while idle:
            waiter = idle.popleft()
            if not waiter.done():  # done: its worker was cancelled
                waiter.set_result(key)
                return
        self._ready.append(key)

    def _pump(self) -> None:
        """Callback mode: hand ready runs' next events over while there is room."""
        if self._pumping or self._stopped:
            return  # the outer call goes on with what this one would have done
        self._pumping = True
        queues, ready, prepare, deliver_soon = self._queues, self._ready, self._prepare, self._deliver_soon
        try:
            while ready and self._in_flight < self._concurrency:
                key = ready.popleft()
                queue = queues[key]
                if not queue:  # emptied by remove_where while waiting
                    del queues[key]
                    continue
                event = queue.popleft()
                try:
                    item = prepare(event)
                    if item is not None:
                        handle = deliver_soon(item, self._verdict, (key, queue, event))
                        self._in_flight += 1
                        self._sending[id(event)] = (event, handle, key, queue)
                        continue
                except Exception as err:  # noqa: BLE001 - see the module docstring
                    self._unexpected(event, err)
                self._done(key, queue, event)  # taken care of otherwise, or failed
        finally:
            self._pumping = False

    def _verdict(self, token: tuple[Any, deque[LineageEvent], LineageEvent], result: Any) -> None:
        """Callback mode: the collector's verdict on one event."""
        if self._stopped:
            return
        key, queue, event = token
        if self._sending.pop(id(event), None) is None:
            return  # aborted (abort_where): its run went on already
        self._in_flight -= 1
        try:
            self._settle(event, result)
        except Exception as err:  # noqa: BLE001 - the run's next events must still go
            log.error("settle_failed", exc_info=err, extra={"fields": {"source": str(event.source)}})
        finally:
            self._done(key, queue, event)
            self._pump()

    def _unexpected(self, event: LineageEvent, err: Exception) -> None:
        """``prepare`` or the collector raised: settle ``event`` as failed (see the module
        docstring)."""
        log.error("delivery_error", exc_info=err, extra={"fields": {"source": str(event.source),
                                                                    "error": repr(err)[:300]}})
        try:
            self._settle(event, self._failed(err))
        except Exception as again:  # noqa: BLE001 - the run's next events must still go
            log.error("settle_failed", exc_info=again, extra={"fields": {"source": str(event.source)}})

    def _done(self, key: Any, queue: deque[LineageEvent], event: LineageEvent) -> None:
        """``event`` is done with: runs waiting for it, and its own run's next event, may go."""
        if self._gates:
            self._open_gate(event)
        self.pending -= 1
        if queue:
            self._ready.append(key)
        else:
            del self._queues[key]
        if self.pending == 0:
            self._idle.set()

    async def _work(self) -> None:
        queues, ready, idle = self._queues, self._ready, self._idle_workers
        prepare, deliver, settle, sending = self._prepare, self._deliver, self._settle, self._sending
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        while True:
            if ready:
                key = ready.popleft()
            else:
                waiter = loop.create_future()
                idle.append(waiter)
                key = await waiter
                del waiter
            queue = queues[key]
            if not queue:  # emptied by remove_where while waiting
                del queues[key]
                continue
            event = queue.popleft()
            sending[id(event)] = (event, task, key, queue)
            item = None
            try:
                item = prepare(event)
                if item is not None:
                    result = await deliver(item)
                    try:
                        settle(event, result)
                    except Exception as err:  # noqa: BLE001 - settled or not, the run goes on
                        log.error("settle_failed", exc_info=err, extra={"fields": {"source": str(event.source)}})
                    del result
            except Exception as err:  # noqa: BLE001 - see the module docstring
                self._unexpected(event, err)
            except asyncio.CancelledError:
                if not self._aborted or id(event) not in self._aborted:
                    raise
                self._aborted.discard(id(event))
                if task.uncancel():
                    raise  # stopped as well
            finally:
                del sending[id(event)]
                if self._aborted:  # a delivery that swallowed its cancellation: the id is stale now
                    self._aborted.discard(id(event))
                # The run's next event goes behind runs already waiting (this worker, or
                # another, takes it when its turn comes).
                self._done(key, queue, event)
            # Hold nothing while waiting for the next key: an idle worker's last event
            # (up to max_event_bytes) would otherwise stay alive, uncounted.
            del event, queue, item

    def sending_where(self, predicate: Callable[[LineageEvent], bool]) -> int:
        """Events being delivered (handed to the collector, verdict not in yet) that match."""
        return sum(1 for event, *_ in self._sending.values() if predicate(event))

    def abort_where(self, predicate: Callable[[LineageEvent], bool]) -> list[LineageEvent]:
        """Stop delivering the events being delivered that match (no more retries), e.g.
        when their partition moved to another member, which sends them again: a retry of
        ours landing later could put a run's START after the COMPLETE the new owner sent.
        They get no verdict (``settle`` is not called) and their runs' next events may go;
        returns them. A request already on its way may still reach the collector.

        A worker's delivery is cancelled (the worker goes on with the next event); in
        callback mode, ``cancel()`` is called on what ``deliver_soon`` returned, when it has
        one, and a verdict that still comes is ignored."""
        aborted = []
        for eid, (event, handle, key, queue) in list(self._sending.items()):
            if not predicate(event) or eid in self._aborted:
                continue
            aborted.append(event)
            if self._deliver_soon is None:
                self._aborted.add(eid)
                handle.cancel()  # the worker task: it sees the cancellation in deliver()
                continue
            del self._sending[eid]
            cancel = getattr(handle, "cancel", None)
            if cancel is not None:
                cancel()
            self._in_flight -= 1
            self._done(key, queue, event)
        if aborted and self._deliver_soon is not None:
            self._pump()
        return aborted

    def remove_where(self, predicate: Callable[[LineageEvent], bool]) -> list[LineageEvent]:
        """Take queued (not in-flight) events out, e.g. when their partition is revoked; runs
        waiting for one of them go on."""
        removed = []
        for queue in self._queues.values():
            keep = [e for e in queue if not predicate(e)]
            if len(keep) != len(queue):
                removed.extend(e for e in queue if predicate(e))
                queue.clear()
                queue.extend(keep)
        self.pending -= len(removed)
        if self._gates:
            for event in removed:
                self._open_gate(event)
        if self.pending == 0:
            self._idle.set()
        # Keys whose queue emptied stay registered until their worker or _ready entry
        # comes round; a worker finding an empty queue skips it.
        return removed

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def stop(self) -> None:
        """Stop delivering: nothing is being sent afterwards (:meth:`sending_where` counts
        none), and the events under way get no verdict (abandoned: not committed)."""
        # Callback mode: verdicts still to come are ignored (their events are abandoned, as
        # a cancelled worker's are); the collector's close drops what it holds. A worker
        # forgets its event as it stops; in callback mode they are forgotten here, or a
        # revocation after the stop (leaving the group) would wait for them in vain.
        self._stopped = True
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        self._sending.clear()
        self._in_flight = 0
