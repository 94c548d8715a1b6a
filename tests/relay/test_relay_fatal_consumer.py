"""A fatal error of the Kafka consumer (e.g. fenced by a replica with the same
group.instance.id) stops the relay with the reason instead of leaving it consuming nothing.
The broker used here cannot fence a consumer, so the error is handed over as librdkafka
hands it: a consumed message whose error() is fatal."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.source.kafka import SourceError
from tests.support.kafka import committed_offsets, produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


class FencedConsumer:
    """The relay's real consumer, whose next consume() reports a fatal error."""

    def __init__(self, consumer) -> None:  # noqa: ANN001
        self._consumer = consumer
        self.reported = False

    def consume(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        if not self.reported:
            self.reported = True
            return [Message(error=KafkaError(KafkaError._FENCED, "Fatal consumer error: fenced", fatal=True))]
        return self._consumer.consume(*args, **kwargs)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._consumer, name)


def test_a_fatal_consumer_error_stops_the_relay_with_the_reason_after_committing(kafka):
    topic, dlq, group = kafka.new_topic("fatal-consumer"), kafka.new_topic("dlq"), kafka.new_group()
    stream = sample_stream(20, seed=3)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        relay = RelayThread(relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=group,
                                         dlq=dlq)).start()
        try:
            assert collector.wait_for(lambda c: c.count == len(stream), 60), "the relay delivers before the error"
            assert relay.relay is not None
            source = relay.relay.source
            source._consumer = FencedConsumer(source._consumer)
            assert eventually(lambda: relay.error is not None, 30), "the relay went on after a fatal error"
        finally:
            with pytest.raises(SourceError, match="fatal error.*fenced.*group.instance.id"):
                relay.stop()
    # What was delivered before the error is committed (at the latest on the way out).
    assert committed_offsets(kafka.bootstrap_servers, topic, group, 1) == {0: len(stream)}
