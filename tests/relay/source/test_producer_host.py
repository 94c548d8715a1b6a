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

import relay.source.producer as producer_module
from relay.embedded.broker import EmbeddedBroker, free_port
from relay.metrics import RelayMetrics
from relay.sinks.deadletter import DeadLetterWriter
from relay.source.producer import ProducerHost
from tests.support.kafka import process_state, read_to_end, read_topic, unread_request_bytes
from tests.support.kafka_proxy import (
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    PRODUCE,
    UNKNOWN_PRODUCER_ID,
    proxied_broker,
)
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


class FailsFirst:
    """Stands in for ``Producer``: the first new producer cannot be made (e.g. out of
    memory), the next ones can. ``made`` holds the configurations asked for."""

    def __init__(self) -> None:
        self.made: list[object] = []

    def __call__(self, conf):  # noqa: ANN001, ANN204
        self.made.append(conf)
        if len(self.made) == 1:
            raise KafkaException(KafkaError(KafkaError._FAIL, "injected"))
        return Producer(conf)


def test_a_fatal_error_replaces_the_producer_and_writes_go_on(caplog):
    """A real fatal error: the broker answers a produce request with an out-of-order
    sequence number, which librdkafka's idempotent producer cannot repair (confluent-kafka
    then raises it from poll(), not through error_cb)."""
    with proxied_broker() as (broker, proxy):
        broker.create_topic("host", 1)
        host = ProducerHost({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5}, "test-producer")
        host.start()
        try:
            writer = Writer(host, "host")
            writer.write(b"before")
            assert eventually(lambda: writer.acked == [b"before"], 15), "the first write acknowledged"
            first = host.producer
            proxy.answer_with_error(PRODUCE, OUT_OF_ORDER_SEQUENCE_NUMBER)
            with caplog.at_level(logging.WARNING, logger="relay.source.producer"):
                writer.write(b"refused")
                assert eventually(lambda: host.replaced == 1, 20), "the producer replaced"
            assert proxy.injected == [(PRODUCE, proxy.injected[0][1], OUT_OF_ORDER_SEQUENCE_NUMBER)]
            assert host.producer is not first and writer.failures == 1
            fatal = [r.fields for r in caplog.records if r.getMessage() == "kafka_producer_fatal"]
            assert len(fatal) == 1 and "OUT_OF_ORDER_SEQUENCE_NUMBER" in fatal[0]["error"]
            writer.retry_failed()
            writer.write(b"after")
            assert eventually(lambda: writer.acked == [b"before", b"refused", b"after"], 15), \
                "writes through the new producer"
        finally:
            host.close(5)
        # The broker wrote the record whose answer the proxy turned into an error: the retry
        # writes it again (at least once, as for any lost answer).
        records = read_to_end(broker.bootstrap_servers, "host")
        assert [r.value for r in records] == [b"before", b"refused", b"refused", b"after"]


def test_a_replacement_that_fails_is_tried_again(kafka, monkeypatch):
    """The new producer cannot be made at first (e.g. out of memory): the poll thread logs
    it, keeps serving the old producer's reports, and tries again."""
    topic = kafka.new_topic("host-retry")
    host = ProducerHost({"bootstrap.servers": kafka.bootstrap_servers}, "test-producer")
    host.start()
    try:
        flaky = FailsFirst()
        made = flaky.made
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
        records = read_to_end(broker.bootstrap_servers, "wire")
        assert sorted(int(r.value) for r in records) == list(range(51)), "each record written once"
    finally:
        broker.stop()


async def _until(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)  # ok: the poll interval of a wait with a deadline


class DeadLetters:
    """A started DeadLetterWriter to topic ``dlq`` (one partition) of ``broker``; ``done``
    lists the reasons of the dead letters acknowledged, in order."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        broker.create_topic("dlq", 1)
        self.metrics = RelayMetrics()
        self.writer = DeadLetterWriter(bootstrap_servers=broker.bootstrap_servers, topic="dlq", properties={},
                                       metrics=self.metrics)
        self.done: list[str] = []

    @classmethod
    async def started(cls, broker: EmbeddedBroker) -> DeadLetters:
        dead = cls(broker)
        await dead.writer.start()
        return dead

    def send(self, value: bytes, reason: str) -> None:
        self.writer.send(value, b"run:ns/job", reason=reason, detail="d", source=None,
                         on_done=lambda: self.done.append(reason))


async def test_the_dead_letter_writer_goes_on_after_a_fatal_error_and_counts_it(monkeypatch):
    """The broker's answer makes the dead-letter producer fatal. Its first replacement
    fails, so for a second produce() itself raises: the dead letter sent meanwhile is
    retried, as is the one whose answer was an error, and each is acknowledged once."""
    flaky = FailsFirst()
    made = flaky.made
    with proxied_broker() as (broker, proxy):
        dead = await DeadLetters.started(broker)
        writer, metrics, done, send = dead.writer, dead.metrics, dead.done, dead.send
        replaced = ("lineage_relay_kafka_producers_replaced_total", {"producer": "dead_letter"})
        assert metrics.registry.get_sample_value(*replaced) == 0
        try:
            send(b"first", "invalid_json")
            await _until(lambda: done == ["invalid_json"], 15, "the first dead letter acknowledged")
            monkeypatch.setattr(producer_module, "Producer", flaky)
            proxy.answer_with_error(PRODUCE, OUT_OF_ORDER_SEQUENCE_NUMBER)
            send(b"refused", "too_large")
            await _until(lambda: len(made) == 1, 20, "the fatal error noticed and a replacement tried")
            fatal = writer._host.producer
            assert fatal is not None
            with pytest.raises(KafkaException):
                fatal.produce("dlq", b"probe")          # what the writer meets now
            send(b"meanwhile", "missing_field")
            await _until(lambda: sorted(done) == ["invalid_json", "missing_field", "too_large"], 20,
                         "both dead letters acknowledged after the replacement")
        finally:
            await writer.close()
        assert metrics.registry.get_sample_value(*replaced) == 1
        # The broker had written the dead letter whose answer was turned into an error.
        records = read_to_end(broker.bootstrap_servers, "dlq")
        assert sorted((r.value, r.headers["reason"]) for r in records) == [
            (b"first", b"invalid_json"), (b"meanwhile", b"missing_field"),
            (b"refused", b"too_large"), (b"refused", b"too_large")]


@pytest.mark.parametrize("error_code", [INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID],
                         ids=["invalid_producer_epoch", "unknown_producer_id"])
async def test_an_answer_that_spoils_the_producer_id_replaces_the_dead_letter_producer(error_code):
    """These answers only fail the delivery; librdkafka bumps the epoch on its own and a
    broker without that bump (Tansu) refuses the producer from then on. The writer's retry
    would fail for good: the host replaces the producer, and the dead letter is written."""
    with proxied_broker() as (broker, proxy):
        dead = await DeadLetters.started(broker)
        writer, metrics, done, send = dead.writer, dead.metrics, dead.done, dead.send
        try:
            send(b"first", "invalid_json")
            await _until(lambda: done == ["invalid_json"], 15, "the first dead letter acknowledged")
            proxy.answer_with_error(PRODUCE, error_code)
            send(b"refused", "too_large")
            await _until(lambda: done == ["invalid_json", "too_large"], 30, "the refused dead letter written")
        finally:
            await writer.close()
        assert writer._host.replaced == 1
        assert metrics.registry.get_sample_value("lineage_relay_kafka_producers_replaced_total",
                                                 {"producer": "dead_letter"}) == 1
        records = read_to_end(broker.bootstrap_servers, "dlq")
        assert [r.value for r in records][:1] == [b"first"] and {r.value for r in records} == {b"first", b"refused"}


class SlowToMake:
    """Stands in for ``Producer``: making the replacement waits until ``go`` is set
    (``making`` tells it began), as a busy machine can make it slow."""

    def __init__(self) -> None:
        self.making, self.go = threading.Event(), threading.Event()

    def __call__(self, conf):  # noqa: ANN001, ANN204
        self.making.set()
        assert self.go.wait(30)
        return Producer(conf)


async def test_a_dead_letter_sent_while_the_replacement_is_made_is_acknowledged(kafka, monkeypatch):
    """A delivery error that spoils the producer id (not fatal to librdkafka) makes the host
    replace the producer; the old one still takes records. One sent after the old one's
    purge, before the new one took over, used to stay on the old producer, which nobody polls
    any more: its report never came, and the dead letter (its offset) waited for ever."""
    topic = kafka.new_topic("dlq-swap")
    metrics = RelayMetrics()
    writer = DeadLetterWriter(bootstrap_servers=kafka.bootstrap_servers, topic=topic, properties={}, metrics=metrics)
    await writer.start()
    done: list[str] = []
    slow = SlowToMake()
    try:
        monkeypatch.setattr(producer_module, "Producer", slow)
        writer._host.delivery_failed(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "injected"))
        assert await asyncio.get_running_loop().run_in_executor(None, slow.making.wait, 10)
        writer.send(b"meanwhile", b"run:ns/job", reason="invalid_json", detail="d", source=None,
                    on_done=lambda: done.append("meanwhile"))
        slow.go.set()
        await _until(lambda: done == ["meanwhile"], 20, "the dead letter acknowledged")
    finally:
        slow.go.set()
        await writer.close()
    assert [r.value for r in read_topic(kafka.bootstrap_servers, topic, expected=1, timeout_s=30)] == [b"meanwhile"]
