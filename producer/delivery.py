"""What to do with a message Kafka did not take: a pure decision, no I/O.

``classify(code)`` returns :data:`RETRY` (keep the event: journal it and send it again
later) or :data:`REJECT` (the broker will never accept this record as it is: count it
under ``dropped["rejected_by_broker"]`` and log it). Only errors that are a property of
the record itself are REJECT; everything else, including authorization and unknown-topic
errors an operator can fix, is RETRY, because losing lineage is worse than waiting.
"""

from __future__ import annotations

from typing import Literal

from confluent_kafka import KafkaError

RETRY: Literal["retry"] = "retry"
REJECT: Literal["reject"] = "reject"

# librdkafka reports a record over its own message.max.bytes with the broker's code
# MSG_SIZE_TOO_LARGE (10); INVALID_MSG (2) is the broker's CORRUPT_MESSAGE. (-181 is _SSL:
# a TLS failure an operator can fix, so RETRY like every other local error.)
_PERMANENT = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError.RECORD_LIST_TOO_LARGE,
})


# Answers after which the idempotent producer instance cannot go on writing. librdkafka
# reports them as failed deliveries (not as a fatal error) and bumps the producer epoch on
# its own; a broker without that bump (KIP-360; Tansu is one) then refuses the instance for
# good. A new instance gets a new producer id.
_POISON = frozenset({
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.PRODUCER_FENCED,
})


# The broker's refusals of a record batch for its size (the topic's max.message.bytes).
# They fail every record of the batch, each of which may fit on its own: librdkafka does
# not split a batch, so the sender retries with smaller batches (see DeliveryReports._on_delivery).
_BATCH_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


# What produce() raises for a record librdkafka will never take as it is (its size over
# message.max.bytes; INVALID_ARG: a length librdkafka cannot carry). Raised before the
# record is queued, so no batch is involved: it is the record's own, for good.
_REFUSED_FOR_GOOD = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._INVALID_ARG})


def refused_for_good(code: int) -> bool:
    """Whether produce() refused a record for what it is (not for now: a full queue, a fatal error)."""
    return code in _REFUSED_FOR_GOOD


def batch_too_large(code: int) -> bool:
    """Whether the broker refused the record's batch for its size."""
    return code in _BATCH_TOO_LARGE


def poisons_instance(code: int) -> bool:
    """Whether a delivery error means the producer instance must be replaced."""
    return code in _POISON


def classify(code: int) -> Literal["retry", "reject"]:
    """RETRY or REJECT for a librdkafka delivery error code."""
    return REJECT if code in _PERMANENT else RETRY
