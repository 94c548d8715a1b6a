"""The librdkafka configuration of the relay's group consumer.

:func:`consumer_config` starts from defaults that make a manual-commit, at-least-once
consumer tuned for the relay (:data:`FETCH_BYTES`, :data:`FETCH_QUEUE_BACKOFF_MS`); the
user's ``kafka.consumer_properties`` override them, except the properties the relay's
guarantees depend on (offsets are committed by the relay alone, once delivered), which
always win.
"""

from __future__ import annotations

from typing import Any

#: What librdkafka may fetch in one response (``fetch.max.bytes``, a third of its default):
#: with events of tens of MB this memory counts, and for small events it costs nothing
#: measurable. A record larger than a fetch is still fetched whole; records of up to
#: librdkafka's ``receive.message.max.bytes`` (100 MB) are received. What it may hold
#: fetched ahead is ``queued.max.messages.kbytes`` (64 MiB by default; halving it halved
#: the relay's intake of small events).
FETCH_BYTES = 16 * 1024 * 1024
#: Once that fetched-ahead queue has been full, librdkafka waits ``fetch.queue.backoff.ms``
#: (1000 by default) before it fetches again, even when the queue was emptied meanwhile.
#: A relay that drains the queue faster than that (small events at batch-collector rates)
#: then got polls back empty for up to a second every ~27k events: the pipeline alone did
#: 25.5k events/s, against 39-40k at 250 ms (and 37-39k at 20 ms). 250 ms covers queues
#: drained at up to ~256 MiB/s, and with 20 MB events it leaves peak memory where the
#: default does (~470-490 MiB in tests/relay/test_relay_oversize.py; 20 ms: ~530).
FETCH_QUEUE_BACKOFF_MS = 250
#: How often librdkafka asks for the subscribed topics' metadata
#: (``topic.metadata.refresh.interval.ms``; its default is 5 minutes). Only then does it
#: notice a subscribed topic gone (a broker back without its data, a topic deleted: the
#: relay is told, logs ``topics_missing`` and /readyz answers 503) or one (re)created: the
#: group gives out its partitions only then. At the default, a relay under a broker
#: restarted empty went on answering ready with no partition and consumed the recreated
#: topic only up to 5 minutes later. One small metadata request every 10 s.
METADATA_REFRESH_MS = 10_000

#: Defaults that make a manual-commit, at-least-once consumer; user properties win
#: except for the ones the relay's guarantees depend on (see _FORCED).
_DEFAULTS = {
    "auto.offset.reset": "earliest",
    "session.timeout.ms": "10000",
    "heartbeat.interval.ms": "1000",
    "max.poll.interval.ms": "300000",
    "partition.assignment.strategy": "cooperative-sticky",
    "fetch.wait.max.ms": "100",
    "fetch.max.bytes": str(FETCH_BYTES),
    "fetch.queue.backoff.ms": str(FETCH_QUEUE_BACKOFF_MS),
    "topic.metadata.refresh.interval.ms": str(METADATA_REFRESH_MS),
}
_FORCED = {"enable.auto.commit": "false", "enable.auto.offset.store": "false"}

_COMMITS = "remove it: the relay commits offsets itself, once an event is delivered everywhere"
#: Consumer properties the relay sets itself, whatever ``consumer_properties`` say (see
#: :func:`consumer_config`), with the fix the configuration check gives for each: they are
#: refused there rather than silently overwritten.
RELAY_SETS = {
    "group.id": "remove it, and set kafka.group_id",
    "bootstrap.servers": "remove it, and set kafka.bootstrap_servers",
    "metadata.broker.list": "remove it, and set kafka.bootstrap_servers",
    **{key: _COMMITS for key in _FORCED},
}
#: What the relay's own producers (dead letters, run state, redrive markers) set under
#: ``producer_properties``; the configuration check applies them too.
PRODUCER_DEFAULTS = {"enable.idempotence": "true", "acks": "all"}


def consumer_config(bootstrap_servers: str, group_id: str, properties: dict[str, str]) -> dict[str, Any]:
    """The consumer's configuration: :data:`_DEFAULTS`, overridden by ``properties``, then
    :data:`_FORCED`; ``client.id`` is ``lineage-relay`` unless ``properties`` name one."""
    conf: dict[str, Any] = {**_DEFAULTS, **properties, **_FORCED}
    conf["bootstrap.servers"] = bootstrap_servers
    conf["group.id"] = group_id
    conf.setdefault("client.id", "lineage-relay")
    return conf
