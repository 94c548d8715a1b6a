"""Consumer lag per assigned partition, in records and in seconds.

:func:`measure_lag` sets ``lineage_relay_consumer_lag`` (records behind the partition's
end, not consumed yet) and ``lineage_relay_consumer_lag_seconds`` (the age of the oldest
record not done with) for every assigned partition, and removes both series of a
partition measured no more; see its docstring for what the age means.
"""

from __future__ import annotations

import time

from prometheus_client import Gauge

from relay.metrics import RelayMetrics
from relay.source.kafka import KafkaSource
from relay.source.offsets import OffsetTracker


async def measure_lag(source: KafkaSource, tracker: OffsetTracker, metrics: RelayMetrics) -> None:
    """Per assigned partition: the records behind its end (not consumed yet), and the age
    of its oldest record not done with: the oldest consumed and not settled (delivered
    everywhere, dead-lettered or dropped), where the next commit stops; else, while
    records wait to be consumed, the last one consumed (those waiting are newer: an
    upper bound); else 0. That age is what counts against the topic's retention: a
    record older than it is lost if the relay has to read it again. Not set for a
    partition nothing was consumed from yet. A partition measured no more (given to
    another replica by a rebalance, or its position unknown since it was assigned again)
    loses both series: its last values would otherwise stay for ever, firing alerts and
    counted twice in sums over the replicas."""
    now_ms = time.time() * 1000
    lag_records, lag_seconds = metrics.lag, metrics.lag_seconds
    lags = await source.lag()
    measured = {(topic, str(partition)) for topic, partition in lags}
    for gauge in (lag_records, lag_seconds):
        for labels in _label_sets(gauge) - measured:
            gauge.remove(*labels)
    for part, lag in lags.items():
        labels = {"topic": part[0], "partition": str(part[1])}
        lag_records.labels(**labels).set(lag)
        oldest_ms, last_ms = tracker.record_ms(part)
        ms = oldest_ms or (last_ms if lag else None)
        if ms is not None:
            lag_seconds.labels(**labels).set(max(0.0, (now_ms - ms) / 1000))
        elif not lag:
            lag_seconds.labels(**labels).set(0)


def _label_sets(gauge: Gauge) -> set[tuple[str, str]]:
    """The (topic, partition) label values of a per-partition gauge's series."""
    return {(s.labels["topic"], s.labels["partition"]) for metric in gauge.collect() for s in metric.samples}
