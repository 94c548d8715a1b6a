"""Bounded reads of a topic (relay.ops.kafka_range) against a real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from relay.embedded.broker import free_port
from relay.ops import OpsError
from relay.ops.kafka_range import PartitionRange, create_ops_topic, open_consumer, read
from tests.support.kafka import produce
from tests.support.relay import relay_config

pytestmark = pytest.mark.kafka


def test_a_partition_read_to_its_range_end_can_be_read_again_with_the_same_consumer(kafka, monkeypatch):
    """A read pauses each partition it finished; the pause outlived unassign(), so a second
    read of that partition got nothing and gave up after the stall limit (a redrive reading
    back two originals from one source partition, or a value it had read before)."""
    monkeypatch.setattr("relay.ops.kafka_range._STALL_S", 3.0)
    topic = kafka.new_topic("t")
    produce(kafka.bootstrap_servers, topic, [(None, b"v%d" % i) for i in range(5)])
    config = relay_config(kafka.bootstrap_servers, topic, {"a": "http://127.0.0.1:9"}, group=kafka.new_group(),
                          dlq="unused")
    consumer = open_consumer(config.kafka, kafka.new_group())
    try:
        for start, end in ((1, 3), (2, 4), (0, 5)):
            got = [m.value() for m in read(consumer, topic, [PartitionRange(0, start, end)])]
            assert got == [b"v%d" % i for i in range(start, end)]
    finally:
        consumer.close()


def test_a_topic_the_broker_does_not_create_in_time_fails_naming_it_and_the_fix():
    """An operations topic (redrive markers, lock) whose creation gets no answer: an OpsError
    naming its role, the topic and what to check, not a librdkafka timeout."""
    config = relay_config(f"127.0.0.1:{free_port()}", "t", {"a": "http://127.0.0.1:9"}, group="g", dlq="t.dlq")
    with pytest.raises(OpsError) as caught:
        create_ops_topic(config.kafka, "t.dlq.redriven", {"cleanup.policy": "compact"}, what="redrive marker topic",
                         how="1 partition, cleanup.policy=compact", timeout_s=1.0)
    assert str(caught.value) == ("the broker did not answer the creation of the redrive marker topic t.dlq.redriven "
                                 "within 1s; is the broker reachable?")


@pytest.mark.parametrize("code, expected", [
    (KafkaError._TIMED_OUT, "the broker did not answer the creation of the redrive lock topic t.lock within 2s; "
                            "is the broker reachable?"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, "cannot create the redrive lock topic t.lock: "),
])
def test_librdkafkas_own_timeout_is_no_answer_and_a_refusal_names_the_fix(monkeypatch, code, expected):
    """Against an unreachable broker librdkafka may end the creation itself ("Failed while
    waiting for controller: Local: Timed out") before the future's own timeout: that is no
    answer, not a refusal asking for CREATE rights (seen once in CI)."""
    def refused(*_args, **_kwargs):
        raise KafkaException(KafkaError(code, "Failed while waiting for controller"))

    monkeypatch.setattr("relay.ops.kafka_range.create_topic", refused)
    config = relay_config("127.0.0.1:9", "t", {"a": "http://127.0.0.1:9"}, group="g", dlq="t.dlq")
    with pytest.raises(OpsError) as caught:
        create_ops_topic(config.kafka, "t.lock", {}, what="redrive lock topic", how="1 partition", timeout_s=2.0)
    assert str(caught.value).startswith(expected)
    assert ("CREATE" in str(caught.value)) == (code != KafkaError._TIMED_OUT)


def test_a_partition_whose_time_lookup_failed_is_an_error_not_an_empty_range(kafka):
    """``offsets_for_times`` answers per partition: one answered with an error (leader
    moving, not authorised) comes back with offset -1, which reads as "no record at or
    after the time". Taken so, that partition would be skipped and the command say all
    done: it fails naming the partition instead."""
    from relay.ops.kafka_range import resolve

    topic = kafka.new_topic("t", partitions=2)
    produce(kafka.bootstrap_servers, topic, [(b"k%d" % i, b"v%d" % i) for i in range(6)])
    config = relay_config(kafka.bootstrap_servers, topic, {"a": "http://127.0.0.1:9"}, group=kafka.new_group(),
                          dlq="unused")
    consumer = open_consumer(config.kafka, kafka.new_group())

    class Answer:
        def __init__(self, tp, error):
            self.topic, self.partition, self.offset, self.error = tp.topic, tp.partition, -1, error

    class OneFailing:
        def __getattr__(self, name):
            return getattr(consumer, name)

        def offsets_for_times(self, tps, timeout=None):
            found = consumer.offsets_for_times(tps, timeout=timeout)
            return [Answer(tp, KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)) if tp.partition == 1 else tp
                    for tp in found]

    try:
        assert resolve(consumer, topic, from_ms=0)[1].size > 0   # the lookup itself finds records there
        with pytest.raises(OpsError) as caught:
            resolve(OneFailing(), topic, from_ms=0)
    finally:
        consumer.close()
    assert f"{topic}/1" in str(caught.value) and "by time" in str(caught.value), caught.value
