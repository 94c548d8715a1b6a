"""ProducerHost against a real broker: a fatal librdkafka error replaces the producer, and
requests already on the wire are answered before anything is retried."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from relay.embedded.broker import EmbeddedBroker, free_port
from relay.metrics import RelayMetrics
from relay.sinks.deadletter import DeadLetterWriter
import relay.source.producer as producer_module
from relay.source.producer import ProducerHost
from tests.support.kafka import process_state, read_topic, unread_request_bytes
from tests.support.relay import eventually

pytestmark = pytest.mark.kafka
FATAL = KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "injected", fatal=True)


class Writer:
    """What the relay's writers do: a failed record is produced again (here at once,
    through whatever producer the host has by then)."""

    def __init__(self, host: ProducerHost, topic: str) -> None:
        self.host, self.topic = host, topic
        self.acked: list[bytes] = []
        self.failures = 0
        self._lock = threading.Lock()
        self._retry: list[bytes] = []

    def write(self, value: bytes) -> None:
        producer = self.host.producer
        assert producer is not None
        producer.produce(self.topic, value, on_delivery=self._delivered)

    def _delivered(self, err, msg) -> None:  # noqa: ANN001
        with self._lock:
            if err is None:
                self.acked.append(msg.value())
            else:
                self.failures += 1
                self._retry.append(msg.value())

    def retry_failed(self) -> None:
        with self._lock:
            values, self._retry = self._retry, []
        for value in values:
            self.write(value)


def test_a_fatal_error_replaces_the_producer_and_writes_go_on(kafka, caplog):
    topic = kafka.new_topic("host")
    host = ProducerHost({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5}, "test-producer")
    host.start()
    try:
        writer = Writer(host, topic)
        writer.write(b"before")
        assert eventually(lambda: writer.acked == [b"before"], 15), "the first write acknowledged"
        first = host.producer
        with caplog.at_level(logging.WARNING, logger="relay.source.producer"):
            host._on_error(FATAL)                      # as librdkafka reports it, inside poll
            assert eventually(lambda: host.replaced == 1, 20), "the producer replaced"
        assert host.producer is not first
        assert [r.getMessage() for r in caplog.records if "kafka_producer" in r.getMessage()] != []
        writer.write(b"after")
        assert eventually(lambda: writer.acked == [b"before", b"after"], 15), "a write through the new producer"
    finally:
        host.close(5)
    assert [r.value for r in read_topic(kafka.bootstrap_servers, topic, expected=2)] == [b"before", b"after"]


def test_a_replacement_that_fails_is_tried_again(kafka, monkeypatch):
    """The new producer cannot be made at first (e.g. out of memory): the poll thread logs
    it, keeps serving the old producer's reports, and tries again."""
    topic = kafka.new_topic("host-retry")
    host = ProducerHost({"bootstrap.servers": kafka.bootstrap_servers}, "test-producer")
    host.start()
    try:
        made: list[object] = []

        def flaky(conf):  # noqa: ANN001, ANN202
            made.append(conf)
            if len(made) == 1:
                raise KafkaException(KafkaError(KafkaError._FAIL, "injected"))
            return Producer(conf)

        monkeypatch.setattr(producer_module, "Producer", flaky)
        host._on_error(FATAL)
        assert eventually(lambda: host.replaced == 1, 20), "the producer replaced at the second try"
        assert len(made) == 2
        writer = Writer(host, topic)
        writer.write(b"after")
        assert eventually(lambda: writer.acked == [b"after"], 15), "a write through the new producer"
    finally:
        host.close(5)


def test_requests_on_the_wire_are_answered_before_the_retry(tmp_path):
    """The broker is stopped with one request on the wire and more records queued behind
    it, and wakes up while the host waits for that request's answer. The queued records
    fail and are retried through the new producer; the one on the wire succeeds and is not
    retried, so nothing is written twice."""
    broker = EmbeddedBroker(port=free_port())
    broker.start()
    try:
        broker.create_topic("wire", 1)
        host = ProducerHost({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                             "acks": "all", "max.in.flight.requests.per.connection": 1,
                             "batch.num.messages": 10}, "test-producer")
        host.start()
        try:
            writer = Writer(host, "wire")
            writer.write(b"0")
            assert eventually(lambda: writer.acked == [b"0"], 15), "the first write acknowledged"
            os.kill(broker._proc.pid, signal.SIGSTOP)
            assert eventually(lambda: process_state(broker._proc.pid) == "T", 10), "the broker stopped"
            for i in range(1, 51):
                writer.write(str(i).encode())
            assert eventually(lambda: unread_request_bytes(broker.port) > 0, 10), "a request on the wire"
            host._on_error(FATAL)
            assert eventually(lambda: writer.failures >= 40, 10), "the queued records failed"
            os.kill(broker._proc.pid, signal.SIGCONT)
            assert eventually(lambda: host.replaced == 1, 20), "the producer replaced"
            assert writer.failures <= 49, "the record on the wire was answered, not failed"
            writer.retry_failed()
            assert eventually(lambda: len(writer.acked) == 51, 20), "every record acknowledged once"
        finally:
            host.close(5)
        records = read_topic(broker.bootstrap_servers, "wire", expected=61, timeout_s=3)
        assert sorted(int(r.value) for r in records) == list(range(51)), "each record written once"
    finally:
        broker.stop()


async def _until(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)  # ok: the poll interval of a wait with a deadline


async def test_the_dead_letter_writer_goes_on_after_a_fatal_error_and_counts_it(kafka):
    topic = kafka.new_topic("dlq-fatal")
    metrics = RelayMetrics()
    writer = DeadLetterWriter(bootstrap_servers=kafka.bootstrap_servers, topic=topic, properties={}, metrics=metrics)
    await writer.start()
    replaced = ("lineage_relay_kafka_producers_replaced_total", {"producer": "dead_letter"})
    assert metrics.registry.get_sample_value(*replaced) == 0
    try:
        writer._host._on_error(FATAL)
        await _until(lambda: writer._host.replaced == 1, 20, "the producer replaced")
        done: list[int] = []
        writer.send(b"not json", b"run:ns/job", reason="invalid_json", detail="Expecting value", source=None,
                    on_done=lambda: done.append(1))
        await _until(lambda: done == [1], 15, "the dead letter acknowledged")
    finally:
        await writer.close()
    assert metrics.registry.get_sample_value(*replaced) == 1
    [record] = read_topic(kafka.bootstrap_servers, topic, expected=1)
    assert record.value == b"not json" and record.headers["reason"] == b"invalid_json"
