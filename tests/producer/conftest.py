"""Fixtures of the producer tests."""

from __future__ import annotations

import pytest

from relay.embedded.broker import EmbeddedBroker, free_port


@pytest.fixture
def broker():
    """A broker of this test's own on a fixed port, not started yet (an outage until the
    test starts it; stopped again at the end)."""
    b = EmbeddedBroker(port=free_port())
    yield b
    b.stop()
