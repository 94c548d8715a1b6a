"""openlineage-python transport plugin: ``OpenLineageClient`` emits through ``LineageProducer``.

Name the class by its dotted path as the transport ``type``; every integration built on
``OpenLineageClient`` (Airflow provider, dbt-ol, hand-written clients) then gets the
producer's non-blocking, journaled delivery. A complete ``openlineage.yml``::

    transport:
      type: producer.openlineage_transport.LineageRelayTransport
      topicName: openlineage              # "topic" (openlineage-python's name) works too
      encoding: json                      # or avro (single-object encoding)
      # messageKey: fixed-key             # default: the official per-event keys
      # journalDir: /var/spool/lineage    # default: ~/.cache/lineage-relay/journal/<topic>
      # journalMaxBytes: 268435456
      # journalAdoptIntervalS: 10         # how often a dead process's journal is looked for
      # queueMaxEvents: 100000
      # closeTimeoutS: 10                 # also the bound of each emit's flush (below)
      # flush: true                       # default, as the official Kafka transport
      properties:                         # librdkafka producer properties ("config" works too)
        bootstrap.servers: kafka-1:9092,kafka-2:9092
        # security.protocol: SASL_SSL

Environment variables work too; the client, not the producer, reads them, and hands the
transport their keys in lower case:
``OPENLINEAGE__TRANSPORT__TYPE=producer.openlineage_transport.LineageRelayTransport``,
``OPENLINEAGE__TRANSPORT__TOPIC=openlineage``, ``OPENLINEAGE__TRANSPORT__BOOTSTRAP_SERVERS=kafka-1:9092``,
``OPENLINEAGE__TRANSPORT__PROPERTIES__SECURITY_PROTOCOL=SASL_SSL`` (it arrives as
``security_protocol`` and is read as ``security.protocol``, like every librdkafka name written
with ``_`` for ``.``), or a whole mapping as JSON,
``OPENLINEAGE__TRANSPORT__PROPERTIES='{"bootstrap.servers": "kafka-1:9092"}'``. An unknown key
written in openlineage.yml (or the client's ``config=``) raises
:class:`producer.errors.ConfigError` when the client is built; keys the client merges in from
``OPENLINEAGE__TRANSPORT__*`` variables meant for other transports (``OPENLINEAGE_URL``
becomes ``OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__*``) are logged once and
skipped, as the official Kafka transport drops keys it does not know. While
``OPENLINEAGE_DISABLED=true`` the client builds no transport at all.
``emit`` converts the client's event object to a dict (``Serde.to_dict``, as the official
transports do before serialising) and never raises. With ``flush: true`` (the default, as
the official Kafka transport's), each ``emit`` then waits until Kafka acknowledged the event,
for at most ``closeTimeoutS``, and what is still not acknowledged then is in the journal when
``emit`` returns: Airflow's listener emits in a forked child that ends with ``os._exit(0)``,
which runs no exit handler. That wait is :meth:`producer.LineageProducer.settle`: while
Kafka is reported down it takes what librdkafka holds back into the journal (without
closing anything), and ends as soon as every event is acknowledged or on disk, not at the
bound. One producer (``transport.producer``) serves every emit: during an outage its one
journal (capped by ``journalMaxBytes``) grows, it resends it once Kafka is back, and its
``stats`` count every drop; a process ended by ``os._exit`` leaves the journal to the next
producer on the journal directory (:mod:`producer.orphans`). An event Kafka is merely slow
to acknowledge (not reported down) when the bound passes is logged (``flush_incomplete``):
it is still sent or journaled, unless the process ends without exit handlers. With ``flush: false``
``emit`` never waits: delivery is left to the producer's background thread, and to
``close()`` or the exit handlers. ``close(timeout)`` flushes, then journals what is left.

Needs ``openlineage-python`` (``pip install 'lineage-relay[openlineage]'``); the rest of
the producer does not.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from producer.config import ProducerConfig, build_config
from producer.errors import ConfigError, MissingDependency
from producer.kafka import LineageProducer
from producer.readers import drop_blank_env_properties, env_foreign_keys, numbers_as_written
from producer.sources import local_server_id_as_message_key, transport_layer

try:
    import attr
    from openlineage.client.serde import Serde
    from openlineage.client.transport.transport import Config, Transport
except ImportError as err:
    raise MissingDependency(
        "producer.openlineage_transport needs openlineage-python: pip install 'lineage-relay[openlineage]'"
    ) from err

log = logging.getLogger("producer.openlineage_transport")

#: The value for ``transport.type``.
TRANSPORT_TYPE = f"{__name__}.LineageRelayTransport"


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{where}: must be true or false")


@attr.define
class LineageRelayConfig(Config):
    producer_config: ProducerConfig
    #: Wait after each emit until Kafka acknowledged it or it is journaled (bounded by
    #: ``close_timeout_s``: ``LineageProducer.settle``): the official Kafka transport's ``flush``.
    flush: bool = True

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> LineageRelayConfig:
        # openlineage-python merged the OPENLINEAGE__TRANSPORT__* variables into ``params``:
        # those that are not ours (another transport's) are skipped, a typo in the file is not.
        flush = True
        rest = {}
        for key, value in params.items():
            if str(key).replace("_", "").lower() == "flush":
                flush = _flag(value, f"transport.{key}")
            else:
                rest[key] = value
        # A blank OPENLINEAGE__TRANSPORT__PROPERTIES__* value (a template that rendered nothing) is
        # not set, as load_config reads it: openlineage-python hands it over as "".
        rest = drop_blank_env_properties(rest, os.environ)
        # openlineage-python read openlineage.yml with yaml.safe_load: 012345 became 5349. As written instead.
        rest = numbers_as_written(rest, os.environ)
        foreign = env_foreign_keys(os.environ)
        layer = transport_layer(rest, "transport", skippable=lambda key: key.lower() in foreign)
        local_server_id_as_message_key(layer)   # as every other source's transport section
        return cls(build_config(layer.values, layer.origins), flush)


class LineageRelayTransport(Transport):
    """An openlineage-python ``Transport`` backed by :class:`producer.LineageProducer`."""

    kind = "lineage-relay"
    config_class = LineageRelayConfig

    def __init__(self, config: LineageRelayConfig) -> None:
        self.config = config
        self.flush = config.flush
        self.producer = LineageProducer(config.producer_config)

    def emit(self, event: Any) -> None:
        try:
            doc = event if isinstance(event, dict) else Serde.to_dict(event)
        except Exception as err:  # noqa: BLE001 - never raise into the integration
            self.producer.drop("unencodable", err)
            return
        self.producer.emit(doc)
        if self.flush:
            try:
                left = self.producer.settle()
            except Exception as err:  # noqa: BLE001 - never raise into the integration
                log.error("event=flush_after_emit_failed detail=%r", err)
                return
            if left:
                log.warning("event=flush_incomplete topic=%s not_journaled=%d timeout_s=%s detail=neither acknowledged "
                            "by Kafka nor journaled within closeTimeoutS: still sent or journaled later, but lost if "
                            "the process ends now without exit handlers (os._exit)", self.producer.config.topic,
                            left, self.producer.config.close_timeout_s)

    def wait_for_completion(self, timeout: float = -1) -> bool:
        """Flush; ``timeout`` < 0 means the producer's ``close_timeout_s``. True if all delivered."""
        return self.producer.flush(None if timeout < 0 else timeout) == 0

    def close(self, timeout: float = -1) -> bool:
        """Flush for ``timeout`` (< 0: ``close_timeout_s``), journal the rest, stop.
        True when everything was delivered (False: the rest is journaled, not lost)."""
        self.producer.close(None if timeout < 0 else timeout)
        return self.producer.pending == 0
