"""Kafka administration the relay needs: creating its dead-letter and run-state topics."""

from __future__ import annotations

from relay.kafka_log import with_log

_CONNECTION_KEYS = ("security.", "sasl.", "ssl.", "client.")


def connection_properties(properties: dict[str, str]) -> dict[str, str]:
    """The connection settings (security, SASL, SSL, client id) among client ``properties``:
    what an admin client or a helper consumer needs to reach the same cluster."""
    return {k: v for k, v in properties.items() if k.startswith(_CONNECTION_KEYS)}


def create_topic(bootstrap_servers: str, name: str, partitions: int = 1,
                 config: dict[str, str] | None = None, timeout_s: float = 15.0,
                 client_properties: dict[str, str] | None = None, replication_factor: int | None = None) -> None:
    """Create a topic (idempotent: an existing topic is fine). ``client_properties``
    carries the connection settings (security.protocol, sasl.*, ssl.*) the cluster needs.
    ``replication_factor`` None: the cluster's ``default.replication.factor`` (a fixed 1
    made single-copy topics that ``acks=all`` writes cannot reach on clusters whose
    ``min.insync.replicas`` is 2)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(with_log({**(client_properties or {}), "bootstrap.servers": bootstrap_servers}))
    future = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor or -1,
                  config=config or {})],
        operation_timeout=timeout_s, request_timeout=timeout_s,
    )[name]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    finally:
        # A failed future keeps its exception, whose traceback holds this frame: the client
        # (its threads, its connection) lived on until the next cyclic collection, which a
        # relay process runs rarely (relay.process.tune_gc).
        del future, admin
