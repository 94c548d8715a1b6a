"""Prometheus metrics, one registry per relay (tests run several relays in a process).

Every event that is not forwarded is counted under a named reason: dead-lettered
(``reason``), deduplicated, or dropped (``reason``, e.g. ``after_terminal``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass
class CollectorMetrics:
    forwarded: Counter
    retried: Counter
    deduplicated: Counter
    held: Gauge
    pending: Gauge
    latency: Histogram
    facets_dropped: Counter
    starts_synthesized: Counter
    open_runs: Gauge
    _dropped: Counter
    _runs_expired: Counter
    _batch_requests: Counter
    name: str

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
        self.forwarded = Counter(p + "events_forwarded", "Events acknowledged by a collector", ["collector"], registry=r)
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
        self.paused = Gauge(p + "consumption_paused", "1 while consumption is paused for backpressure", registry=r)
        self.latency = Histogram(p + "delivery_latency_seconds", "From consumption to collector acknowledgement",
                                 ["collector"], buckets=_LATENCY_BUCKETS, registry=r)
        self.commits = Counter(p + "offset_commits", "Offset commits made", registry=r)
        self.facets_dropped = Counter(p + "facets_dropped_for_size", "Facets removed to fit a collector's size limit",
                                      ["collector"], registry=r)
        self.runs_expired = Counter(p + "runs_expired", "Runs flushed before their end (run_ttl, max_open_runs)",
                                    ["collector", "reason"], registry=r)
        self.starts_synthesized = Counter(p + "starts_synthesized", "START events made up for runs without one",
                                          ["collector"], registry=r)
        self.open_runs = Gauge(p + "open_runs", "Runs held open by a consolidated/coalesce collector",
                               ["collector"], registry=r)
        self.state_writes = Counter(p + "run_state_writes", "Run-state changelog records acknowledged, by result",
                                    ["result"], registry=r)
        self.batch_requests = Counter(p + "batch_requests", "Batch POSTs answered, by result (ok, partial, retry, "
                                      "refused, unattributed)", ["collector", "result"], registry=r)
        self.runs_restored = Counter(p + "runs_restored", "Run states read back from the changelog on assignment",
                                     ["collector"], registry=r)

    def for_collector(self, name: str) -> CollectorMetrics:
        return CollectorMetrics(
            forwarded=self.forwarded.labels(collector=name), retried=self.retried.labels(collector=name),
            deduplicated=self.deduplicated.labels(collector=name), held=self.held.labels(collector=name),
            pending=self.pending.labels(collector=name), latency=self.latency.labels(collector=name),
            facets_dropped=self.facets_dropped.labels(collector=name),
            starts_synthesized=self.starts_synthesized.labels(collector=name),
            open_runs=self.open_runs.labels(collector=name),
            _dropped=self.dropped, _runs_expired=self.runs_expired, _batch_requests=self.batch_requests, name=name)
