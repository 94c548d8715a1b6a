"""A dead-letter topic that refuses a dead letter as too large (created with a smaller
max.message.bytes than the records it must hold): the relay tries it once more as it is,
then writes it without its value, with the original size and where the original is, and
goes on committing instead of retrying it for ever."""

from __future__ import annotations

import orjson
import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import committed_offsets, produce, read_to_end
from tests.support.kafka_proxy import MESSAGE_TOO_LARGE, proxied_broker
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("refusals", [1, 2], ids=["refused_once", "refused_for_good"])
def test_a_dead_letter_the_topic_refuses_as_too_large(refusals):
    """Refused once (it only shared a batch with a bigger record): the retry writes it
    whole. Refused twice: written without its value."""
    with proxied_broker() as (broker, proxy), RecordingCollector() as collector:
        broker.create_topic("events", 1)
        stream = sample_stream(10, seed=11)
        victim = orjson.loads(stream[4][1])
        collector.reject_when(lambda doc: 400 if doc == victim else None)
        produce(broker.bootstrap_servers, "events", stream)
        proxy.refuse_produce(MESSAGE_TOO_LARGE, times=refusals)
        with RelayThread(relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g",
                                      dlq="dlq")) as relay:
            assert collector.wait_for(lambda c: c.count == len(stream) - 1, 30)
            assert eventually(lambda: committed(broker) == len(stream), 30), "the relay committed past it"
            omitted = relay.metric("lineage_relay_dead_letter_values_omitted_total", reason="collector_rejected")
            assert relay.metric("lineage_relay_events_dead_lettered_total", reason="collector_rejected") == 1
        assert [code for _, _, code in proxy.injected] == [MESSAGE_TOO_LARGE] * refusals
        [dead] = read_to_end(broker.bootstrap_servers, "dlq")
        assert dead.key == stream[4][0]
        assert dead.headers["reason"] == b"collector_rejected" and dead.headers["source"] == b"events/0/4"
        if refusals == 1:
            assert dead.value == stream[4][1] and "value_omitted" not in dead.headers
            assert omitted == 0
        else:
            assert dead.value is None
            assert dead.headers["value_omitted"] == str(len(stream[4][1])).encode()
            assert omitted == 1


def committed(broker) -> int:  # noqa: ANN001
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", 1).values())
