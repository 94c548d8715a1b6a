"""Prometheus metrics, one registry per relay (tests run several relays in a process).

Every event that is not forwarded is counted under a named reason: dead-lettered
(``reason``), deduplicated, or dropped (``reason``, e.g. ``after_terminal``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Deliveries:
    """One collector's acknowledged deliveries: their count and a histogram of their
    latency (consumption to acknowledgement), as plain numbers.

    Recorded once per event on the event loop, where a prometheus_client Counter and
    Histogram (a lock each, a bucket scan) cost ~4 us per event, ~2% of the relay's CPU
    per event. Exported as ``lineage_relay_events_forwarded_total`` and
    ``lineage_relay_delivery_latency_seconds`` by :class:`_DeliveriesExport` at scrape time.
    """

    __slots__ = ("sum_s", "buckets")

    def __init__(self) -> None:
        self.sum_s = 0.0
        #: Per bucket of _LATENCY_BUCKETS, then +Inf; not cumulative.
        self.buckets = [0] * (len(_LATENCY_BUCKETS) + 1)

    @property
    def count(self) -> int:
        """Deliveries acknowledged (the forwarded counter)."""
        return sum(self.buckets)

    def record(self, latency_s: float) -> None:
        self.sum_s += latency_s
        self.buckets[bisect_left(_LATENCY_BUCKETS, latency_s)] += 1  # a bucket is "<= bound"


class _DeliveriesExport:
    """Exports every collector's :class:`Deliveries` (a custom prometheus collector)."""

    def __init__(self) -> None:
        self.by_collector: dict[str, Deliveries] = {}

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        forwarded = CounterMetricFamily("lineage_relay_events_forwarded", "Events acknowledged by a collector",
                                        labels=["collector"])
        latency = HistogramMetricFamily("lineage_relay_delivery_latency_seconds",
                                        "From consumption to collector acknowledgement", labels=["collector"])
        for name, d in list(self.by_collector.items()):
            counts = list(d.buckets)
            forwarded.add_metric([name], sum(counts))
            cumulative, buckets = 0, []
            for bound, n in zip((*_LATENCY_BUCKETS, float("inf")), counts):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            latency.add_metric([name], buckets, d.sum_s)
        yield forwarded
        yield latency


@dataclass
class CollectorMetrics:
    #: Acknowledged deliveries (count and latency).
    delivered: Deliveries
    retried: Counter
    deduplicated: Counter
    held: Gauge
    pending: Gauge
    facets_dropped: Counter
    starts_synthesized: Counter
    open_runs: Gauge
    _dropped: Counter
    _runs_expired: Counter
    _batch_requests: Counter
    _concurrency_limit: Gauge
    _batch_fallback: Gauge
    name: str

    def concurrency_limit(self) -> Gauge:
        """Requests in flight the collector is allowed now (created by the collectors that
        have such a limit: an HTTP collector, fixed or adaptive)."""
        return self._concurrency_limit.labels(collector=self.name)

    def batch_fallback(self) -> Gauge:
        """1 while the collector's batch endpoint is given up and its events go alone (created
        by batch collectors)."""
        return self._batch_fallback.labels(collector=self.name)

    def dropped(self, reason: str) -> Counter:
        return self._dropped.labels(collector=self.name, reason=reason)

    def runs_expired(self, reason: str) -> Counter:
        return self._runs_expired.labels(collector=self.name, reason=reason)

    def batch_requests(self, result: str) -> Counter:
        return self._batch_requests.labels(collector=self.name, result=result)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry(auto_describe=True)
        p = "lineage_relay_"
        self.consumed = Counter(p + "events_consumed", "Kafka records consumed", registry=r)
        self._deliveries = _DeliveriesExport()
        r.register(self._deliveries)  # events_forwarded_total and delivery_latency_seconds
        self.retried = Counter(p + "delivery_retries", "Delivery attempts retried", ["collector"], registry=r)
        self.deduplicated = Counter(p + "events_deduplicated", "Exact duplicates not forwarded again",
                                    ["collector"], registry=r)
        self.dropped = Counter(p + "events_dropped", "Events deliberately not forwarded, by reason",
                               ["collector", "reason"], registry=r)
        self.dead_lettered = Counter(p + "events_dead_lettered", "Records written to the dead-letter topic",
                                     ["reason"], registry=r)
        self.held = Gauge(p + "events_held", "Events waiting for their run's START", ["collector"], registry=r)
        self.pending = Gauge(p + "events_pending", "Events accepted for a collector, not yet delivered",
                             ["collector"], registry=r)
        self.lag = Gauge(p + "consumer_lag", "Records behind the partition's end", ["topic", "partition"], registry=r)
        self.lag_seconds = Gauge(p + "consumer_lag_seconds", "Age of the partition's oldest record not done with "
                                 "(consumed and not settled, or waiting to be consumed); 0 when none",
                                 ["topic", "partition"], registry=r)
        self.paused = Gauge(p + "consumption_paused", "1 while consumption is held off or paused for backpressure", registry=r)
        self.commits = Counter(p + "offset_commits", "Offset commits made", registry=r)
        self.facets_dropped = Counter(p + "facets_dropped_for_size", "Facets removed to fit a collector's size limit",
                                      ["collector"], registry=r)
        self.runs_expired = Counter(p + "runs_expired", "Runs flushed before their end (run_ttl, max_open_runs)",
                                    ["collector", "reason"], registry=r)
        self.starts_synthesized = Counter(p + "starts_synthesized", "START events made up for runs without one",
                                          ["collector"], registry=r)
        self.open_runs = Gauge(p + "open_runs", "Runs held open by a consolidated/coalesce collector",
                               ["collector"], registry=r)
        self.concurrency_limit = Gauge(p + "collector_concurrency_limit",
                                       "Requests in flight a collector is allowed now (learnt with "
                                       "adaptive_concurrency, else its fixed ceiling)",
                                       ["collector"], registry=r)
        self.state_writes = Counter(p + "run_state_writes", "Run-state changelog records acknowledged, by result",
                                    ["result"], registry=r)
        self.batch_requests = Counter(p + "batch_requests", "Batch POSTs answered, by result (ok, partial, retry, "
                                      "refused, unattributed, unsupported)", ["collector", "result"], registry=r)
        self.batch_fallback = Gauge(p + "batch_fallback", "1 while a collector's batch endpoint is given up "
                                    "(404, 405 or 501 to batches in a row) and its events go alone to the "
                                    "single-event endpoint, until a re-probe batch is accepted", ["collector"],
                                    registry=r)
        self.offset_resets = Counter(p + "offset_resets", "Partitions read from elsewhere than their committed "
                                     "offset because the partition no longer held it (retention, a recreated "
                                     "topic)", ["topic"], registry=r)
        self.lookback_events = Counter(p + "lookback_events", "Events read back from before the committed offset of "
                                       "newly assigned partitions (runs and digests the lanes learnt)", registry=r)
        self.lookback_runs_found = Counter(p + "lookback_runs_found", "Held runs found to have begun further back "
                                           "than the look-back read (result: open, finished)",
                                           ["collector", "result"], registry=r)
        self.runs_restored = Counter(p + "runs_restored", "Run states read back from the changelog on assignment",
                                     ["collector"], registry=r)
        self.producers_replaced = Counter(p + "kafka_producers_replaced", "The relay's Kafka producers (dead_letter, "
                                          "run_state) replaced after a fatal librdkafka error", ["producer"],
                                          registry=r)
        self.dead_letter_values_omitted = Counter(
            p + "dead_letter_values_omitted", "Dead letters written without their value: the dead-letter topic "
            "refused the original record as too large", ["reason"], registry=r)

    def deliveries(self, collector: str) -> Deliveries:
        """``collector``'s acknowledged deliveries (``.count`` is the forwarded counter)."""
        return self._deliveries.by_collector.setdefault(collector, Deliveries())

    def for_collector(self, name: str) -> CollectorMetrics:
        return CollectorMetrics(
            delivered=self.deliveries(name), retried=self.retried.labels(collector=name),
            deduplicated=self.deduplicated.labels(collector=name), held=self.held.labels(collector=name),
            pending=self.pending.labels(collector=name),
            facets_dropped=self.facets_dropped.labels(collector=name),
            starts_synthesized=self.starts_synthesized.labels(collector=name),
            open_runs=self.open_runs.labels(collector=name),
            _concurrency_limit=self.concurrency_limit, _batch_fallback=self.batch_fallback,
            _dropped=self.dropped, _runs_expired=self.runs_expired, _batch_requests=self.batch_requests, name=name)
