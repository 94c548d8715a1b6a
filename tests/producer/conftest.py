"""Fixtures of the producer tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from relay.embedded.broker import EmbeddedBroker, free_port


def _reserved_port() -> int:
    """A free port below the kernel's ephemeral range. The broker is started on it seconds
    after it was chosen (an outage first): a port from the ephemeral range (``free_port``)
    could meanwhile be taken by a listener another test binds to port 0, and the broker's
    start then finds that listener instead of Tansu (a create_topic to it timed out in CI).
    Nothing binding to port 0 gets a port below the range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


@pytest.fixture
def broker():
    """A broker of this test's own on a fixed port, not started yet (an outage until the
    test starts it; stopped again at the end)."""
    b = EmbeddedBroker(port=_reserved_port())
    yield b
    b.stop()
