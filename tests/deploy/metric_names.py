"""The metric series the relay exports, read from a real ``RelayMetrics`` registry, and
checks of PromQL expressions (the dashboard's queries, the alerting rules) against them."""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from relay.metrics import RelayMetrics

METRIC = re.compile(r"\b(lineage_relay_[A-Za-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(lineage_relay_[A-Za-z0-9_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_SUFFIXES = {Counter: ("_total",), Histogram: ("_bucket", "_sum", "_count"), Gauge: ("",)}


def exported() -> dict[str, set[str]]:
    """Series name the relay exports -> its label names. prometheus_client's registry
    yields no samples for a labelled metric until a child exists, so names are derived
    from each metric's type, as the exposition format writes them; those of custom
    collectors from their samples."""
    metrics = RelayMetrics()
    out: dict[str, set[str]] = {}
    registered = {m.name for m in metrics.registry.collect()}
    for metric in vars(metrics).values():
        kind = type(metric)
        if kind not in _SUFFIXES:
            continue
        base = metric._name  # noqa: SLF001 - the registered name, without the type's suffix
        assert base in registered
        labels = set(metric._labelnames)  # noqa: SLF001 - public only through samples
        if kind is Histogram:
            labels_bucket = labels | {"le"}
            out[base + "_bucket"] = labels_bucket
            out[base + "_sum"] = out[base + "_count"] = labels
        else:
            for suffix in _SUFFIXES[kind]:
                out[base + suffix] = labels
    # Series exported by custom collectors (the per-collector delivery numbers), from
    # their samples once a collector exists.
    metrics.for_collector("c")
    for family in metrics.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set(sample.labels))
    return out


EXPORTED = exported()


def unknown_metrics(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC.findall(expr)} - set(EXPORTED)


def label_problems(expr: str) -> list[str]:
    """Labels ``expr`` selects or groups by that its metrics do not have (Prometheus adds
    ``job`` and ``instance`` when it scrapes)."""
    problems = []
    for name, matchers in SELECTOR.findall(expr):
        used = {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",") if m.strip()}
        problems += [f"{name} has no label {label!r}" for label in sorted(used - EXPORTED[name] - {"job", "instance"})]
    names = set(METRIC.findall(expr))
    available = set.union(*(EXPORTED[n] for n in names)) | {"job", "instance"} if names else set()
    for group in GROUPING.findall(expr):
        labels = {label.strip() for label in group.split(",") if label.strip()}
        problems += [f"no metric of the expression has label {label!r}" for label in sorted(labels - available)]
    return problems
