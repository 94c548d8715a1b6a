"""librdkafka's log lines in proportion: the first of a kind visible, repeats at DEBUG."""

from __future__ import annotations

import logging

import pytest

from producer.librdkafka_log import LibrdkafkaLog

ERR, WARN, NOTICE = logging.ERROR, logging.WARNING, logging.INFO   # confluent-kafka's mapping


def _line(message: str, facility: str = "FAIL", client: str = "rdkafka#producer-1", level: int = ERR):
    return level, "%s [%s] %s", facility, client, message


def _fail(broker: str, cause: str, after_ms: int = 0) -> str:
    return f"[thrd:{broker}]: {broker}: {cause} (after {after_ms}ms in state CONNECT)"


RESOLVE = "Failed to resolve 'kafka:9092': Name or service not known"
REFUSED = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, "producer.librdkafka")
    return lambda: [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "producer.librdkafka"]


def test_a_connection_failure_is_one_warning_with_its_text_and_its_repeats_are_debug(records):
    log = LibrdkafkaLog()
    for i in range(50):
        log.log(*_line(_fail("kafka:9092/bootstrap", RESOLVE, i % 9)))
    # A rebuilt instance (a new client name) does not start over.
    log.log(*_line(_fail("kafka:9092/bootstrap", RESOLVE, 4), client="rdkafka#producer-2"))
    got = records()
    assert [level for level, _ in got] == [WARN] + [logging.DEBUG] * 50
    assert got[0][1].startswith("FAIL [rdkafka#producer-1] [thrd:kafka:9092/bootstrap]: kafka:9092/bootstrap: "
                                f"{RESOLVE} (after 0ms in state CONNECT)")
    assert "repeats are logged at DEBUG" in got[0][1]


def test_each_broker_and_each_new_cause_is_reported_once(records):
    log = LibrdkafkaLog()
    for _ in range(3):
        log.log(*_line(_fail("kafka-1:9092/1", RESOLVE)))
        log.log(*_line(_fail("kafka-2:9092/2", RESOLVE)))
        log.log(*_line(_fail("kafka-1:9092/1", REFUSED)))
    warned = [message for level, message in records() if level >= WARN]
    assert len(warned) == 3
    assert [("kafka-1" in m, "refused" in m) for m in warned] == [(True, False), (False, False), (True, True)]


def test_forget_reports_the_next_outage_again(records):
    log = LibrdkafkaLog()
    log.log(*_line(_fail("kafka:9092/bootstrap", REFUSED)))
    log.log(*_line(_fail("kafka:9092/bootstrap", REFUSED)))
    log.forget()
    log.log(*_line(_fail("kafka:9092/bootstrap", REFUSED)))
    assert [level for level, _ in records()] == [WARN, logging.DEBUG, WARN]


def test_other_warnings_keep_their_level_once_and_notices_are_debug(records):
    log = LibrdkafkaLog()
    conf = "[thrd:app]: Configuration property fetch.wait.max.ms is a consumer property and will be ignored"
    log.log(*_line(conf, facility="CONFWARN", level=WARN))
    log.log(*_line(conf, facility="CONFWARN", level=WARN, client="rdkafka#producer-2"))
    log.log(*_line("[thrd:main]: some SSL failure the user must fix", facility="SSL", level=ERR))
    log.log(*_line("[thrd:main]: kafka:9092/1: Broker is throttling", facility="THROTTLE", level=NOTICE))
    assert [level for level, _ in records()] == [WARN, logging.DEBUG, ERR, logging.DEBUG]


def test_the_number_of_warnings_is_bounded_whatever_the_lines(records, monkeypatch):
    from producer import librdkafka_log
    monkeypatch.setattr(librdkafka_log, "_MAX_KINDS", 4)
    log = LibrdkafkaLog()
    for i in range(20):
        log.log(*_line(_fail(f"broker-{'abcdefghijklmnopqrstuvwxyz'[i]}:9092/bootstrap", RESOLVE)))
    assert sum(level >= WARN for level, _ in records()) == 4


def test_librdkafka_counting_the_repeats_it_suppressed_is_no_new_kind(records):
    """librdkafka's own repeat line, ``(after 0ms in state CONNECT, 1 identical error(s)
    suppressed)``, was a kind of its own: a second WARNING in the same outage."""
    log = LibrdkafkaLog()
    broker = "127.0.0.1:9092/111"
    log.log(*_line(_fail(broker, REFUSED)))
    log.log(*_line(f"[thrd:{broker}]: {broker}: {REFUSED} (after 0ms in state CONNECT, 1 identical error(s) "
                   "suppressed)"))
    log.log(*_line(f"[thrd:{broker}]: {broker}: {REFUSED} (after 1ms in state CONNECT, 12 identical error(s) "
                   "suppressed)"))
    assert [level for level, _ in records()] == [WARN, logging.DEBUG, logging.DEBUG]
