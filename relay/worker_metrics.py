"""The supervisor's ``/metrics``: every worker's exposition as one, each sample labelled
``worker="<index>"``, with the supervisor's own gauges (see :mod:`relay.workers`).

Each family appears once (one HELP and TYPE line) with the samples of every worker that
has it; names, suffixes (a counter's ``_total`` and ``_created``, a histogram's
``_bucket``/``_sum``/``_count``) and label escaping are prometheus_client's own, as the
texts are parsed with its parser and written again with ``generate_latest``. A worker left
out (it did not answer) is counted in ``lineage_relay_workers_unscraped``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

WORKER_LABEL = "worker"


def merge_expositions(texts: Mapping[int, str], *, configured: int, alive: int, unscraped: int) -> bytes:
    """One Prometheus text exposition of ``texts`` (worker index -> its /metrics text), in
    the order of the workers and of each family's first appearance, and the supervisor's
    gauges: workers ``configured``, ``alive`` and ``unscraped`` (did not answer)."""
    families: dict[tuple[str, str], Metric] = {}
    for index in sorted(texts):
        for family in text_string_to_metric_families(texts[index]):
            merged = families.get((family.name, family.type))
            if merged is None:
                merged = families[(family.name, family.type)] = Metric(family.name, family.documentation,
                                                                       family.type, family.unit)
            label = str(index)
            merged.samples.extend(Sample(s.name, {WORKER_LABEL: label, **s.labels}, s.value, s.timestamp, s.exemplar)
                                  for s in family.samples)
    own = [
        GaugeMetricFamily("lineage_relay_workers", "Relay worker processes configured", value=configured),
        GaugeMetricFamily("lineage_relay_workers_alive", "Relay worker processes running", value=alive),
        GaugeMetricFamily("lineage_relay_workers_unscraped",
                          "Relay workers whose /metrics did not answer this scrape (left out)", value=unscraped),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families.values(), *own]))
    return generate_latest(registry)


class _Families:
    """Metric families ready made, as a prometheus_client collector."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
