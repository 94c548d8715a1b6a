"""librdkafka's log lines as structured events (relay.kafka_log), as confluent-kafka hands
them over: ``log(level, "%s [%s] %s", facility, client, message)``."""

from __future__ import annotations

import logging

import pytest

from relay.kafka_log import REPEAT_EVERY_S, KafkaLog, with_log

FMT = "%s [%s] %s"
#: librdkafka 2.x (leader epochs) and 1.x wordings of the same line.
RESET_2X = ("events.v2 [3]: offset reset (at offset 1200 (leader epoch 3), broker 1) to offset BEGINNING "
            "(leader epoch -1): fetch failed due to requested offset not available on the broker: "
            "Broker: Offset out of range")
RESET_1X = ("events.v2 [3]: offset reset (at offset 1200, broker 1) to BEGINNING: fetch failed due to "
            "requested offset not available on the broker: Broker: Offset out of range")


RESET_CACHED = ("events.v2 [3]: offset reset (at offset 1200 (leader epoch 3), broker 1) to cached BEGINNING "
                "offset offset 17 (leader epoch -1): fetch failed due to requested offset not available on the "
                "broker: Broker: Offset out of range")


#: As librdkafka 2.16 hands it to the logger (captured): the thread that logged it first.
RESET_SEEN = ("[thrd:main]: events [0]: offset reset (at offset 10 (leader epoch 0), broker 111) to cached "
              "BEGINNING offset offset 0 (leader epoch -1): fetch failed due to requested offset not available on "
              "the broker: Broker: Offset out of range")


@pytest.mark.parametrize(("message", "to"), [
    ("[thrd:main]: " + RESET_2X, "BEGINNING"), ("[thrd:main]: " + RESET_1X, "BEGINNING"),
    ("[thrd:main]: " + RESET_CACHED, 17), (RESET_2X, "BEGINNING")],
    ids=["2.x", "1.x", "cached-start", "without-thread-name"])
def test_an_offset_reset_is_its_own_warning_and_is_counted(caplog, message, to):
    resets = []
    sink = KafkaLog(on_offset_reset=lambda topic, partition: resets.append((topic, partition)))
    with caplog.at_level(logging.DEBUG, logger="relay.librdkafka"):
        sink.log(logging.WARNING, FMT, "OFFSET", "rdkafka#consumer-1", message)
    assert resets == [("events.v2", 3)]
    [record] = caplog.records
    assert (record.name, record.levelno, record.getMessage()) == ("relay.librdkafka", logging.WARNING, "offset_reset")
    fields = record.fields
    assert (fields["topic"], fields["partition"], fields["from_offset"], fields["to_offset"]) == ("events.v2", 3, 1200,
                                                                                                 to)
    assert fields["reason"].endswith("Broker: Offset out of range") and fields["client"] == "rdkafka#consumer-1"
    assert "retention" in fields["hint"]


@pytest.mark.parametrize(("start", "lost"), [(0, None), (20, 10)], ids=["back", "forward"])
def test_the_line_librdkafka_2_16_writes_is_recognised_with_the_records_skipped(caplog, start, lost):
    resets = []
    line = RESET_SEEN.replace("offset offset 0", f"offset offset {start}")
    with caplog.at_level(logging.INFO, logger="relay.librdkafka"):
        KafkaLog(on_offset_reset=lambda *a: resets.append(a)).log(logging.WARNING, FMT, "OFFSET", "c", line)
    assert resets == [("events", 0)]
    [record] = caplog.records
    assert (record.getMessage(), record.fields["from_offset"], record.fields["to_offset"],
            record.fields.get("records_lost")) == ("offset_reset", 10, start, lost)


def test_other_lines_keep_their_level_facility_and_text(caplog):
    resets = []
    sink = KafkaLog(on_offset_reset=lambda *a: resets.append(a))
    refused = ("127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused "
               "(after 0ms in state CONNECT)")
    with caplog.at_level(logging.INFO, logger="relay.librdkafka"):
        sink.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", "[thrd:127.0.0.1:9/bootstrap]: " + refused)
        # An OFFSET line that is not a reset, and one in a wording not recognised: plain lines.
        sink.log(logging.INFO, FMT, "OFFSET", "rdkafka#consumer-1", "events [0]: offset reset in some new wording")
        sink.log(logging.DEBUG, FMT, "FETCH", "rdkafka#consumer-1", "below the level: not logged")
    assert resets == []
    assert [(r.levelno, r.getMessage(), r.fields["facility"], r.fields["thread"], r.fields["message"])
            for r in caplog.records] == [
        (logging.ERROR, "librdkafka", "FAIL", "127.0.0.1:9/bootstrap", refused),
        (logging.INFO, "librdkafka", "OFFSET", None, "events [0]: offset reset in some new wording")]


def test_with_log_sets_the_logger_and_leaves_the_rest():
    mine = KafkaLog()
    conf = {"a": "1"}
    assert with_log(conf)["logger"] is not None and with_log(conf, mine) == {"a": "1", "logger": mine}
    assert conf == {"a": "1"}


def _refused(broker: str, after_ms: int) -> str:
    return (f"[thrd:{broker}/bootstrap]: {broker}/bootstrap: Connect to ipv4#{broker} failed: Connection refused "
            f"(after {after_ms}ms in state CONNECT)")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_line_is_logged_at_its_level_once_a_minute_with_the_repeats_counted(caplog):
    """A down broker makes librdkafka log a connection failure at every attempt (~470 lines
    in 20 s of a relay's start-up were seen): one line of a kind at its level per
    REPEAT_EVERY_S, the repeats at DEBUG, the next line at its level counting them."""
    clock = _Clock()
    sink = KafkaLog(clock=clock)
    with caplog.at_level(logging.DEBUG, logger="relay.librdkafka"):
        for attempt in range(300):
            sink.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", _refused("127.0.0.1:9", attempt % 7))
            clock.now += 0.19  # 57 s in all: within the interval
        clock.now = 1000.0 + REPEAT_EVERY_S
        sink.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", _refused("127.0.0.1:9", 3))
    at_level = [r for r in caplog.records if r.levelno == logging.ERROR]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert [r.fields.get("repeated") for r in at_level] == [None, 299]
    assert len(debug) == 299 and {r.fields["level_was"] for r in debug} == {"ERROR"}
    assert at_level[1].fields["message"] == _refused("127.0.0.1:9", 3).split("]: ", 1)[1]


def test_repeats_held_back_are_not_logged_below_debug(caplog):
    clock = _Clock()
    sink = KafkaLog(clock=clock)
    with caplog.at_level(logging.INFO, logger="relay.librdkafka"):
        for attempt in range(50):
            sink.log(logging.ERROR, FMT, "FAIL", "rdkafka#consumer-1", _refused("127.0.0.1:9", attempt))
    assert len(caplog.records) == 1


def test_each_client_broker_and_cause_is_a_kind_of_its_own(caplog):
    sink = KafkaLog(clock=_Clock())
    lines = [("FAIL", "rdkafka#consumer-1", _refused("10.0.0.1:9092", 0)),
             ("FAIL", "rdkafka#producer-2", _refused("10.0.0.1:9092", 0)),     # another client
             ("FAIL", "rdkafka#consumer-1", _refused("10.0.0.2:9092", 0)),     # another broker
             ("FAIL", "rdkafka#consumer-1", "[thrd:main]: 10.0.0.1:9092/bootstrap: Failed to resolve "
                                            "'kafka:9092': Name or service not known"),  # another cause
             ("REQTMOUT", "rdkafka#consumer-1", "[thrd:main]: 10.0.0.1:9092/1: Timed out 1 in-flight requests")]
    with caplog.at_level(logging.INFO, logger="relay.librdkafka"):
        for _ in range(3):
            for facility, client, message in lines:
                sink.log(logging.WARNING, FMT, facility, client, message)
    assert len(caplog.records) == len(lines)
    assert [(r.fields["facility"], r.fields["client"]) for r in caplog.records] == [(f, c) for f, c, _ in lines]


def test_offset_resets_are_never_held_back(caplog):
    resets = []
    sink = KafkaLog(on_offset_reset=lambda *a: resets.append(a), clock=_Clock())
    with caplog.at_level(logging.INFO, logger="relay"):
        for _ in range(4):
            sink.log(logging.INFO, FMT, "OFFSET", "rdkafka#consumer-1", RESET_SEEN)
    assert [r.getMessage() for r in caplog.records] == ["offset_reset"] * 4 and len(resets) == 4


def test_the_kinds_remembered_are_bounded_and_quiet_ones_make_room(caplog, monkeypatch):
    monkeypatch.setattr("relay.kafka_log._MAX_KINDS", 3)
    clock = _Clock()
    sink = KafkaLog(clock=clock)
    with caplog.at_level(logging.INFO, logger="relay.librdkafka"):
        for broker in ("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"):
            sink.log(logging.ERROR, FMT, "FAIL", "c", _refused(broker, 0))
        assert len(caplog.records) == 3  # the fourth kind: no room
        clock.now += REPEAT_EVERY_S
        sink.log(logging.ERROR, FMT, "FAIL", "c", _refused("10.0.0.5:1", 0))
    assert len(caplog.records) == 4 and "10.0.0.5:1" in caplog.records[-1].fields["message"]
