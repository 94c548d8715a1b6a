"""What ``dlq list`` says of each reason, from the records as they are read (plain data)."""

from __future__ import annotations

from types import SimpleNamespace

from relay.events import SourceRef
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


class _Message:
    """What DeadLetter.from_message reads of a confluent-kafka Message."""

    def __init__(self, headers: list[tuple[str, bytes]]) -> None:
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"run:ns/job"

    def value(self) -> None:
        return None


def test_digits_that_are_not_ascii_in_a_header_are_read_as_no_count_not_a_crash():
    """``"²".isdigit()`` is True and ``int("²")`` raises: one record written by another tool
    with such a ``value_omitted`` or ``source`` stopped every ``dlq list`` and ``dlq redrive``
    (a traceback, exit 1) of the whole topic. It is read as a record whose value is its own
    and whose source names no record."""
    letter = DeadLetter.from_message(_Message([("reason", b"too_large"), ("value_omitted", "²".encode()),
                                               ("source", "ol/¹/3".encode())]))
    assert letter.value_omitted is None and letter.reason == "too_large"
    assert SourceRef.parse("ol/¹/3") is None and SourceRef.parse("ol/1/³") is None
    assert SourceRef.parse("ol/1/3") == SourceRef("ol", 1, 3)
    counted = DeadLetter.from_message(_Message([("value_omitted", b"20971520"), ("source", b"ol/0/5")]))
    assert counted.value_omitted == 20971520 and counted.value_at("dlq") == SourceRef("ol", 0, 5)


def test_an_offset_flag_that_names_no_offset_is_refused_not_read_as_no_bound(tmp_path, capsys):
    """``--from-offset "$START"`` with START unset replayed the whole topic (exit 0); an empty
    ``--to-offset`` read to the end; ``dlq redrive --offsets ""`` selected nothing, exit 0.
    Each is refused, exit 2, naming the flag and the form, before the broker is asked."""
    from relay.cli import main as cli

    path = tmp_path / "relay.yaml"
    path.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', topics: [ol]}\n"
                    "collectors: [{name: a, url: 'http://127.0.0.1:1'}]\n")
    for argv, flag in [(["replay", "--from-offset", "", "--to-end"], "--from-offset"),
                       (["replay", "--from-offset", ",", "--to-end"], "--from-offset"),
                       (["replay", "--from-offset", "0:0", "--to-offset", " "], "--to-offset"),
                       (["dlq", "redrive", "--offsets", ""], "--offsets")]:
        assert cli([*argv, "--config", str(path), "--collector", "a"] if argv[0] == "replay"
                   else [*argv, "--config", str(path)]) == 2, argv
        err = capsys.readouterr().err
        assert f"{flag} " in err and "names no offset; expected PARTITION:OFFSET" in err, (argv, err)
    for argv, flag in [(["--from-time", "", "--to-end"], "--from-time"),
                       (["--from-offset", "0:0", "--to-time", ""], "--to-time")]:
        assert cli(["replay", *argv, "--config", str(path), "--collector", "a"]) == 2, argv
        err = capsys.readouterr().err
        assert f"{flag} '': expected an ISO-8601 date-time" in err, (argv, err)
