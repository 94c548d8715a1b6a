"""Drop events whose content the relay has already accepted recently.

Kafka delivers at least once and producers retry, so the same event can arrive twice.
:class:`Deduper` remembers content digests (``LineageEvent.digest``) for a fixed time
and a bounded count; it is pure: the caller passes ``now`` and acts on the answer.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any


class Deduper:
    """Remembers digests for ``ttl_s`` seconds, at most ``max_entries`` of them.

    Guarantees:

    * A digest remembered at time ``t`` is reported as a duplicate at ``now`` with
      ``now - t < ttl_s``, unless it was forgotten or evicted for room first.
    * The TTL runs from the first sighting: seeing a duplicate does not extend it, so a
      digest stream that repeats forever is still let through once per ``ttl_s``.
    * Memory is bounded by ``max_entries``; when full, the oldest digest is evicted (a
      later copy of it is then let through rather than the relay growing).
    * Expired digests are purged lazily from the oldest end, amortised O(1) per call, at
      most every ``ttl_s / 100`` (and at least every second): an expired digest found
      before its purge is treated as unseen.

    * A digest learnt with :meth:`remember_settled` (a record read back from below its
      partition's committed offset) makes only later copies from that same partition
      duplicates. A copy in another partition may be the one that never reached the
      collector: its twin's offset could be committed while it was still on its way (the
      commit of one partition waits for nothing in another), and a restart then re-reads
      it. It is forwarded, and from then on its digest is an ordinary one.

    Not guaranteed: exactness across restarts (state is in memory only). ``now`` must
    not go backwards, or purging stops early (correctness of answers is unaffected).
    """

    __slots__ = ("_ttl_s", "_max_entries", "_seen", "_where", "_purge_every_s", "_next_purge")

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not (
            math.isfinite(ttl_s) and ttl_s > 0
        ):
            raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self._ttl_s = float(ttl_s)
        self._max_entries = max_entries
        # digest -> time first seen; insertion order is age order, oldest first.
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        # digest -> the (topic, partition)s it was read back from, for digests learnt by
        # remember_settled only (see above).
        self._where: dict[bytes, set[tuple[str, int]]] = {}
        # Purging on every call cost ~1 us per event for a loop that finds nothing to do.
        self._purge_every_s = min(self._ttl_s / 100, 1.0)
        self._next_purge = -math.inf

    def check_and_remember(self, digest: bytes, now: float, where: Any = None) -> bool:
        """Return True if ``digest`` was seen within the TTL (drop the event); otherwise
        remember it as seen at ``now`` and return False (forward the event). ``where`` is
        the record's position (``.topic``, ``.partition``), looked at only for a digest
        learnt by :meth:`remember_settled`."""
        if now >= self._next_purge:
            self._purge(now)
            self._next_purge = now + self._purge_every_s
        seen_at = self._seen.get(digest)
        if seen_at is not None:
            if now - seen_at < self._ttl_s:
                scope = self._where.get(digest) if self._where else None
                if scope is None or (where is not None and (where.topic, where.partition) in scope):
                    return True
            # Expired but not purged yet, or learnt for another partition (see the class
            # docstring): an ordinary entry from now on.
            del self._seen[digest]
            if self._where:
                self._where.pop(digest, None)
        self._seen[digest] = now
        if len(self._seen) > self._max_entries:
            self._evict_oldest()
        return False

    def remember_settled(self, digest: bytes, now: float, topic: str, partition: int) -> None:
        """Remember ``digest`` of a record that settled before the committed offset of
        ``topic``/``partition`` (read back on assignment): later copies from that partition
        are duplicates, copies from others are not (see the class docstring)."""
        seen_at = self._seen.get(digest)
        if seen_at is not None and now - seen_at < self._ttl_s:
            scope = self._where.get(digest)
            if scope is None:
                return  # already an ordinary digest: it dedupes everywhere
            scope.add((topic, partition))  # read back from several partitions: each dedupes
            return
        self._seen.pop(digest, None)
        self._seen[digest] = now
        self._where[digest] = {(topic, partition)}
        if len(self._seen) > self._max_entries:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        oldest, _ = self._seen.popitem(last=False)
        if self._where:
            self._where.pop(oldest, None)

    def forget(self, digest: bytes) -> None:
        """Stop treating ``digest`` as seen, e.g. when its delivery was abandoned and the
        record will be redelivered. Unknown digests are ignored."""
        self._seen.pop(digest, None)
        if self._where:
            self._where.pop(digest, None)

    def __len__(self) -> int:
        return len(self._seen)

    def _purge(self, now: float) -> None:
        """Forget digests seen ``ttl_s`` or more before ``now``."""
        seen = self._seen
        cutoff = now - self._ttl_s
        # OrderedDict, not dict: popping the head of a plain dict leaves dummies that
        # make finding the next head O(n).
        while seen:
            oldest_digest, seen_at = next(iter(seen.items()))
            if seen_at > cutoff:
                break
            del seen[oldest_digest]
            if self._where:
                self._where.pop(oldest_digest, None)
