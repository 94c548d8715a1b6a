"""A broker refusing a record batch as too large (a topic whose max.message.bytes is under
the producer's batch.size): librdkafka fails every record of the batch, and does not split
it. The producer keeps those records, halves batch.size and sends them again; only a record
refused while it was alone in its batch is dropped (counted under rejected_by_broker).

The broker's refusals come from a fault proxy: it keeps the request from being written and
answers MESSAGE_TOO_LARGE, as Kafka does."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest

from producer import LineageProducer, events
from tests.producer.support import FAST_RECONNECT, assert_all_arrived_in_order, seq_event
from tests.support.kafka import read_topic
from tests.support.kafka_proxy import MESSAGE_TOO_LARGE, proxied_broker

pytestmark = pytest.mark.kafka
#: One batch for the events emitted together.
BATCHING = {**FAST_RECONNECT, "linger.ms": "200"}


@contextmanager
def connected_producer(broker, topic: str, journal_dir, properties: dict[str, str]):  # noqa: ANN001, ANN201
    """A producer to a new one-partition ``topic`` that delivered event 0 (connected, with
    its producer id)."""
    broker.create_topic(topic, 1)
    with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=journal_dir,
                         properties=properties) as p:
        p.emit(seq_event(0))
        assert p.flush(15) == 0
        yield p


def test_a_batch_refused_as_too_large_is_sent_again_in_smaller_batches(tmp_path, caplog):
    with proxied_broker() as (broker, proxy):
        with connected_producer(broker, "batches", tmp_path, BATCHING) as p:
            proxy.refuse_produce(MESSAGE_TOO_LARGE)
            with caplog.at_level(logging.WARNING, logger="producer"):
                for i in range(1, 61):
                    p.emit(seq_event(i))
                assert p.flush(30) == 0, p.stats
            assert [code for _, _, code in proxy.injected] == [MESSAGE_TOO_LARGE]
            assert p.stats.dropped == {} and p.stats.delivery_failures > 1, p.stats
        assert any("event=batch_size_reduced" in r.getMessage() and "batch_size=500000" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        records = read_topic(broker.bootstrap_servers, "batches", expected=62, timeout_s=3)
    assert len(records) == 61, "each event written once: the refused batch was not written"
    assert_all_arrived_in_order(records, range(61))


def test_a_record_refused_while_alone_in_its_batch_is_dropped_and_counted(tmp_path):
    """600 KB, under the default batch.size (1 MB): refused once, it may have shared its
    batch, so it is kept and sent again with batch.size 500 KB, now alone. Refused again,
    it is itself too large: dropped, counted; the events after it are delivered."""
    big = events.run_event("START", run_id=events.new_run_id(), job_namespace="tests", job_name="big",
                           run_facets={"blob": events.custom_facet({"x": "y" * 600_000},
                                                                   schema_url="https://example.com/blob.json")})
    with proxied_broker() as (broker, proxy):
        with connected_producer(broker, "alone", tmp_path, FAST_RECONNECT) as p:
            proxy.refuse_produce(MESSAGE_TOO_LARGE, times=2)
            p.emit(big)
            assert p.flush(30) == 0, p.stats
            for i in range(1, 31):
                p.emit(seq_event(i))
            assert p.flush(30) == 0, p.stats
            assert [code for _, _, code in proxy.injected] == [MESSAGE_TOO_LARGE] * 2
            assert p.stats.dropped == {"rejected_by_broker": 1}, p.stats
        records = read_topic(broker.bootstrap_servers, "alone", expected=32, timeout_s=3)
    assert len(records) == 31
    assert_all_arrived_in_order(records, range(31))


def _key_heavy_event(producer: LineageProducer) -> dict:
    """An event whose value alone is under message.max.bytes less 512, and whose key (its job's
    600-byte name) takes the record past message.max.bytes: librdkafka's produce() refuses it."""
    name = "j" * 600

    def event(pad: int) -> dict:
        return events.run_event("RUNNING", run_id=events.new_run_id(), job_namespace="tests", job_name=name,
                                run_facets={"big": events.custom_facet({"pad": "x" * pad},
                                                                       schema_url="https://example.com/b.json")})
    limit = int(producer.config.kafka_properties()["message.max.bytes"]) - 512
    return event(limit - len(producer._encode(event(0))) - 10)


@pytest.mark.parametrize("checked_by", ["emit", "librdkafka"])
def test_a_record_whose_key_and_value_pass_message_max_bytes_is_dropped_and_sending_goes_on(broker, tmp_path,
                                                                                             caplog, checked_by):
    """Key and value together over message.max.bytes, the value alone under it: emit()'s own
    size check drops it as too_large (``emit``); past that check (``librdkafka``: the check
    left out), produce() refuses it for good -- dropped too, not journaled, where every replay
    would be refused again. Either way the producer stays in direct mode and the events
    around it are delivered, in order."""
    broker.start()
    broker.create_topic("keyheavy", 1)
    properties = {**FAST_RECONNECT, "message.max.bytes": "100000"}
    with LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic="keyheavy", journal_dir=tmp_path,
                         properties=properties, close_timeout_s=2) as p:
        if checked_by == "librdkafka":
            p._max_record = 1 << 30
        for i in range(3):
            p.emit(seq_event(i))
        assert p.flush(15) == 0, p.stats
        with caplog.at_level(logging.ERROR, logger="producer"):
            p.emit(_key_heavy_event(p))
        for i in range(3, 6):
            p.emit(seq_event(i))
        assert p.flush(15) == 0, p.stats
        assert p.stats.dropped == {"too_large": 1} and p.stats.mode == "direct" and p.stats.journaled == 0, p.stats
    lines = [r.getMessage() for r in caplog.records if "reason=too_large" in r.getMessage()]
    assert len(lines) == 1, lines
    assert ("librdkafka refused the record" if checked_by == "librdkafka" else "(key 6") in lines[0], lines[0]
    records = read_topic(broker.bootstrap_servers, "keyheavy", expected=7, timeout_s=3)
    assert len(records) == 6
    assert_all_arrived_in_order(records, range(6))
