"""An emit() cut short by an exception after librdkafka took its record (a signal handler
raising there, or an instrumented produce() failing after the real one): the record is
accounted for once, whether its delivery report came before the exception or after, so
flush() and close() wait for exactly what is outstanding and nothing is lost."""

from __future__ import annotations

import logging
import signal
import threading
from collections import Counter

import pytest

from producer import LineageProducer
from tests.producer.support import FAST_RECONNECT, decode, seq_event, wait_for
from tests.support.kafka import end_offsets, read_topic

pytestmark = pytest.mark.kafka


class _RaisingAfterProduce:
    """librdkafka's producer whose produce() number ``at`` raises KeyboardInterrupt once the
    real produce() took the record and, with ``reported``, once that record's delivery
    report came (as a signal handler raising right after produce() returned would)."""

    def __init__(self, real, producer: LineageProducer, at: int, reported: bool) -> None:
        self.real, self.producer, self.at, self.reported, self.n = real, producer, at, reported, 0

    def produce(self, *args) -> None:
        self.n += 1
        self.real.produce(*args)
        if self.n == self.at:
            if self.reported:
                wait_for(lambda: self.producer.stats.delivered == self.at, 20, "the record's delivery report")
            raise KeyboardInterrupt("from a signal handler")

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __len__(self) -> int:
        return len(self.real)


def _seqs(bootstrap: str, topic: str) -> Counter:
    total = sum(end_offsets(bootstrap, topic).values())
    records = read_topic(bootstrap, topic, expected=total, timeout_s=30)
    assert len(records) == total
    return Counter(decode(r.value)["run"]["facets"]["seq"]["i"] for r in records)


@pytest.mark.parametrize("reported", [True, False], ids=["report-came-first", "report-came-after"])
def test_an_emit_interrupted_after_produce_took_its_record_is_counted_once(kafka, tmp_path, reported):
    # Report first: the record is delivered already and is not placed again; it used to be
    # counted done twice (its report, then the rescue), so flush() waited its whole timeout
    # and returned -1 pending, and a later record could be thought acknowledged before it was.
    topic = kafka.new_topic("interrupted-after-produce")
    linger = "1" if reported else "2000"   # report after: still lingering in librdkafka at the exception
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties={**FAST_RECONNECT, "linger.ms": linger})
    try:
        p._producer = _RaisingAfterProduce(p._producer, p, at=3, reported=reported)
        interrupted = []
        for i in range(6):
            try:
                p.emit(seq_event(i))
            except KeyboardInterrupt:
                interrupted.append(i)
        assert interrupted == [2]
        assert p.flush(20) == 0
        assert p.pending == 0
        stats = p.stats
        # A copy placed again is delivered once more; the first copy's report is then ignored.
        assert stats.delivered == 6 and stats.emitted == 6 and stats.errors == 0, stats
    finally:
        p.close()
    sent = _seqs(kafka.bootstrap_servers, topic)
    assert set(sent) == set(range(6))
    # Sent twice only when the exception came before the report (at-least-once): never more.
    assert sent[2] == (1 if reported else 2) and all(sent[i] == 1 for i in (0, 1, 3, 4, 5)), sent


def _in_main_thread() -> None:
    # Signal handlers run on the main thread only; pytest (and its xdist workers) run tests there.
    assert threading.current_thread() is threading.main_thread()


@pytest.fixture
def on_sigusr1():
    """Installs a SIGUSR1 handler for the test (the previous one restored after)."""
    _in_main_thread()
    previous = signal.getsignal(signal.SIGUSR1)
    yield lambda handler: signal.signal(signal.SIGUSR1, handler)
    signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("nested", [1, 2], ids=["handler-emits", "handler-in-handler-emits"])
def test_a_handlers_emit_goes_after_the_emit_it_interrupted_before_its_lock(kafka, tmp_path, on_sigusr1, nested):
    # The handler runs while event 1 is being encoded (its emit() holds no lock yet): the
    # handler's event used to take the lock and reach Kafka ahead of event 1. A handler
    # interrupting the handler's own emit() the same way goes after both.
    topic = kafka.new_topic("handler-order")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties=FAST_RECONNECT, message_key="one-run")   # one key: one order
    encode, raised = p._encode, []

    def interrupting_encode(event: dict) -> bytes:
        i = event["run"]["facets"]["seq"]["i"]
        if (i == 1 or (i == 100 and nested == 2)) and i not in raised:
            raised.append(i)
            signal.raise_signal(signal.SIGUSR1)
        return encode(event)

    on_sigusr1(lambda *_: p.emit(seq_event(100 + len(raised) - 1)))
    p._encode = interrupting_encode
    try:
        for i in range(3):
            p.emit(seq_event(i))
        assert p.flush(20) == 0
    finally:
        p.close()
    handlers = [100, 101][:nested]
    assert _seqs_in_order(kafka.bootstrap_servers, topic) == [0, 1, *handlers, 2]


def test_a_handlers_emit_after_the_held_records_are_placed_is_not_left_behind(kafka, tmp_path, on_sigusr1):
    # The handler runs once event 1's emit() has placed its record and those held for it,
    # still holding the lock: the handler's record waits in the held-back queue, and was left
    # there when that emit() returned -- placed after event 2 (out of emit order), or, if the
    # sender's turn came first, journaled while in direct mode, sent only at the next journal
    # mode or by the next process (flush() waited its whole timeout for it).
    topic = kafka.new_topic("handler-after-held")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties=FAST_RECONNECT, message_key="one-run")   # one key: one order
    place_held, calls = p._place_held, []

    def interrupting_place_held(held):
        dropped = place_held(held)
        calls.append(held)
        if len(calls) == 2:   # event 1's, inside its emit()'s lock
            signal.raise_signal(signal.SIGUSR1)
        return dropped

    on_sigusr1(lambda *_: p.emit(seq_event(100)))
    p._place_held = interrupting_place_held
    try:
        p.emit(seq_event(0))
        p.emit(seq_event(1))
        left_behind = len(p._held_back)
        p.emit(seq_event(2))
        assert p.flush(20) == 0
    finally:
        p.close()
    assert left_behind == 0
    assert _seqs_in_order(kafka.bootstrap_servers, topic) == [0, 1, 100, 2]


class _SignalBeforeProduce:
    """librdkafka's producer raising SIGUSR1 right before it takes the record of event ``seq``."""

    def __init__(self, real, seq: int) -> None:
        self.real, self.seq, self.raised = real, seq, False

    def produce(self, *args) -> None:
        if not self.raised and decode(args[1])["run"]["facets"]["seq"]["i"] == self.seq:
            self.raised = True
            signal.raise_signal(signal.SIGUSR1)
        self.real.produce(*args)

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __len__(self) -> int:
        return len(self.real)


def test_a_handlers_emit_while_the_records_held_for_a_returned_emit_are_placed_goes_after_them(
        kafka, tmp_path, on_sigusr1):
    # Event 1 cannot be encoded, and a handler emitted event 100 while it was being encoded:
    # held for it, placed as its emit() returns (event 1 dropped), holding the lock, outside
    # any emit() call. A second handler's emit() there (event 101) took the re-entrant lock
    # and went ahead of event 100; it waits in the held-back queue now, placed right after.
    topic = kafka.new_topic("handler-in-release")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties=FAST_RECONNECT, message_key="one-run")   # one key: one order
    encode, handled = p._encode, []

    def failing_encode(event: dict) -> bytes:
        if event["run"]["facets"]["seq"]["i"] == 1:
            signal.raise_signal(signal.SIGUSR1)
            raise ValueError("cannot encode it")
        return encode(event)

    def handler(*_) -> None:
        n = 100 + len(handled)
        handled.append(n)
        p.emit(seq_event(n))

    on_sigusr1(handler)
    p._encode = failing_encode
    p._producer = _SignalBeforeProduce(p._producer, 100)
    try:
        for i in range(3):
            p.emit(seq_event(i))
        assert p.flush(20) == 0
    finally:
        p.close()
    assert handled == [100, 101] and p.stats.dropped == {"unencodable": 1}
    assert _seqs_in_order(kafka.bootstrap_servers, topic) == [0, 100, 101, 2]


def _seqs_in_order(bootstrap: str, topic: str) -> list[int]:
    total = sum(end_offsets(bootstrap, topic).values())
    records = read_topic(bootstrap, topic, expected=total, timeout_s=30)
    assert len(records) == total
    return [decode(r.value)["run"]["facets"]["seq"]["i"] for r in records]


def test_a_close_in_a_handler_that_interrupted_a_flushs_wait_stops_the_sender(kafka, tmp_path, on_sigusr1, caplog):
    # flush() waits on the producer's progress condition; a handler closing there held its
    # lock while the sender, ending its turn, waited for it to notify: the close waited 15 s
    # for the sender and gave up (close_incomplete), the records left in librdkafka.
    topic = kafka.new_topic("handler-in-flush")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties={**FAST_RECONNECT, "linger.ms": "3000"}, close_timeout_s=1.0)
    for i in range(20):
        p.emit(seq_event(i))
    wait, interrupted = p._progress.wait, []

    def interrupting_wait(timeout=None):
        if not interrupted:
            interrupted.append(True)
            signal.raise_signal(signal.SIGUSR1)
        return wait(timeout)

    on_sigusr1(lambda *_: p.close())
    p._progress.wait = interrupting_wait
    with caplog.at_level(logging.INFO, logger="producer.kafka"):
        p.flush(10)
    assert interrupted
    assert "event=close_incomplete" not in caplog.text
    assert not p._sender.is_alive()
    # What librdkafka held (lingering) was delivered or journaled; the next producer sends the rest.
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path) as adopter:
        assert adopter.flush(30) == 0
    assert set(_seqs_in_order(kafka.bootstrap_servers, topic)) == set(range(20))


@pytest.mark.parametrize("kafka_state", ["down", "up"])
def test_an_event_placed_after_a_lockless_close_is_counted_dropped(request, tmp_path, caplog, kafka_state):
    # This thread holds the lock, placing an event, past a close's budget (as one a long
    # signal handler interrupted there would): the sender's last turn journals without the
    # lock and stops. Kafka down: the event, appended to the spill queue after that drain,
    # used to stay in memory for ever, never journaled, never counted. Kafka up: it went on
    # to the librdkafka instance the close had just freed (an emit_failed error; one not yet
    # freed would have taken it, with nobody left to send it); it is refused as closed now.
    if kafka_state == "up":
        kafka = request.getfixturevalue("kafka")
        bootstrap, topic = kafka.bootstrap_servers, kafka.new_topic("late")
    else:
        bootstrap, topic = request.getfixturevalue("broker").bootstrap_servers, "late"
    p = LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=tmp_path,
                        properties=FAST_RECONNECT, close_timeout_s=0.2)
    for i in range(5):
        p.emit(seq_event(i))
    if kafka_state == "up":
        assert p.flush(20) == 0
    else:
        wait_for(lambda: p.stats.mode == "journal", 20, "journal mode (no broker)")
    closer = threading.Thread(target=p.close)
    refuses, checks = p._refuses, []
    # The close comes after the placing's last check before its append (down), or after its
    # first, before it chooses between librdkafka and the spill queue (up).
    close_at = 2 if kafka_state == "down" else 1

    def closing_meanwhile(thread, depth) -> bool:
        refused = refuses(thread, depth)
        if p._lock._is_owned():
            checks.append(refused)
            if len(checks) == close_at:
                closer.start()   # this thread holds the producer's lock all along
                closer.join(30)
        return refused

    p._refuses = closing_meanwhile
    with caplog.at_level(logging.INFO, logger="producer.kafka"):
        p.emit(seq_event(5))
    assert closer.ident is not None and not closer.is_alive()
    assert "event=close_without_lock" in caplog.text
    stats = p.stats
    assert stats.emitted == 6 and stats.errors == 1, stats   # the drop, and no emit_failed
    expected = "late_for_close" if kafka_state == "down" else "closed"
    assert stats.delivered + stats.journaled == 5 and stats.dropped == {expected: 1}, stats
    assert f"event=dropped reason={expected}" in caplog.text
