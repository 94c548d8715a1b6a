"""The delivery metrics kept as plain numbers export exactly what prometheus_client's own
Counter and Histogram would for the same deliveries."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from relay.metrics import _LATENCY_BUCKETS, RelayMetrics


def _samples(registry: CollectorRegistry, prefix: str) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if line.startswith(prefix) and "_created" not in line]


def test_forwarded_and_latency_match_prometheus_client_for_the_same_deliveries():
    metrics = RelayMetrics()
    reference = CollectorRegistry()
    forwarded = Counter("lineage_relay_events_forwarded", "x", ["collector"], registry=reference)
    latency = Histogram("lineage_relay_delivery_latency_seconds", "x", ["collector"], buckets=_LATENCY_BUCKETS,
                        registry=reference)
    rng = random.Random(3)
    # Bounds themselves (a bucket is "<= bound"), values between, beyond the last bound.
    values = [*_LATENCY_BUCKETS, 0.0, 0.001, 0.0051, 299.9, 301.0, 1e6] + [rng.expovariate(4) for _ in range(500)]
    for i, value in enumerate(values):
        name = ("marquez", "backup")[i % 2]
        metrics.deliveries(name).record(value)
        forwarded.labels(collector=name).inc()
        latency.labels(collector=name).observe(value)
    metrics.for_collector("idle")  # a collector with no delivery yet is exported at zero
    forwarded.labels(collector="idle")
    latency.labels(collector="idle")

    for prefix in ("lineage_relay_events_forwarded", "lineage_relay_delivery_latency_seconds"):
        ours, theirs = _samples(metrics.registry, prefix), _samples(reference, prefix)
        assert sorted(ours) == sorted(theirs)
        assert len(ours) >= 3  # one series per collector at least
    assert metrics.deliveries("marquez").count == (len(values) + 1) // 2
    assert metrics.registry.get_sample_value("lineage_relay_events_forwarded_total",
                                             {"collector": "backup"}) == len(values) // 2
