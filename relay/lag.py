"""Consumer lag per assigned partition, in records and in seconds.

:func:`measure_lag` sets ``lineage_relay_consumer_lag`` (records behind the partition's
end, not consumed yet) and ``lineage_relay_consumer_lag_seconds`` (how old the oldest
record not done with is, at most) for every assigned partition, and removes both series of
a partition measured no more; see its docstring for what the age means.
"""

from __future__ import annotations

import time

from prometheus_client import Gauge

from relay.metrics import RelayMetrics
from relay.source.kafka import KafkaSource
from relay.source.offsets import OffsetTracker


async def measure_lag(source: KafkaSource, tracker: OffsetTracker, metrics: RelayMetrics) -> None:
    """Per assigned partition: the records behind its end (not consumed yet; for one
    assigned while paused, nothing fetched since, counted from where it starts), and how
    old its oldest record not done with is, at most:

    * some consumed are not settled (delivered everywhere, dead-lettered or dropped): the
      age of the oldest of them, where the next commit stops (exact);
    * all consumed are settled and records wait to be consumed: the time since the later
      of the last record consumed and the last measurement that found the partition caught
      up (those waiting are newer than both: an upper bound, give or take the few seconds
      the end offsets take to be known);
    * none waits: 0.

    That age is what counts against the topic's retention: a record older than it is lost
    if the relay has to read it again. Not set while records wait on a partition nothing
    was consumed from since it was assigned, and which was not measured caught up since.
    A partition measured no more (given to another replica by a rebalance) loses both
    series: its last values would otherwise stay for ever, firing alerts and counted twice
    in sums over the replicas."""
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
        if not lag:
            tracker.caught_up(part, now_ms)
        oldest_ms, last_ms = tracker.record_ms(part)
        if oldest_ms is not None:
            ms: float | None = oldest_ms
        elif lag:
            ms = max((t for t in (last_ms, tracker.caught_up_ms(part)) if t is not None), default=None)
        else:
            ms = None
        if ms is not None:
            lag_seconds.labels(**labels).set(max(0.0, (now_ms - ms) / 1000))
        elif not lag:
            lag_seconds.labels(**labels).set(0)


def _label_sets(gauge: Gauge) -> set[tuple[str, str]]:
    """The (topic, partition) label values of a per-partition gauge's series."""
    return {(s.labels["topic"], s.labels["partition"]) for metric in gauge.collect() for s in metric.samples}
