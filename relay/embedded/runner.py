"""Run a relay on a background thread with its own event loop (of the kind its
``event_loop`` says): for the demo, the tests and embedding in a synchronous program.
``stop()`` asks it to drain and waits."""

from __future__ import annotations

import asyncio
import threading

from relay.app import Relay
from relay.config import RelayConfig
from relay.event_loop import new_event_loop


class RelayThread:
    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.relay: Relay | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._started = threading.Event()

    def start(self) -> RelayThread:
        def target() -> None:
            self._loop = new_event_loop(self.config.event_loop)
            asyncio.set_event_loop(self._loop)

            async def main() -> None:
                self.relay = Relay(self.config)
                self._started.set()
                await self.relay.run()
            try:
                self._loop.run_until_complete(main())
            except BaseException as err:  # surfaced by stop()
                self.error = err
                self._started.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=target, name="relay-under-test", daemon=True)
        self._thread.start()
        assert self._started.wait(30), "relay did not start"
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self.relay is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.relay.request_stop)
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "relay did not stop within its drain timeout"
        self._thread = None
        if self.error is not None:
            raise self.error

    def metric(self, name: str, **labels: str) -> float:
        assert self.relay is not None
        value = self.relay.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def __enter__(self) -> RelayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
