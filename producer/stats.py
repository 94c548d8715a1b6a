"""``ProducerStats``: a snapshot of a producer's counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProducerStats:
    """A snapshot of the producer's counters (all since construction).

    ``emitted``: emit() calls; ``delivered``: acknowledged by Kafka (replays included);
    ``journaled``: written to the journal; ``replayed``: delivered from a journal;
    ``delivery_failures``: records librdkafka failed to deliver (not those the producer
    took back itself from it, purged, as it entered journal mode), all journaled;
    ``dropped``: events that will never be sent, by reason (``journal_corrupt``: corrupt
    regions of a journal skipped, one per region, how many records each held being unknown:
    :mod:`producer.journal`); ``errors``: every problem
    logged (drops included); ``pending``: not yet acknowledged (at least: see below); ``mode``: ``direct``,
    ``journal`` or ``disabled`` (:class:`producer.disabled.DisabledProducer`);
    ``adopted``: delivered from journals dead processes left that the producer adopted while
    running (:mod:`producer.replay`; in no other count: ``delivered``, ``replayed`` and
    ``pending`` include only the journals it took over when it started; ``pending`` counts
    one whose records its sender has not counted yet as those counted so far, at least 1);
    ``close_deferred``: why a close() was deferred (``inside_emit``, ``inside_counters``,
    ``inside_logging``: :mod:`producer.deferred_close`), from then on; None if none was.
    """

    emitted: int
    delivered: int
    journaled: int
    replayed: int
    delivery_failures: int
    errors: int
    dropped: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    mode: str = "direct"
    adopted: int = 0
    close_deferred: str | None = None
