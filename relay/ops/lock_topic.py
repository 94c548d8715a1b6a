"""The topic of a redrive lock (:mod:`relay.ops.redrive_lock`): created when missing, checked
when it exists.

The lock needs a log that keeps every record in order: one partition, ``cleanup.policy``
``delete`` (compaction would leave only the last record of its one key, so a claim could
vanish while its holder runs). :func:`ensure_lock_topic` creates the topic so (kept for
ever: ``retention.ms``/``retention.bytes`` -1) and refuses one that exists otherwise,
naming the fix, as one whose ``retention.ms`` or ``retention.bytes`` is not -1 (a log cut
under a holder could lose its claim). A setting the broker does not report (Tansu reports
only those set explicitly) is taken as fine.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from relay.config import KafkaConfig
from relay.kafka_log import with_log
from relay.ops import OpsError, kafka_error_text
from relay.ops.kafka_range import UNREACHABLE_HINT, create_ops_topic
from relay.source.admin import connection_properties

#: How the lock topic is created, and what an existing one must have.
SETTINGS = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
_SHAPE = "1 partition, cleanup.policy=delete, retention.ms=-1, retention.bytes=-1"
_REQUEST_S = 15.0


def ensure_lock_topic(kafka: KafkaConfig, topic: str) -> None:
    """Create ``topic`` when it does not exist; raise :class:`~relay.ops.OpsError` naming
    the fix when the broker does not answer, the creation is refused, or an existing topic
    has more than one partition, another ``cleanup.policy`` or a retention other than -1."""
    conn = connection_properties(kafka.producer_properties)
    admin = AdminClient(with_log({**conn, "bootstrap.servers": kafka.bootstrap_servers}))
    try:
        partitions = _partitions(admin, topic)
        if partitions is None:
            create_ops_topic(kafka, topic, SETTINGS, what="redrive lock topic", how=_SHAPE, timeout_s=_REQUEST_S)
            return
        configs = _configs(admin, topic)
    except KafkaException as err:
        raise OpsError(f"cannot inspect the redrive lock topic {topic}: {kafka_error_text(err)}; {UNREACHABLE_HINT} "
                       f"(the relay's credentials need DESCRIBE and DESCRIBE_CONFIGS on it)") from err
    except concurrent.futures.TimeoutError as err:
        raise OpsError(f"the broker did not describe {topic} within {_REQUEST_S:g}s; {UNREACHABLE_HINT}") from err
    finally:
        del admin  # a raised error's traceback holds this frame: the client would live on
    wrong = [f"{partitions} partitions"] if partitions != 1 else []
    wrong += [f"{key}={value}" for key, value in configs.items() if value != SETTINGS[key]]
    if wrong:
        raise OpsError(f"the redrive lock topic {topic} has {' and '.join(wrong)}: the lock needs one ordered log "
                       f"that keeps its records. Once no redrive runs, delete the topic (the next redrive creates "
                       f"it as it should be) or create it again yourself ({_SHAPE})")


def _partitions(admin: Any, topic: str) -> int | None:
    """Its partition count, None when it does not exist (the whole listing: asking for one
    topic may auto-create it)."""
    metadata = admin.list_topics(timeout=_REQUEST_S).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return len(metadata.partitions)


def _configs(admin: Any, topic: str) -> dict[str, str]:
    """Its values of the :data:`SETTINGS` keys the broker reports (one it does not report
    is left out: Tansu reports only those set explicitly)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    future = admin.describe_configs([resource], request_timeout=_REQUEST_S)[resource]
    entries = future.result(timeout=_REQUEST_S)
    return {key: str(entries[key].value) for key in SETTINGS
            if key in entries and entries[key].value is not None}


