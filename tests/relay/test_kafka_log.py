"""librdkafka's log lines as structured events (relay.kafka_log), as confluent-kafka hands
them over: ``log(level, "%s [%s] %s", facility, client, message)``."""

from __future__ import annotations

import logging

import pytest

from relay.kafka_log import KafkaLog, with_log

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
