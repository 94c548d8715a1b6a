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


def test_a_limit_below_one_is_refused_not_listed_as_an_empty_topic(tmp_path, capsys):
    """``--limit 0`` (or a negative one) listed "0 record(s)" with exit 0 for a topic full of
    dead letters: an operator read it as an empty dead-letter topic. It is refused, exit 2,
    before the broker is asked (none listens here)."""
    from relay.cli import main as cli

    path = tmp_path / "relay.yaml"
    path.write_text("kafka: {bootstrap_servers: '127.0.0.1:1'}\ncollectors: [{name: a, url: 'http://127.0.0.1:1'}]\n")
    for limit in ("0", "-1"):
        assert cli(["dlq", "list", "--config", str(path), "--limit", limit]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "lineage-relay dlq list: --limit must be at least 1" in captured.err
