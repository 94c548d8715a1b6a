"""A broker that stops answering on cue: a TCP proxy in front of a real one that, from a
chosen request on, forwards nothing more, as a hung broker (or a network that drops every
packet) does. Connections stay open; new ones are accepted and never answered.

Unlike a stopped process (SIGSTOP), the moment is exact: :meth:`HangingProxy.hang_at`
names the Kafka request (api key) that is the first one left unanswered, so everything the
client did before it went through. :meth:`HangingProxy.recover` drops every connection
and forwards again, as a restarted broker would.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from contextlib import AbstractContextManager

from relay.embedded.broker import EmbeddedBroker
from tests.support.kafka_proxy import LoopProxy, broker_behind

#: The Kafka api key of a consumer group commit.
OFFSET_COMMIT = 8
#: The Kafka api key of a fetch.
FETCH = 1


class HangingProxy(LoopProxy):
    """Forwards frame by frame until it hangs. ``hung`` is set once it does."""

    def __init__(self, upstream_port: int, port: int) -> None:
        super().__init__(upstream_port, port, "hanging-proxy")
        self.hung = threading.Event()
        self._hang_at: int | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _closing(self) -> None:
        self._drop_all()

    def hang_at(self, api_key: int) -> None:
        """Hang when a request with ``api_key`` arrives (it is not forwarded either)."""
        async def arm() -> None:
            self._hang_at = api_key
        asyncio.run_coroutine_threadsafe(arm(), self._loop).result(10)

    def recover(self) -> None:
        """Drop every connection (what was held is lost) and forward again."""
        async def recover() -> None:
            self._hang_at = None
            self._drop_all()
            self.hung.clear()
        asyncio.run_coroutine_threadsafe(recover(), self._loop).result(10)

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.add(client_writer)
        if self.hung.is_set():
            return  # accepted, never answered; recover() closes it
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        self._writers.add(broker_writer)
        try:
            await asyncio.gather(self._pump(client_reader, broker_writer, requests=True),
                                 self._pump(broker_reader, client_writer, requests=False))
        except asyncio.CancelledError:  # stop(): the connection is dropped
            client_writer.close()
            broker_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, requests: bool) -> None:
        try:
            while True:
                size = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", size)[0])
                if requests and self._hang_at is not None and struct.unpack_from(">h", frame)[0] == self._hang_at:
                    self.hung.set()
                if self.hung.is_set():
                    continue  # read and dropped: the other side waits for ever
                writer.write(size + frame)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def hanging_broker() -> AbstractContextManager[tuple[EmbeddedBroker, HangingProxy]]:
    """A Tansu broker whose clients all go through a :class:`HangingProxy`
    (``broker.bootstrap_servers`` names the proxy)."""
    return broker_behind(HangingProxy(0, 0))  # type: ignore[return-value]
