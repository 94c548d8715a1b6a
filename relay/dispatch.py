"""Concurrent delivery that keeps each run's events in order.

:class:`RunOrderedDispatcher` runs up to ``concurrency`` deliveries at once, but events
that share a key (the run id) are delivered one at a time, in submission order: the
next event of a run is sent only after the previous one was acknowledged (or given
up on). Events without a run (dataset/job events) have no ordering constraint. A run can
also be made to wait for one event of another run (``submit(event, after=...)``), which is
how a child run's START follows its parent's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from relay.events import LineageEvent


class RunOrderedDispatcher:
    def __init__(self, deliver: Callable[[LineageEvent], Awaitable[None]], concurrency: int) -> None:
        self._deliver = deliver
        self._concurrency = concurrency
        self._queues: dict[Any, deque[LineageEvent]] = {}
        self._ready: asyncio.Queue[Any] = asyncio.Queue()
        # id(event) -> keys whose first event waits for that event to be done
        self._gates: dict[int, list[Any]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.pending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
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
                self._ready.put_nowait(key)
            else:
                self._gates.setdefault(id(after), []).append(key)

    def forget_gate(self, event: LineageEvent) -> None:
        """``event`` will never be submitted: runs waiting for it go on."""
        self._open_gate(event)

    def _open_gate(self, event: LineageEvent) -> None:
        for key in self._gates.pop(id(event), ()):
            self._ready.put_nowait(key)

    async def _work(self) -> None:
        queues, ready = self._queues, self._ready
        while True:
            key = await ready.get()
            queue = queues[key]
            if not queue:  # emptied by remove_where while waiting
                del queues[key]
                continue
            event = queue.popleft()
            try:
                await self._deliver(event)
            finally:
                if self._gates:
                    self._open_gate(event)
                self.pending -= 1
                if queue:
                    ready.put_nowait(key)
                else:
                    del queues[key]
                if self.pending == 0:
                    self._idle.set()
            # Hold nothing while waiting for the next key: an idle worker's last event
            # (up to max_event_bytes) would otherwise stay alive, uncounted.
            del event, queue

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
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
