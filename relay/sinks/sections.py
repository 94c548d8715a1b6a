"""The sub-sections of a collector's settings (``retry``, ``consolidation``, ``tls``,
``batch``, ``concurrency: adaptive``), each validated into a frozen object; the collector
itself is :class:`relay.sinks.config.CollectorConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from relay.frozen import Frozen


def endpoint_problem(path: str, example: str, batch: bool) -> str | None:
    """What is wrong with ``path`` as an ``endpoint`` (or ``batch.endpoint``), or None. Never
    the value in the message: it is where a key would be."""
    if not path.startswith("/"):
        return f"must start with '/', e.g. {example}"
    if "?" in path or "#" in path:
        appended = "" if batch else "the relay appends /batch to it for batches (after the query: a wrong URL), and "
        return (f"holds a query string (?...) or a fragment (#...): {appended}a key in it would be written "
                "wherever the URL is logged; fix: give the path alone, and send the collector's key in headers "
                "(e.g. x-functions-key for an Azure Function's code=) or as token with auth_header")
    if any(c.isspace() or not c.isprintable() for c in path):
        return (f"holds a space, a line break or a control character (a value read from a file often ends in "
                f"a newline); write the path alone, such as {example}")
    return None


class RetryConfig(Frozen):
    """Retries on connection errors, timeouts, 408, 429 and 5xx: exponential backoff with
    full jitter, capped; a Retry-After header is honoured as a lower bound."""

    initial_backoff_s: float = Field(0.2, gt=0)
    max_backoff_s: float = Field(30.0, gt=0)
    #: A Retry-After longer than this (a proxy's ``Retry-After: 86400``, an HTTP-date from a
    #: collector whose clock runs ahead) is taken as this: it holds back every request to the
    #: collector, so one bad header must not stop delivery for a day.
    max_retry_after_s: float = Field(300.0, gt=0)
    #: None = retry until delivered (a collector that is down pauses the relay, nothing is lost).
    max_attempts: int | None = Field(None, ge=1)
    #: An event answered a bare HTTP 500 this many times, with the collector accepting other
    #: events between those answers, is one the collector fails on (not an outage): it is
    #: dead-lettered as ``collector_failed_event`` instead of holding its run and the
    #: partition's commits for ever. None = retry such events too until delivered.
    poison_after_attempts: int | None = 5

    @model_validator(mode="after")
    def _initial_under_cap(self) -> RetryConfig:
        # Every wait is capped at max_backoff_s: an initial_backoff_s above it has no effect
        # (whoever set it, e.g. for a rate limit, would get shorter waits than written).
        # Only one the user wrote is refused: a low max_backoff_s alone (0.1 under the default
        # 0.2) just lowers the default initial wait to it.
        if "initial_backoff_s" not in self.model_fields_set:
            if self.initial_backoff_s > self.max_backoff_s:
                # Frozen model, still being built: the default is ours to set.
                object.__setattr__(self, "initial_backoff_s", self.max_backoff_s)
        elif self.initial_backoff_s > self.max_backoff_s:
            raise ValueError(f"initial_backoff_s: {self.initial_backoff_s:g} is above max_backoff_s "
                             f"({self.max_backoff_s:g}), which caps every wait, so it has no effect; fix: lower "
                             "initial_backoff_s, or raise max_backoff_s")
        return self

    @field_validator("poison_after_attempts")
    @classmethod
    def _poison_after(cls, v: int | None) -> int | None:
        if v is not None and v < 2:
            raise ValueError("must be at least 2 (one HTTP 500 cannot tell an event the collector fails on from "
                             "an outage), or null to retry such events until delivered")
        return v


class MissingStartConfig(Frozen):
    """What happens to a run whose START never arrives (consolidated/coalesce modes)."""

    #: How long after a run's first event its START may still come.
    timeout_s: float = Field(30.0, gt=0)
    #: ``synthesize``: make a START up from what was seen (marked with the
    #: ``lineageRelay_synthesizedStart`` run facet); ``forward``: the run goes on without one.
    policy: Literal["synthesize", "forward"] = "synthesize"


class ConsolidationConfig(Frozen):
    """Knobs of the ``consolidated`` and ``coalesce`` delivery modes (see the README)."""

    #: consolidated: after the first terminal event, merge later facets for this long.
    settle_s: float = Field(2.0, ge=0)
    #: coalesce: RUNNING events within this window go out as one.
    coalesce_window_s: float = Field(10.0, gt=0)
    missing_start: MissingStartConfig = MissingStartConfig()
    #: A child run's START waits this long for an unseen parent run's START.
    parent_hold_s: float = Field(5.0, ge=0)
    #: Open runs kept (memory bound); beyond it the least recently active run is flushed early.
    max_open_runs: int = Field(100_000, ge=1)
    #: A run without events for this long is flushed early (what it holds is sent).
    run_ttl_s: float = Field(6 * 3600.0, gt=0)
    #: Finished runs remembered, so that their late events are dropped, not a new run.
    max_finished_runs: int = Field(100_000, ge=1)
    finished_ttl_s: float = Field(3600.0, gt=0)




class TlsConfig(Frozen):
    """TLS towards one collector (``https://`` URLs). Files are read at start-up; a missing
    or unreadable one stops the relay with the key that names it."""

    #: PEM file of the CA(s) that signed the collector's certificate; default: the system's.
    ca_bundle: str | None = None
    #: PEM client certificate (mutual TLS), with ``client_key`` unless the key is in the same file.
    client_cert: str | None = None
    client_key: str | None = None
    #: ``false`` skips certificate verification: for tests only, never in production.
    verify: bool = True

    @model_validator(mode="after")
    def _key_needs_cert(self) -> TlsConfig:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert; add client_cert (the PEM certificate) or remove client_key")
        if not self.verify and self.ca_bundle is not None:
            # Refused like any setting without effect: whoever gave a CA expects it checked.
            raise ValueError("ca_bundle: has no effect with verify: false (the collector's certificate is not "
                             "checked at all); fix: remove verify: false to verify against this CA, or remove "
                             "ca_bundle")
        return self


class BatchConfig(Frozen):
    """Delivery through the collector's ``POST <lineage>/batch`` endpoint (as OpenLineage PR
    #4109 proposes it, and OpenMetadata has it; 404, 405 or 501 there ``unsupported_after``
    times in a row: single events, the endpoint tried again every ``reprobe_after_s``):
    a batch goes out when it holds ``max_events`` events, when the next event would take it
    over ``max_bytes``, or ``linger_ms`` after its first event, whichever comes first."""

    #: Path appended to ``url``; default: ``endpoint`` + ``/batch`` (the proposed layout).
    endpoint: str | None = None
    max_events: int = Field(200, ge=1, le=10_000)
    max_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    linger_ms: float = Field(20.0, ge=0)
    #: Batch POSTs in flight at once.
    max_requests: int = Field(4, ge=1, le=64)
    #: Batches answered 404, 405 or 501 in a row (none accepted in between) before the batch
    #: endpoint is given up for single events: one such answer may come from a proxy or an
    #: old instance during a rolling deploy (:mod:`relay.sinks.batch_fallback`).
    unsupported_after: int = 3
    #: Once given up, one batch tries the endpoint again this long after; accepted, batching
    #: resumes. None = never (single events until the relay restarts).
    reprobe_after_s: float | None = 600.0

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        problem = None if v is None else endpoint_problem(v, "/api/v1/lineage/batch", batch=True)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("unsupported_after")
    @classmethod
    def _unsupported_after(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1 (1 gives the batch endpoint up on the first 404, 405 or 501); "
                             "set batch: null if the collector has no batch endpoint")
        return v

    @field_validator("reprobe_after_s")
    @classmethod
    def _reprobe_after(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("must be above 0 (seconds before a batch endpoint given up is tried again), "
                             "or null to never try it again")
        return v


class AdaptiveConcurrencyConfig(Frozen):
    """Requests in flight to a collector, learnt from its answers (:mod:`relay.sinks.adaptive`):
    between ``min`` and the collector's ceiling (``concurrency``, or ``batch.max_requests``),
    growing while answers come back fast, shrinking when they slow down or on 429, 5xx and
    timeouts."""

    min: int = Field(1, ge=1)
    #: Where the limit starts; default: 4 (or ``min``, or the ceiling, whichever bounds it).
    initial: int | None = Field(None, ge=1)
    #: A success slower than this times the lowest recent latency means the collector is
    #: queueing: the limit shrinks. Batch requests ignore latency (their size sets it).
    latency_tolerance: float = Field(2.0, gt=1)
