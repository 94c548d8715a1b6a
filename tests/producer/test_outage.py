"""Never lose: the broker is down, dies mid-stream, or the producing process dies."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from producer import LineageProducer, events, replacement, sender
from relay.embedded.broker import EmbeddedBroker
from tests.producer.support import (
    FAST_RECONNECT,
    assert_all_arrived_in_order,
    frozen_with_an_aside_journal,
    journal_left_by_killed_producer,
    seq_event,
    start_producer_child,
    wait_for,
)
from tests.support.kafka import process_state, read_to_end, read_topic, unread_request_bytes
from tests.support.kafka_proxy import (
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    PRODUCE,
    UNKNOWN_PRODUCER_ID,
    proxied_broker,
)

pytestmark = pytest.mark.kafka


def _producer(bootstrap: str, topic: str, journal_dir: Path, **kw) -> LineageProducer:
    return LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir,
                           properties=FAST_RECONNECT, **kw)


def test_broker_down_at_start_then_up_delivers_everything_in_order(broker, tmp_path):
    with _producer(broker.bootstrap_servers, "down-at-start", tmp_path) as p:
        for i in range(300):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.journaled == 300, 10, "all events in the journal")
        assert p.stats.mode == "journal" and p.stats.delivered == 0
        broker.start()
        broker.create_topic("down-at-start", 2)
        assert p.flush(30) == 0
        # The last replayed batch's commit (pending 0: flush returns) comes a moment before
        # the sender's switch back to direct sending, in the same turn.
        wait_for(lambda: p.stats.mode == "direct", 10, "direct sending again")
    records = read_topic(broker.bootstrap_servers, "down-at-start", expected=300)
    assert_all_arrived_in_order(records, range(300))


def test_broker_killed_mid_stream_and_restarted_delivers_everything(broker, tmp_path):
    broker.start()
    broker.create_topic("mid-stream", 2)
    with _producer(broker.bootstrap_servers, "mid-stream", tmp_path) as p:
        for i in range(200):
            p.emit(seq_event(i))
        assert p.flush(15) == 0
        # Tansu keeps records in memory only: read what was delivered before it dies.
        before = read_topic(broker.bootstrap_servers, "mid-stream", expected=200)
        assert len(before) == 200
        # Freeze the broker so records sent from now on are in flight, unacknowledged,
        # then kill it in the middle of the stream.
        os.kill(broker._proc.pid, signal.SIGSTOP)
        for i in range(200, 400):
            p.emit(seq_event(i))
        broker.stop()
        for i in range(400, 600):
            p.emit(seq_event(i))
        wait_for(lambda: p.stats.mode == "journal", 10, "journal mode after the kill")
        broker.start()
        broker.create_topic("mid-stream", 2)
        assert p.flush(30) == 0
        assert p.stats.journaled >= 200
    after = read_topic(broker.bootstrap_servers, "mid-stream", expected=400)
    assert_all_arrived_in_order(before + after, range(600))


def _held_behind_a_stopped_broker(broker: EmbeddedBroker, topic: str, journal_dir: Path) -> LineageProducer:
    """A producer that delivered event 0, then emitted events 1-100 to its broker stopped
    (SIGSTOP): one request of at most 10 of them is on the wire, the rest wait behind it."""
    broker.start()
    broker.create_topic(topic, 1)
    props = {"max.in.flight.requests.per.connection": "1", "batch.num.messages": "10"}
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=journal_dir,
                        properties={**FAST_RECONNECT, **props})
    try:
        p.emit(seq_event(0))
        assert p.flush(15) == 0                       # connected, producer id assigned
        os.kill(broker._proc.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(broker._proc.pid) == "T", 10, "the broker stopped")
        for i in range(1, 101):
            p.emit(seq_event(i))
        wait_for(lambda: unread_request_bytes(broker.port) > 0, 10, "a request on the wire")
    except BaseException:
        p.close(timeout_s=0)
        raise
    return p


def test_a_fatal_error_journals_what_librdkafka_held_in_emit_order(broker, tmp_path):
    """After a fatal error the sender waits for the answers to requests on the wire, and
    librdkafka reports the queued (newer) records first, the in-flight (older) ones when
    they time out: the journal must still hold them in emit order."""
    with _held_behind_a_stopped_broker(broker, "fatal", tmp_path) as p:
        p._on_error(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "injected", fatal=True))
        wait_for(lambda: p.stats.journaled == 100, 20, "every held record journaled")
        broker.stop()                                 # the stale request dies with it
        broker.start()
        broker.create_topic("fatal", 1)
        assert p.flush(30) == 0
    records = read_topic(broker.bootstrap_servers, "fatal", expected=100)
    assert_all_arrived_in_order(records, range(1, 101))


@pytest.mark.parametrize("error_code", [OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID],
                         ids=["out_of_order_sequence", "invalid_producer_epoch", "unknown_producer_id"])
def test_an_answer_that_spoils_the_producer_id_loses_nothing_and_keeps_emit_order(tmp_path, error_code):
    """The broker answers one produce request with an error about the idempotent
    producer's id. An out-of-order sequence is fatal (confluent-kafka raises it from
    poll()); the other two fail the delivery, librdkafka bumps the epoch on its own, and a
    broker without that bump (Tansu) refuses the instance for good. Either way the sender
    journals what the instance held, replaces it and resends: every event arrives, in emit
    order per key, nothing dropped (the broker had written the refused request, so its
    records may arrive twice)."""
    with proxied_broker() as (broker, proxy):
        broker.create_topic("refused", 2)
        with _producer(broker.bootstrap_servers, "refused", tmp_path) as p:
            for i in range(100):
                p.emit(seq_event(i))
            assert p.flush(15) == 0
            proxy.answer_with_error(PRODUCE, error_code)
            for i in range(100, 300):
                p.emit(seq_event(i))
            assert p.flush(30) == 0, p.stats
            assert [code for _, _, code in proxy.injected] == [error_code]
            assert p.stats.delivery_failures > 0 and p.stats.journaled > 0, p.stats
            assert p.stats.dropped == {}, p.stats
        records = read_topic(broker.bootstrap_servers, "refused", expected=400, timeout_s=5)
    assert_all_arrived_in_order(records, range(300))


def test_a_broker_that_pauses_past_the_stall_period_answers_before_the_resend(broker, tmp_path):
    """No delivery report for the stall period: the producer replaces its librdkafka
    instance, but first waits a while for the answer to the request on the wire. A broker
    that wakes up meanwhile answers it, so it is neither resent nor written twice."""
    with _held_behind_a_stopped_broker(broker, "paused", tmp_path) as p:
        wait_for(lambda: p.stats.mode == "journal", 20, "the stall noticed")
        os.kill(broker._proc.pid, signal.SIGCONT)
        assert p.flush(30) == 0
        assert p.stats.journaled >= 80, "the queued records went through the journal"
    # Read for a while past the 101 expected: a request written twice adds up to 10 more.
    records = read_topic(broker.bootstrap_servers, "paused", expected=111, timeout_s=3)
    assert_all_arrived_in_order(records, range(101))
    assert len(records) == 101, f"{len(records) - 101} records written twice"


def test_a_second_process_resends_the_journal_a_killed_one_left(broker, tmp_path):
    topic = "crash"
    journal_left_by_killed_producer(tmp_path, broker.bootstrap_servers, topic, 250)
    assert list(tmp_path.rglob("*.seg")), "the killed process left a journal"
    broker.start()
    broker.create_topic(topic, 2)
    with _producer(broker.bootstrap_servers, topic, tmp_path) as p:
        for i in range(250, 300):   # this process's own events go after the orphan's
            p.emit(seq_event(i))
        assert p.flush(30) == 0
        assert p.stats.replayed >= 250
    records = read_topic(broker.bootstrap_servers, topic, expected=300)
    assert_all_arrived_in_order(records, range(300))
    assert not list(tmp_path.rglob("*.seg")), "a delivered journal is removed"


def test_interpreter_exit_journals_what_could_not_be_delivered(broker, tmp_path):
    topic = "atexit"
    child = start_producer_child(tmp_path, broker.bootstrap_servers, topic, 40, "")  # never calls close()
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and out.split() == ["journaled", "40"]
    broker.start()
    broker.create_topic(topic, 1)
    with _producer(broker.bootstrap_servers, topic, tmp_path) as p:
        assert p.flush(30) == 0
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=40), range(40))


def test_close_with_the_broker_away_keeps_the_rest_for_the_next_producer(broker, tmp_path):
    topic = "close-away"
    p = _producer(broker.bootstrap_servers, topic, tmp_path)    # broker not started yet
    for i in range(30):
        p.emit(seq_event(i))
    p.close(timeout_s=0.3)
    assert p.stats.pending == 30 and p.stats.errors == 0
    broker.start()
    broker.create_topic(topic, 1)
    with _producer(broker.bootstrap_servers, topic, tmp_path) as again:
        assert again.flush(30) == 0
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=30), range(30))


def test_close_with_the_broker_away_does_not_wait_for_what_is_already_journaled(broker, tmp_path):
    """Kafka unreachable at close (and so at interpreter exit): events already in the
    journal are safe, so close() must not hold the job up for close_timeout_s waiting for
    them. With Kafka reachable, close() still delivers a journal before it returns."""
    topic = "close-journaled"
    p = _producer(broker.bootstrap_servers, topic, tmp_path, close_timeout_s=60)  # broker not started yet
    for i in range(30):
        p.emit(seq_event(i))
    wait_for(lambda: p.stats.journaled == 30, 10, "every event journaled")
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 15, "close() waited for events already journaled"
    assert p.stats.pending == 30 and p.stats.dropped == {}
    broker.start()
    broker.create_topic(topic, 1)
    again = _producer(broker.bootstrap_servers, topic, tmp_path, close_timeout_s=60)
    again.close()                                   # no flush(): close() replays the journal
    assert again.stats.pending == 0 and again.stats.replayed == 30
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=30), range(30))


def test_close_after_all_brokers_down_journals_the_events_without_waiting_for_the_stall(broker, tmp_path, caplog,
                                                                                      monkeypatch):
    """librdkafka reports "all brokers down" once per outage, before the job has emitted
    anything; events emitted later sit in librdkafka until the stall detector gives up on
    them (5 s and more). close() gives Kafka a short grace to answer, then takes them back
    into the journal: interpreter exit during an outage took ~4.9 s. The stall period is
    made far longer than any wait here, so only close() can journal the events."""
    monkeypatch.setattr(replacement, "_STALL_S", (600.0, 600.0))
    caplog.set_level(logging.WARNING, "producer.kafka")
    topic = "after-down"
    # librdkafka reports the outage again after a reconnect backoff; a long one keeps this
    # test about the first report.
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        close_timeout_s=60, properties={"reconnect.backoff.max.ms": "120000"})
    try:
        wait_for(lambda: "reason=all_brokers_down" in caplog.text, 10, "librdkafka reporting all brokers down")
        wait_for(lambda: p.stats.mode == "direct", 10, "direct sending again (the journal was empty)")
        p.emit(seq_event(0))
        p.emit(seq_event(1))
        started = time.monotonic()
    finally:
        p.close()
    assert time.monotonic() - started < 30, "close() waited for the outage"
    assert p.stats.journaled == 2 and p.stats.pending == 2 and p.stats.dropped == {}
    assert "reason=closing_while_kafka_down" in caplog.text and "reason=stalled" not in caplog.text
    broker.start()
    broker.create_topic(topic, 1)
    with _producer(broker.bootstrap_servers, topic, tmp_path) as again:
        assert again.flush(30) == 0
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, topic, expected=2), range(2))


def test_close_after_kafka_came_back_delivers_instead_of_journaling(broker, tmp_path, caplog, monkeypatch):
    """Kafka down at start (reported), then back, nothing acknowledged since: the events a
    job emits then are delivered by close(), not left in the journal (where, in a pod that
    goes away, nobody resends them)."""
    monkeypatch.setattr(replacement, "_STALL_S", (600.0, 600.0))
    # The grace close() gives a Kafka reported down: here long enough for librdkafka to reconnect
    # on a loaded machine (the test is about delivering, not about the grace's length).
    monkeypatch.setattr(replacement, "_DOWN_GRACE_S", 30.0)
    caplog.set_level(logging.WARNING, "producer.kafka")
    with _producer(broker.bootstrap_servers, "down-then-up", tmp_path) as p:
        wait_for(lambda: "reason=all_brokers_down" in caplog.text, 10, "librdkafka reporting all brokers down")
        broker.start()
        broker.create_topic("down-then-up", 1)
        for i in range(200):
            p.emit(seq_event(i))
    assert p.stats.delivered == 200 and p.stats.journaled == 0 and p.stats.pending == 0, p.stats
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, "down-then-up", expected=200), range(200))


def test_a_journal_that_cannot_be_written_does_not_stop_direct_sending(broker, tmp_path, caplog, monkeypatch):
    """Kafka down at start, then back; the journal's disk full: events still go to Kafka
    (journal mode that waited for an acknowledgement from the journal dropped them all)."""
    import errno

    from producer import journal

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(journal.Journal, "append", full)
    caplog.set_level(logging.WARNING, "producer.kafka")
    with _producer(broker.bootstrap_servers, "disk-full", tmp_path) as p:
        wait_for(lambda: "reason=all_brokers_down" in caplog.text, 10, "librdkafka reporting all brokers down")
        broker.start()
        broker.create_topic("disk-full", 1)
        wait_for(lambda: p.stats.mode == "direct", 10, "direct sending again (the journal was empty)")
        for i in range(20):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
    assert p.stats.delivered == 20 and p.stats.dropped == {}, p.stats


def test_an_outage_is_a_few_warnings_not_a_flood_of_librdkafka_lines(broker, tmp_path, caplog, monkeypatch):
    """Kafka unreachable while a job emits: librdkafka's connection failure is logged once
    at WARNING with its text (it was logged at every reconnect, a hundred lines in a 40 s
    job, and again by every instance a stall rebuild made), the producer says once that
    events go to the journal, and the repeats stay at DEBUG."""
    monkeypatch.setattr(replacement, "_STALL_S", (0.5, 1.0))
    caplog.set_level(logging.WARNING, "producer.kafka")
    caplog.set_level(logging.DEBUG, "producer.librdkafka")   # last: it sets the handler's level too

    def librdkafka(level_at_least: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "producer.librdkafka" and r.levelno >= level_at_least]

    with _producer(broker.bootstrap_servers, "unreachable", tmp_path) as p:
        for rebuilds in (1, 2):
            deadline = time.monotonic() + 20
            while caplog.text.count("event=producer_rebuilt") < rebuilds and time.monotonic() < deadline:
                p.emit(seq_event(0))
                time.sleep(0.01)  # ok: a job emitting while Kafka is away
            assert caplog.text.count("event=producer_rebuilt") >= rebuilds
            if rebuilds == 1:
                warned_after_one_rebuild = len(librdkafka(logging.WARNING))
        assert p.stats.dropped == {} and p.stats.journaled > 0
    warned = librdkafka(logging.WARNING)
    assert 1 <= len(warned) <= 2, [r.getMessage() for r in warned]  # 17 ERROR lines in 3 s before
    assert len(warned) == warned_after_one_rebuild, "the second rebuild's instance warned again"
    assert all(r.levelno == logging.WARNING for r in warned)
    assert "Connection refused" in warned[0].getMessage() and broker.bootstrap_servers in warned[0].getMessage()
    told = [r.getMessage() for r in caplog.records if "event=journal_mode" in r.getMessage()]
    assert len(told) == 1, told
    repeats = [r.getMessage() for r in librdkafka(logging.DEBUG)
               if r.levelno == logging.DEBUG and "FAIL" in r.getMessage()]
    # librdkafka before 2.16 folds identical errors into one line ("N identical error(s)
    # suppressed"): those count as the failures they stand for.
    suppressed = sum(int(m.group(1)) for m in map(re.compile(r"(\d+) identical error").search, repeats) if m)
    assert len(repeats) + suppressed >= 5, f"the repeats are still there at DEBUG: {repeats}"


def test_the_next_outage_is_reported_again_once_kafka_took_records(broker, tmp_path, caplog):
    """Quiet repeats last only until Kafka acknowledges a record: a second outage gets its
    WARNING lines (librdkafka's connection failure, journal mode) like the first."""
    caplog.set_level(logging.WARNING, "producer.kafka")
    caplog.set_level(logging.WARNING, "producer.librdkafka")

    def warned_failures() -> int:
        return sum(r.name == "producer.librdkafka" and "FAIL" in r.getMessage() for r in caplog.records)

    with _producer(broker.bootstrap_servers, "two-outages", tmp_path) as p:
        wait_for(lambda: warned_failures() == 1 and "event=journal_mode" in caplog.text, 10, "the first outage")
        broker.start()
        broker.create_topic("two-outages", 1)
        p.emit(seq_event(0))
        assert p.flush(30) == 0
        assert warned_failures() == 1
        broker.stop()
        p.emit(seq_event(1))
        # At least once more: librdkafka now knows the broker by two names (bootstrap and its
        # node id), each a kind of line of its own, so the second outage may warn twice.
        wait_for(lambda: warned_failures() >= 2 and caplog.text.count("event=journal_mode") >= 2, 20,
                 "the second outage reported")


def test_a_wiped_broker_that_forgot_the_producer_id_is_recovered_from(broker, tmp_path):
    # Tansu restarts empty; librdkafka's epoch bump does not satisfy it, so the replay
    # stalls until the producer replaces its librdkafka instance (new producer id).
    broker.start()
    broker.create_topic("wiped", 1)
    with _producer(broker.bootstrap_servers, "wiped", tmp_path) as p:
        for i in range(100):
            p.emit(seq_event(i))
        assert p.flush(15) == 0
        broker.restart()
        broker.create_topic("wiped", 1)
        for i in range(100, 200):
            p.emit(seq_event(i))
        assert p.flush(30) == 0
    assert_all_arrived_in_order(read_topic(broker.bootstrap_servers, "wiped", expected=100), range(100, 200))


@pytest.mark.parametrize(("reason", "told", "level"), [
    ("all_brokers_down", None, logging.WARNING),              # an outage's first line
    ("all_brokers_down", "all_brokers_down", logging.INFO),   # its repeats
    ("stalled", "all_brokers_down", logging.INFO),            # a rebuilt client took nothing either
    ("stalled", None, logging.WARNING),                       # a stall is news when nothing was told
    ("closing_while_kafka_down", "all_brokers_down", logging.WARNING),
    ("fatal_error", "stalled", logging.WARNING),
])
def test_journal_mode_is_a_warning_once_per_outage_and_for_news(reason, told, level):
    assert sender.journal_mode_level(reason, told) == level


def test_records_taken_back_from_librdkafka_are_journaled_not_counted_as_delivery_failures(broker, tmp_path):
    """close() with the broker stopped: the sender's last turn purges what librdkafka holds
    (queued, and the request on the wire) and journals it. Those records did not fail: they
    were taken back, so delivery_failures stays 0."""
    p = _held_behind_a_stopped_broker(broker, "taken-back", tmp_path)
    try:
        p.close(1.0)
        assert p.stats.journaled == 100 and p.stats.dropped == {}, p.stats
        assert p.stats.delivery_failures == 0, p.stats
    finally:
        os.kill(broker._proc.pid, signal.SIGCONT)


def test_emit_waits_for_no_answer_of_a_frozen_broker_while_the_sender_waits_for_them(broker, tmp_path, caplog):
    """The broker stops answering (SIGSTOP) with records on the wire: the stall is noticed,
    and the sender waits up to 5 s for the answers before it replaces its librdkafka
    instance. The spill queue (a small one: queue_max_events=100) fills within that wait; it
    goes to a journal of its own, sent after the records given back, so emit() never waits
    for the network and drops nothing. Once the broker is back every event arrives, in order."""
    broker.start()
    broker.create_topic("frozen", 1)
    caplog.set_level(logging.INFO, "producer.kafka")
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic="frozen", journal_dir=tmp_path,
                        properties=FAST_RECONNECT, queue_max_events=100, close_timeout_s=1)
    try:
        p.emit(seq_event(0))
        assert p.flush(15) == 0
        os.kill(broker._proc.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(broker._proc.pid) == "T", 10, "the broker stopped")
        worst, n = 0.0, 1
        deadline = time.monotonic() + 30
        try:
            while not any("event=producer_rebuilt" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the stall was never noticed"
                began = time.monotonic()
                p.emit(seq_event(n))
                worst, n = max(worst, time.monotonic() - began), n + 1
                time.sleep(0.005)  # ok: pacing, the job's events coming over time
        finally:
            os.kill(broker._proc.pid, signal.SIGCONT)
        assert p.stats.dropped == {} and worst < 0.5, (worst, p.stats)
        assert any("reason=reclaim_wait" in r.getMessage() for r in caplog.records), "the spill queue went aside"
        assert p.flush(30) == 0, p.stats
    finally:
        p.close(1)
    assert_all_arrived_in_order(read_to_end(broker.bootstrap_servers, "frozen"), range(n))


def _padded_event(i: int) -> dict:
    event = seq_event(i)
    event["run"]["facets"]["pad"] = events.custom_facet({"p": "x" * 800}, schema_url="https://example.com/p.json")
    return event


def test_the_journal_a_reclaim_puts_aside_shares_journal_max_bytes_with_the_current_one(broker, tmp_path, caplog):
    """During a reclaim's wait the spill queue goes to a journal of its own; the records
    librdkafka gives back then go to the current journal. Together (and with every other
    journal the producer made) they stay within journal_max_bytes, checked at each append:
    the records that do not fit are dropped as journal_full, counted."""
    broker.start()
    broker.create_topic("frozen-cap", 1)
    caplog.set_level(logging.INFO, "producer.kafka")
    root, cap = tmp_path / "j", 65536
    p = LineageProducer(bootstrap_servers=broker.bootstrap_servers, topic="frozen-cap", journal_dir=root,
                        properties=FAST_RECONNECT, queue_max_events=100, close_timeout_s=1, journal_max_bytes=cap)
    logged = lambda text: any(text in r.getMessage() for r in caplog.records)  # noqa: E731
    try:
        with frozen_with_an_aside_journal(p, broker, _padded_event, logged):
            on_disk = sum(f.stat().st_size for d in root.iterdir() for f in d.glob("*.seg"))
            s = p.stats
            assert on_disk <= cap, (on_disk, s)
            assert s.dropped.get("journal_full", 0) > 0 and set(s.dropped) == {"journal_full"}
            assert s.journaled + s.dropped["journal_full"] == 110
        assert p.flush(40) == 0, p.stats
    finally:
        p.close(1)
