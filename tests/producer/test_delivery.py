"""Which delivery errors lose an event for good: only those about the record itself."""

from __future__ import annotations

from confluent_kafka import KafkaError

from producer.delivery import REJECT, RETRY, classify


def test_record_errors_are_rejected():
    for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_RECORD,
                 KafkaError.INVALID_MSG, KafkaError.RECORD_LIST_TOO_LARGE):
        assert classify(code) == REJECT


def test_fixable_errors_are_retried():
    # A TLS failure (-181) is an operator's to fix: the events wait in the journal meanwhile.
    assert KafkaError._SSL == -181
    for code in (KafkaError._SSL, KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION,
                 KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART,
                 KafkaError._ALL_BROKERS_DOWN):
        assert classify(code) == RETRY
