"""A Kafka-protocol proxy for fault injection: it sits between clients and a real broker,
reads the protocol's framing, and can replace the error code of chosen responses.

Some failures cannot be caused on demand with a real broker, such as a consumer fenced by
another member with the same ``group.instance.id``, or an idempotent producer's sequence
refused. The proxy makes the broker's answer carry that error, so the client's own error
handling runs, as it would in production.

The broker must advertise the proxy's address (``EmbeddedBroker(advertised_port=...)``), so
that clients reach every broker connection through it.

Three kinds of fault:

* :meth:`KafkaFaultProxy.answer_with_error`: the broker handles the request, and its answer
  is given the error code (a write then happened although the client is told otherwise);
* :meth:`KafkaFaultProxy.refuse_produce`: the broker never writes the request's records
  (its partition index is turned into one that does not exist, and restored in the answer,
  which carries the error code), as a broker refuses a record batch over its size limit;
* :meth:`KafkaFaultProxy.move_log_start`: a partition's log start offset, as ListOffsets
  answers it, is moved up, as retention deleting the records below it would (the broker
  still serves them to a fetch: only where a client chooses to start is affected);
* :meth:`KafkaFaultProxy.fail_fetch`: the next fetch answers that carry records give
  their first partition an error code (``OFFSET_OUT_OF_RANGE``: the fetch position was
  removed by retention, as a consumer lagging behind it is told).

Only what the tests need is decoded: the request header (api key, version, correlation id),
the first partition of a produce request and of a ListOffsets request, the first error
code of the responses named in :data:`ERROR_OFFSET`, and the first partition's error code
of a fetch answer (v12 and later, which name topics by id, as librdkafka 2.x asks).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Self

from relay.embedded.broker import EmbeddedBroker

#: Kafka api keys used here.
PRODUCE, FETCH, LIST_OFFSETS, OFFSET_COMMIT, HEARTBEAT, INIT_PRODUCER_ID = 0, 1, 2, 8, 12, 22
#: The first version of each api whose messages use the flexible (tagged-field) encoding.
FLEXIBLE_FROM = {PRODUCE: 9, LIST_OFFSETS: 6, OFFSET_COMMIT: 8, HEARTBEAT: 4, INIT_PRODUCER_ID: 2}
#: ListOffsets' timestamp asking for the log start offset.
EARLIEST = -2

#: Kafka error codes used by the tests.
OFFSET_OUT_OF_RANGE, MESSAGE_TOO_LARGE = 1, 10
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID = 45, 47, 59
UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID = 25, 27, 82


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _skip_tagged_fields(data: bytes, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)        # tag
        size, pos = _uvarint(data, pos)
        pos += size
    return pos


def _partition_error_offset(body: bytes, pos: int, flexible: bool) -> int:
    """The offset of the first partition's error code in a response body that starts (at
    ``pos``) with a topics array of partition arrays (ProduceResponse, OffsetCommitResponse)."""
    if flexible:
        _, pos = _uvarint(body, pos)          # topics (compact array)
        name_len, pos = _uvarint(body, pos)   # compact string: length + 1
        pos += name_len - 1
        _, pos = _uvarint(body, pos)          # partitions (compact array)
    else:
        pos += 4                              # topics array length
        (name_len,) = struct.unpack_from(">h", body, pos)
        pos += 2 + name_len
        pos += 4                              # partitions array length
    return pos + 4                            # past the partition index


def _fetch_partition_error_offset(frame: bytes, version: int) -> int | None:
    """The offset of the first partition's error code in a FetchResponse frame (v13+:
    flexible, topics by id), or None unless that partition carries records: librdkafka
    reads an answer without records at the end of the partition as its end, whatever the
    error code."""
    if version < 13:
        raise NotImplementedError(f"fetch v{version}: only v13 and later are decoded")
    pos = _skip_tagged_fields(frame, 4)       # correlation id, header tags
    pos += 4 + 2 + 4                          # throttle time, error code, session id
    topics, pos = _uvarint(frame, pos)        # compact array: count + 1
    if topics < 2:
        return None
    pos += 16                                 # topic id
    partitions, pos = _uvarint(frame, pos)
    if partitions < 2:
        return None
    error_at = pos + 4                        # past the partition index
    pos = error_at + 2 + 8 + 8 + 8            # error code, high watermark, last stable offset, log start
    aborted, pos = _uvarint(frame, pos)       # compact nullable array
    if aborted > 1:
        return None                           # (not decoded: the tests write no transactions)
    pos += 4                                  # preferred read replica
    records, pos = _uvarint(frame, pos)       # compact nullable bytes: length + 1
    return error_at if records > 1 else None


def _produce_request_partition_offset(frame: bytes, version: int) -> int:
    """The offset of the first partition index in a ProduceRequest (v3-v12)."""
    pos = 8                                   # api key, version, correlation id
    (client_len,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + max(client_len, 0)             # client id: a nullable string in every header
    if version >= FLEXIBLE_FROM[PRODUCE]:
        pos = _skip_tagged_fields(frame, pos)
        txn_len, pos = _uvarint(frame, pos)   # transactional id: compact nullable string
        pos += max(txn_len - 1, 0) + 2 + 4    # acks, timeout
        _, pos = _uvarint(frame, pos)         # topics
        name_len, pos = _uvarint(frame, pos)
        pos += name_len - 1
        _, pos = _uvarint(frame, pos)         # partitions
        return pos
    (txn_len,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + max(txn_len, 0) + 2 + 4 + 4    # transactional id, acks, timeout, topics
    (name_len,) = struct.unpack_from(">h", frame, pos)
    return pos + 2 + name_len + 4             # name, partitions


def _list_offsets_request_first(frame: bytes, version: int) -> tuple[str, int, int]:
    """(topic, partition, timestamp) of the first partition in a ListOffsets request (v1+)."""
    flexible = version >= FLEXIBLE_FROM[LIST_OFFSETS]
    pos = 8                                   # api key, version, correlation id
    (client_len,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + max(client_len, 0)
    if flexible:
        pos = _skip_tagged_fields(frame, pos)
    pos += 4 + (1 if version >= 2 else 0)     # replica id, isolation level
    if flexible:
        _, pos = _uvarint(frame, pos)         # topics (compact array)
        name_len, pos = _uvarint(frame, pos)
        name = frame[pos:pos + name_len - 1].decode()
        pos += name_len - 1
        _, pos = _uvarint(frame, pos)         # partitions
    else:
        pos += 4
        (name_len,) = struct.unpack_from(">h", frame, pos)
        name = frame[pos + 2:pos + 2 + name_len].decode()
        pos += 2 + name_len + 4
    partition, = struct.unpack_from(">i", frame, pos)
    pos += 4 + (4 if version >= 4 else 0)     # partition, current leader epoch
    timestamp, = struct.unpack_from(">q", frame, pos)
    return name, partition, timestamp


#: A partition index no topic has.
_NO_PARTITION = 0x7FFFFFF0

#: Where the error code sits in a response body (after the response header), by api key.
ERROR_OFFSET: dict[int, Callable[[bytes, int, int, bool], int]] = {
    HEARTBEAT: lambda body, pos, version, flexible: pos + (4 if version >= 1 else 0),
    INIT_PRODUCER_ID: lambda body, pos, version, flexible: pos + 4,
    PRODUCE: lambda body, pos, version, flexible: _partition_error_offset(body, pos, flexible),
    OFFSET_COMMIT: lambda body, pos, version, flexible: _partition_error_offset(
        body, pos + (4 if version >= 3 else 0), flexible),
    LIST_OFFSETS: lambda body, pos, version, flexible: _partition_error_offset(
        body, pos + (4 if version >= 2 else 0), flexible),
}


class LoopProxy:
    """A TCP proxy on ``127.0.0.1:port`` to ``127.0.0.1:upstream_port``, served by an event
    loop on its own thread; a subclass gives ``_serve(client_reader, client_writer)``."""

    def __init__(self, upstream_port: int, port: int, name: str) -> None:
        # Bound now (0: any free port), listening from start(): a port found free and bound
        # only later could be taken meanwhile, e.g. as the source port of another test
        # worker's connection (seen: "address already in use" under 4 workers). A bound
        # socket that does not listen refuses connections, as no proxy at all would.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.upstream_port, self.port = upstream_port, self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _closing(self) -> None:
        """On the loop, as :meth:`stop` begins (after the server stopped listening)."""

    def start(self) -> Self:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, sock=self._sock), self._loop).result(10)
        return self

    def release(self) -> None:
        """Give the port back without ever serving (a proxy that was not started)."""
        if self._server is None:
            self._sock.close()

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            self._closing()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KafkaFaultProxy(LoopProxy):
    """Forwards Kafka requests, rewriting answers on cue.

    ``requests`` counts the requests seen by (api key, version); ``injected`` lists the
    (api key, version, error code) of each response rewritten."""

    def __init__(self, upstream_port: int, port: int) -> None:
        super().__init__(upstream_port, port, "kafka-fault-proxy")
        self.requests: Counter[tuple[int, int]] = Counter()
        self.injected: list[tuple[int, int, int]] = []
        self._faults: dict[int, list[int]] = {}    # api key -> [error code, responses left, to let by]
        self._refusals: list[int] = []              # [error code, produce requests left]
        # (connection, correlation id) -> (partition, error code)
        self._refused: dict[tuple[int, int], tuple[int, int]] = {}
        self._log_starts: dict[tuple[str, int], int] = {}  # (topic, partition) -> log start offset
        self._earliest: dict[tuple[int, int], int] = {}  # (connection, correlation id) -> log start offset to answer
        self._fetch_fault: list[int] = []    # [error code, fetch answers left, log start or -1]
        self._lock = threading.Lock()

    def answer_with_error(self, api_key: int, error_code: int, times: int = 1, *, after: int = 0) -> None:
        """The next ``times`` responses to ``api_key`` requests carry ``error_code``, after
        ``after`` more answered as they are."""
        with self._lock:
            self._faults[api_key] = [error_code, times, after]

    def refuse_produce(self, error_code: int, times: int = 1) -> None:
        """The next ``times`` produce requests are not written (their first partition's
        records; send to one-partition topics) and are answered with ``error_code``."""
        with self._lock:
            self._refusals = [error_code, times]

    def move_log_start(self, topic: str, partition: int, offset: int) -> None:
        """ListOffsets answers ``offset`` as the partition's log start from now on (ask one
        partition at a time, as ``get_watermark_offsets`` does: only a request's first
        partition is looked at)."""
        with self._lock:
            self._log_starts[(topic, partition)] = offset

    def fail_fetch(self, error_code: int, times: int = 1, *, log_start: int | None = None) -> None:
        """The next ``times`` fetch answers whose first partition carries records give it
        ``error_code`` (its records are then ignored by the client), and, with
        ``log_start``, that log start offset (what the client caches as the partition's
        start, as retention having removed the records below it would make it)."""
        with self._lock:
            self._fetch_fault = [error_code, times, -1 if log_start is None else log_start]

    def seen(self, api_key: int) -> int:
        with self._lock:
            return sum(n for (key, _), n in self.requests.items() if key == api_key)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        pending: dict[int, tuple[int, int]] = {}   # correlation id -> (api key, version)
        try:
            await asyncio.gather(
                self._pump(client_reader, broker_writer, lambda frame: self._request(frame, pending)),
                self._pump(broker_reader, client_writer, lambda frame: self._response(frame, pending)))
        except asyncio.CancelledError:  # stop(): the connection is dropped
            client_writer.close()
            broker_writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    handle: Callable[[bytes], bytes]) -> None:
        try:
            while True:
                size = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", size)[0])
                writer.write(size + handle(frame))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _request(self, frame: bytes, pending: dict[int, tuple[int, int]]) -> bytes:
        api_key, version, correlation = struct.unpack_from(">hhi", frame)
        pending[correlation] = (api_key, version)
        with self._lock:
            self.requests[(api_key, version)] += 1
            if api_key == LIST_OFFSETS and self._log_starts and version >= 1:
                topic, partition, timestamp = _list_offsets_request_first(frame, version)
                start = self._log_starts.get((topic, partition))
                if start is not None and timestamp == EARLIEST:
                    self._earliest[(id(pending), correlation)] = start
                return frame
            if api_key != PRODUCE or not self._refusals or self._refusals[1] <= 0:
                return frame
            self._refusals[1] -= 1
            error_code = self._refusals[0]
        at = _produce_request_partition_offset(frame, version)
        (partition,) = struct.unpack_from(">i", frame, at)
        self._refused[(id(pending), correlation)] = (partition, error_code)
        return frame[:at] + struct.pack(">i", _NO_PARTITION) + frame[at + 4:]

    def _response(self, frame: bytes, pending: dict[int, tuple[int, int]]) -> bytes:
        (correlation,) = struct.unpack_from(">i", frame)
        api_key, version = pending.pop(correlation, (-1, -1))
        # Correlation ids are per connection: another client's may be the same number.
        start = self._earliest.pop((id(pending), correlation), None)
        if start is not None:
            flexible = version >= FLEXIBLE_FROM[api_key]
            at = ERROR_OFFSET[api_key](frame, _skip_tagged_fields(frame, 4) if flexible else 4, version, flexible)
            offset_at = at + 2 + 8                # past the error code and the timestamp
            with self._lock:
                self.injected.append((api_key, version, 0))
            return frame[:offset_at] + struct.pack(">q", start) + frame[offset_at + 8:]
        if api_key == FETCH and self._fetch_fault and self._fetch_fault[1] > 0:
            at = _fetch_partition_error_offset(frame, version)
            if at is not None:
                with self._lock:
                    self._fetch_fault[1] -= 1
                    error_code, _, log_start = self._fetch_fault
                    self.injected.append((api_key, version, error_code))
                frame = frame[:at] + struct.pack(">h", error_code) + frame[at + 2:]
                if log_start >= 0:
                    start_at = at + 2 + 8 + 8     # past the error code, high watermark, last stable offset
                    frame = frame[:start_at] + struct.pack(">q", log_start) + frame[start_at + 8:]
                return frame
        refused = self._refused.pop((id(pending), correlation), None)
        if refused is not None:
            partition, error_code = refused
            flexible = version >= FLEXIBLE_FROM[api_key]
            at = ERROR_OFFSET[api_key](frame, _skip_tagged_fields(frame, 4) if flexible else 4, version, flexible)
            with self._lock:
                self.injected.append((api_key, version, error_code))
            return frame[:at - 4] + struct.pack(">ih", partition, error_code) + frame[at + 2:]
        with self._lock:
            fault = self._faults.get(api_key)
            if fault is None or fault[1] <= 0:
                return frame
            if fault[2] > 0:
                fault[2] -= 1
                return frame
            fault[1] -= 1
            self.injected.append((api_key, version, fault[0]))
            error_code = fault[0]
        flexible = version >= FLEXIBLE_FROM[api_key]
        pos = _skip_tagged_fields(frame, 4) if flexible else 4
        at = ERROR_OFFSET[api_key](frame, pos, version, flexible)
        return frame[:at] + struct.pack(">h", error_code) + frame[at + 2:]


@contextmanager
def broker_behind(proxy: LoopProxy) -> Iterator[tuple[EmbeddedBroker, LoopProxy]]:
    """A Tansu broker advertising ``proxy``'s port (held since the proxy was made), so its
    clients all go through the proxy; the proxy started once the broker is up."""
    try:
        with EmbeddedBroker(advertised_port=proxy.port) as broker:
            proxy.upstream_port = broker.port
            with proxy:
                yield broker, proxy
    finally:
        proxy.release()


def proxied_broker() -> AbstractContextManager[tuple[EmbeddedBroker, KafkaFaultProxy]]:
    """A Tansu broker whose clients all go through a :class:`KafkaFaultProxy`
    (``broker.bootstrap_servers`` names the proxy)."""
    return broker_behind(KafkaFaultProxy(0, 0))  # type: ignore[return-value]
