"""DeadLetterWriter without a broker: which failed writes make it write a dead letter
without its value (only refusals for size), and which leave it whole."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError, KafkaException

import relay.sinks.deadletter as deadletter
from relay.metrics import RelayMetrics
from relay.sinks.deadletter import DeadLetterWriter

VALUE = b'{"eventType":"START"}'


class FailingHost:
    """A producer host whose first ``failures`` writes fail with ``code``: in the delivery
    report, or raised by produce() (``raised``)."""

    def __init__(self, code: int, failures: int, *, raised: bool = False) -> None:
        self.producer = object()
        self.code = code
        self.failures = failures
        self.raised = raised
        self.values: list[bytes | None] = []
        self.headers: list[dict[str, bytes]] = []

    def produce(self, topic, *, value, key, headers, on_delivery):  # noqa: ANN001
        self.values.append(value)
        self.headers.append(dict(headers))
        if self.failures:
            self.failures -= 1
            if self.raised:
                raise KafkaException(KafkaError(self.code))
            on_delivery(KafkaError(self.code), None)
        else:
            on_delivery(None, None)
        return True

    def delivery_failed(self, err: KafkaError) -> None:
        pass


async def _write(host: FailingHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletter, "_RESEND_DELAY_S", 0.01)
    writer = DeadLetterWriter(bootstrap_servers="127.0.0.1:9", topic="dlq", properties={}, metrics=RelayMetrics())
    writer._host = host
    writer._loop = asyncio.get_running_loop()
    done = asyncio.Event()
    writer.send(VALUE, b"k", reason="collector_rejected", detail="refused", source=None, on_done=done.set)
    await asyncio.wait_for(done.wait(), 10)
    assert writer.in_flight == 0


def test_librdkafka_codes() -> None:
    """-181 is librdkafka's TLS error, not a size refusal; an oversize record is refused
    with MSG_SIZE_TOO_LARGE (10)."""
    assert KafkaError._SSL == -181 and KafkaError.MSG_SIZE_TOO_LARGE == 10
    assert -181 not in deadletter._TOO_LARGE and KafkaError._MSG_TIMED_OUT not in deadletter._TOO_LARGE
    assert KafkaError.MSG_SIZE_TOO_LARGE in deadletter._TOO_LARGE


@pytest.mark.parametrize("code", [KafkaError._SSL, KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT],
                         ids=["ssl", "timed_out", "transport"])
async def test_failures_other_than_size_keep_the_value(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two TLS failures used to count as size refusals (-181): the dead letter was written
    without its value, and its record committed."""
    host = FailingHost(code, failures=3)
    await _write(host, monkeypatch)
    assert host.values == [VALUE] * 4
    assert all("value_omitted" not in h for h in host.headers)


@pytest.mark.parametrize("raised", [False, True], ids=["delivery_report", "produce_raised"])
async def test_two_size_refusals_omit_the_value(raised: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    host = FailingHost(KafkaError.MSG_SIZE_TOO_LARGE, failures=2, raised=raised)
    await _write(host, monkeypatch)
    assert host.values == [VALUE, VALUE, None]
    assert host.headers[-1]["value_omitted"] == str(len(VALUE)).encode()
