"""Backpressure's limits on what the relay holds, without a broker: a fake source, the real
offset tracker."""

from __future__ import annotations

import asyncio

from relay import backpressure
from relay.backpressure import Backpressure
from relay.metrics import RelayMetrics
from relay.source.offsets import OffsetTracker


class Source:
    paused = False

    async def set_paused(self, paused: bool) -> None:
        self.paused = paused


def test_records_held_behind_one_retried_for_ever_pause_consumption_and_say_where(monkeypatch, caplog):
    """One event a collector refuses with a retriable status, retried for ever: everything
    after it in its partition is delivered, but each record keeps its ticket until the
    commit can pass it. Consumption used to go on (nothing pending, few bytes) while those
    grew without bound; it pauses at MAX_TRACKED_RECORDS, with the partition and offset
    logged, and goes on once the event settles."""
    monkeypatch.setattr(backpressure, "MAX_TRACKED_RECORDS", 1000)
    monkeypatch.setattr(backpressure, "HOLD_S", 0.05)
    tracker, source = OffsetTracker(), Source()
    limits = Backpressure(source, [], tracker, RelayMetrics(), max_pending_bytes=1 << 30, state_unacked=lambda: 0,
                          stopping=lambda: False)
    stuck = tracker.track(("ol", 3), 41, size=100)
    for offset in range(42, 42 + 998):
        tracker.track(("ol", 3), offset, size=100).release()  # delivered
    asyncio.run(limits.apply())
    assert not source.paused  # 999 held: under the limit
    tracker.track(("ol", 3), 1040, size=100).release()
    asyncio.run(limits.apply())
    assert source.paused
    stalled = [r for r in caplog.records if r.getMessage() == "commit_stalled"]
    assert len(stalled) == 1
    assert (stalled[0].fields["partition"], stalled[0].fields["offset"]) == ("ol/3", 41)  # type: ignore[attr-defined]
    stuck.release()  # delivered at last: the commit passes everything
    assert tracker.committable() == {("ol", 3): 1041} and tracker.outstanding() == 0
    asyncio.run(limits.apply())
    assert not source.paused
