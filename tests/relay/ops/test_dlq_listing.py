"""What ``dlq list`` says of each reason, from the records as they are read (plain data)."""

from __future__ import annotations

from types import SimpleNamespace

from relay.ops.dead_letters import DeadLetter
from relay.ops.dlq import DeadLetterListing


def _letter(partition: int, offset: int, reason: str = "collector_rejected", redriven: bool = False) -> DeadLetter:
    return DeadLetter(partition, offset, b"k", b"v", reason, "400 Bad Request", f"ol/0/{offset}", "a",
                      "2026-11-27T10:00:00Z", redriven)


def _line(listing: DeadLetterListing, reason: str) -> str:
    ledger = SimpleNamespace(positions={}, group_id="g.dlq-redrive")  # what render reads of a RedriveLedger
    (line,) = [ln for ln in listing.render("dlq", ledger).splitlines() if ln.startswith(reason)]
    return line


def test_offsets_are_given_per_partition_not_mixed_across_them():
    """Records of several dead-letter partitions are read partition after partition (or
    interleaved): one "first .. last" range named offsets of different partitions, which do
    not compare (``1:3 .. 0:40`` read as a range)."""
    listing = DeadLetterListing()
    for partition, offset in [(1, 3), (0, 12), (1, 9), (0, 40), (0, 20)]:
        listing.add(_letter(partition, offset))
    listing.add(_letter(2, 7, reason="invalid_json", redriven=True))
    line = _line(listing, "collector_rejected")
    assert "offsets 0:12 .. 0:40, 1:3 .. 1:9 " in line
    assert " 5 record(s)" in line and " 5 pending" in line
    assert "offsets 2:7 .. 2:7 " in _line(listing, "invalid_json")
