"""Fixtures shared by the PySpark capture tests."""

from __future__ import annotations

import threading

import py4j.clientserver
import py4j.java_gateway
import pytest


@pytest.fixture
def py4j_calls(monkeypatch):
    """py4j commands sent from threads other than the test's own (the listener's), except
    py4j's object deletes (those also come from the job's own objects being collected)."""
    main = threading.get_ident()
    calls: list[str] = []
    for cls in (py4j.clientserver.ClientServerConnection, py4j.java_gateway.GatewayConnection):
        original = cls.send_command

        def send_command(self, command, _original=original):
            if threading.get_ident() != main and not command.startswith("m\nd\n"):
                calls.append(command)
            return _original(self, command)
        monkeypatch.setattr(cls, "send_command", send_command)
    return calls
