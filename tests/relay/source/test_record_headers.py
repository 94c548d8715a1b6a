import logging

from relay.events import SourceRef
from relay.logs import JsonFormatter
from relay.source.record_headers import collectors_named, redriven_have

AT = SourceRef("ol", 0, 7)


class Record:
    """A consumed Kafka record as confluent-kafka hands it over: only its headers."""

    def __init__(self, headers=None, error=None):
        self._headers, self._error = headers, error

    def headers(self):
        if self._error is not None:
            raise self._error
        return self._headers


def test_names_that_are_not_utf8_name_no_collector_and_the_others_stay():
    assert collectors_named([b"a,b\xff", None, b"", b"c,"]) == (frozenset({"a", "c"}), True)
    assert collectors_named([b"a,b"]) == (frozenset({"a", "b"}), False)


def test_a_record_without_redriven_from_is_an_ordinary_one():
    assert redriven_have(Record(None), AT) is None
    assert redriven_have(Record([("redriven_have", b"a")]), AT) is None


def test_a_handed_back_record_names_the_collectors_that_have_it():
    record = Record([("redriven_from", b"dlq/0/0"), ("redriven_have", b"a,b")])
    assert redriven_have(record, AT) == frozenset({"a", "b"})
    assert redriven_have(Record([("redriven_from", None)]), AT) == frozenset()


def test_an_unreadable_redriven_have_is_logged_and_never_raises(caplog):
    record = Record([("redriven_from", b"dlq/0/0"), ("redriven_have", b"\xff\xfe,a")])
    with caplog.at_level(logging.WARNING):
        assert redriven_have(record, AT) == frozenset({"a"})
    [line] = caplog.records
    assert line.message == "redriven_have_unreadable" and line.fields["source"] == "ol/0/7"


def test_headers_that_cannot_be_read_are_ignored_and_logged(caplog):
    record = Record(error=UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    with caplog.at_level(logging.WARNING):
        assert redriven_have(record, AT) is None
    [line] = caplog.records
    assert line.message == "record_headers_unreadable" and line.fields["source"] == "ol/0/7"


def test_a_huge_unreadable_redriven_have_is_logged_on_a_bounded_line(caplog):
    """The header is the producer's, of any size: a 2 MB one made a 2.75 MB log line (a
    container runtime splits lines at 16 KiB). The line has the count and the first few
    names, each cut."""
    names = b",".join(b"c%07d" % i for i in range(250_000)) + b"," + b"x" * 5000 + b",\xff"
    record = Record([("redriven_from", b"dlq/0/0"), ("redriven_have", names)])
    with caplog.at_level(logging.WARNING):
        have = redriven_have(record, AT)
    assert len(have) == 250_001  # what the relay leaves out is every readable name, whatever is logged
    [line] = caplog.records
    assert line.fields["have_count"] == 250_001
    assert line.fields["have"] == [f"c{i:07d}" for i in range(10)]
    assert len(JsonFormatter().format(line)) < 2000


def test_a_long_name_is_cut_in_the_line(caplog):
    record = Record([("redriven_from", b"dlq/0/0"), ("redriven_have", b"a" * 5000 + b",\xff")])
    with caplog.at_level(logging.WARNING):
        assert redriven_have(record, AT) == frozenset({"a" * 5000})
    [line] = caplog.records
    assert line.fields["have"] == ["a" * 64 + "..."] and line.fields["have_count"] == 1
