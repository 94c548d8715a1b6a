"""EmbeddedBroker.start() returns only once its own Tansu answers on its port: a port some
other process listens on is never taken for the broker."""

from __future__ import annotations

import socket

import pytest

import relay.embedded.broker as broker_module
from relay.embedded.broker import BrokerUnavailable, EmbeddedBroker
from relay.source.admin import create_topic


@pytest.fixture
def squatter():
    """Another process's listener on a loopback port (it accepts, never answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_taken_after_it_was_chosen_is_given_up_for_another(squatter, monkeypatch):
    ports = iter([squatter])
    real_free_port = broker_module.free_port
    monkeypatch.setattr(broker_module, "free_port", lambda: next(ports, None) or real_free_port())
    with EmbeddedBroker() as broker:
        assert broker.port != squatter and broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        assert broker.running
        create_topic(broker.bootstrap_servers, "t", 1)  # it is a broker, and ours


def test_a_port_given_and_taken_is_a_clear_error(squatter):
    broker = EmbeddedBroker(port=squatter)
    with pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{squatter} is taken by another process"):
        broker.start()
    assert not broker.running


def test_another_tansu_on_the_port_is_not_taken_for_ours():
    with EmbeddedBroker() as other:
        broker = EmbeddedBroker(port=other.port)
        with pytest.raises(BrokerUnavailable, match="is taken by another process"):
            broker.start()
        assert other.running
