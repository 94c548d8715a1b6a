"""A one-thread executor whose thread is a daemon: the Kafka consumer's calls run there."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")


class ConsumerThread(Executor):
    """Runs the jobs submitted, in order, on one daemon thread (started with the first).

    Not a ThreadPoolExecutor: its threads are joined at interpreter exit, so a call that
    librdkafka holds up (a commit waiting for a coordinator it cannot reach) would hold the
    process past the relay's shutdown deadline, into the SIGKILL."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kafka-consumer", daemon=True)
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[T] = Future()
        self._jobs.put((future, fn, args, kwargs))
        if self._thread.ident is None:
            self._thread.start()
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            del job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # noqa: BLE001 - handed to whoever waits for it
                    future.set_exception(err)
            del future, fn, args, kwargs  # a job's result (a poll's messages) must not outlive it here

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        if wait and self._thread.ident is not None:
            self._thread.join()
