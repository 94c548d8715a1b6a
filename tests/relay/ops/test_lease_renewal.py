"""A redrive lease (relay.ops.redrive_lock) against a lock log kept in memory. The holder's
heartbeat (``RedriveLock._beat``): only one read back as the last record extends the
lease; a takeover, a log that went back (topic deleted or replaced) or a second heartbeat
of another redrive loses it. Its release: written after a heartbeat in flight, and after a
claim that counted too late. The claimant: heartbeats with no claim before them (a log
deleted under its holder) are watched like a held lease, not claimed at once."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import pytest

from relay.ops import OpsError
from relay.ops.lock_view import LockRecord, LockView
from relay.ops.redrive_lock import LeaseLost, LeaseTiming, LockHeld, RedriveLock
from tests.support.relay import relay_config

TIMING = LeaseTiming(heartbeat_s=2.0, holder_s=10.0, takeover_s=20.0)


class MemoryLog:
    """The lock topic's one partition: records with their offsets."""

    def __init__(self, first_offset: int = 0) -> None:
        self.records: list[LockRecord] = []
        self.next = first_offset
        #: Replaces the record produced before it is stored (a broker that loses or alters it).
        self.alter = None

    def append(self, record: LockRecord) -> int:
        offset = self.next
        self.next += 1
        stored = replace(record, offset=offset)
        self.records.append(stored if self.alter is None else self.alter(stored))
        return offset

    def read(self, start: int, end: int, deadline: float | None = None) -> list[LockRecord]:
        return [r for r in self.records if start <= r.offset < end]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def on_log(log: MemoryLog, timing: LeaseTiming = TIMING, **kwargs) -> RedriveLock:
    """A lock whose topic is ``log``."""
    kafka = relay_config("127.0.0.1:9", "t", {"a": "http://127.0.0.1:9"}, group="g", dlq="d").kafka
    lock = RedriveLock(kafka, timing=timing, **kwargs)
    lock._open = lambda: None  # type: ignore[method-assign]
    lock._end = lambda: (0, log.next)  # type: ignore[method-assign]
    lock._produce = lambda record, timeout_s=0.0: log.append(record)  # type: ignore[method-assign]
    lock._read = log.read  # type: ignore[method-assign]
    return lock


def holding(log: MemoryLog, clock: Clock) -> RedriveLock:
    """A lock that claimed the lease in ``log`` just now (what ``acquire`` leaves)."""
    lock = on_log(log, clock=clock)
    log.append(replace(lock.me, after=log.next - 1))
    lock._view = LockView.starting_at(0, from_log_start=True)
    lock._view.apply_all(log.read(0, log.next))
    lock._valid_until = clock() + TIMING.holder_s
    return lock


def other(holder: str, op: str = "heartbeat", **fields) -> LockRecord:
    return LockRecord(op=op, holder=holder, host="elsewhere", pid=4242, since="then", **fields)


def test_a_heartbeat_read_back_last_extends_the_lease():
    log, clock = MemoryLog(), Clock()
    lock = holding(log, clock)
    clock.now += 3
    end = lock._beat(lock._view.end)
    assert end == log.next == 2 and lock._valid_until == clock.now + TIMING.holder_s
    lock.check()


def test_a_counting_claim_of_another_redrive_before_the_heartbeat_takes_the_lease_over():
    log, clock = MemoryLog(), Clock()
    lock = holding(log, clock)
    end = lock._view.end
    log.append(other("b", op="claim", after=end - 1))
    with pytest.raises(LeaseLost, match=r"was taken over by the redrive of host elsewhere, pid 4242") as lost:
        lock._beat(end)
    assert lost.value.taken_by is not None and lost.value.taken_by.holder == "b"


def test_a_heartbeat_landing_before_the_known_end_means_a_new_log_and_loses_the_lease():
    """The topic was deleted and created again: the new log is shorter than the one the
    holder read. Another redrive may have claimed it (or soon will) without this one seeing."""
    log, clock = MemoryLog(), Clock()
    lock = holding(log, clock)
    for _ in range(5):
        end = lock._beat(lock._view.end)
    fresh = MemoryLog()
    lock._produce = lambda record, timeout_s=0.0: fresh.append(record)  # type: ignore[method-assign]
    lock._read = fresh.read  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match="went back .* the topic was deleted or replaced.*; do not delete or alter "
                                        "d.redrive-lock while a redrive runs"):
        lock._beat(end)


def test_a_heartbeat_not_read_back_as_the_last_record_does_not_extend_the_lease():
    """A log that does not hold the heartbeat where it was acknowledged (replaced, altered)
    vouches for nothing: the lease runs out unless a later heartbeat is found in place."""
    log, clock = MemoryLog(), Clock()
    lock = holding(log, clock)
    before = lock._valid_until
    log.alter = lambda stored: replace(stored, seq=stored.seq + 7)
    clock.now += 3
    lock._beat(lock._view.end)
    assert lock._valid_until == before
    clock.now = before
    with pytest.raises(LeaseLost, match="ran out"):
        lock.check()


def test_two_heartbeats_of_another_redrive_under_this_holder_lose_the_lease():
    """Two redrives each believe they hold it (a new log claimed by one, the other's end
    coinciding): each sees the other's heartbeats, and gives the lease up."""
    log, clock = MemoryLog(), Clock()
    lock = holding(log, clock)
    log.append(other("b"))
    end = lock._beat(lock._view.end)  # one: a holder taken over may write one
    log.append(other("b"))
    with pytest.raises(LeaseLost, match="writes heartbeats to the redrive lock .* as if it held it.*; do not "
                                        "delete or alter d.redrive-lock while a redrive runs"):
        lock._beat(end)


class Client:
    """Stands for the lock's producer and consumer: whether it was closed (or purged)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    purge = close


def test_a_release_while_a_heartbeat_is_in_flight_is_written_after_it_and_loses_nothing(monkeypatch, caplog):
    """``release()`` stops waiting for the renewal after ``_RELEASE_S`` while its heartbeat
    is still unacknowledged. The release is still written, after the heartbeat (a
    producer writes in the order produced); the renewal then ends without reporting a
    lost lease, and the clients it uses stay open while it lives."""
    caplog.set_level(logging.WARNING, logger="relay.ops.redrive_lock")
    monkeypatch.setattr("relay.ops.redrive_lock._RELEASE_S", 0.2)
    log = MemoryLog()
    lock = on_log(log, LeaseTiming(heartbeat_s=0.05, holder_s=60.0, takeover_s=120.0))
    producer, consumer = Client(), Client()
    in_order = threading.Lock()
    beat_sent, beat_answered, release_sent = threading.Event(), threading.Event(), threading.Event()
    open_in_beat: list[bool] = []

    def produce(record: LockRecord, timeout_s: float = 0.0) -> int:
        if record.op == "release":
            release_sent.set()
        assert in_order.acquire(timeout=60)
        try:
            if record.op == "heartbeat":
                beat_sent.set()
                assert beat_answered.wait(60)
                open_in_beat.append(not producer.closed and not consumer.closed)
            return log.append(record)
        finally:
            in_order.release()

    lock._produce = produce  # type: ignore[method-assign]
    lock.acquire()
    lock._producer, lock._consumer = producer, consumer  # type: ignore[assignment]
    renewal = lock._thread
    assert renewal is not None and beat_sent.wait(60)
    releasing = threading.Thread(target=lock.release, daemon=True)
    releasing.start()
    assert release_sent.wait(30), "no release written while the heartbeat was in flight"
    assert renewal.is_alive()
    beat_answered.set()
    releasing.join(60)
    renewal.join(60)
    assert not releasing.is_alive() and not renewal.is_alive()
    assert [r.op for r in log.records] == ["claim", "heartbeat", "release"]
    assert open_in_beat == [True], "a client was closed under the renewal"
    assert not producer.closed and not consumer.closed, "closed although the renewal was alive at release"
    assert "redrive_lease_lost" not in [r.getMessage() for r in caplog.records], caplog.records


def test_a_release_after_the_renewal_ended_closes_the_clients():
    log = MemoryLog()
    lock = on_log(log, LeaseTiming(heartbeat_s=0.05, holder_s=60.0, takeover_s=120.0))
    lock.acquire()
    producer, consumer = Client(), Client()
    lock._producer, lock._consumer = producer, consumer  # type: ignore[assignment]
    lock.release()
    assert log.records[-1].op == "release" and producer.closed and consumer.closed


def test_a_claim_that_counted_too_late_is_released_before_the_redrive_fails():
    """The claim was acknowledged after ``holder_s``: the redrive gives up, but writes a
    release, so that the next one claims at once instead of waiting ``takeover_s``."""
    log, clock = MemoryLog(), Clock()
    lock = on_log(log, clock=clock)

    def slow(record: LockRecord, timeout_s: float = 0.0) -> int:
        if record.op == "claim":
            clock.now += TIMING.holder_s
        return log.append(record)

    lock._produce = slow  # type: ignore[method-assign]
    with pytest.raises(OpsError, match=r"claiming the redrive lock d.redrive-lock took over 10s .*; run again"):
        lock.acquire()
    assert [(r.op, r.holder) for r in log.records] == [("claim", lock.me.holder), ("release", lock.me.holder)]
    said: list[str] = []
    again = on_log(log, clock=clock, say=said.append)
    again.acquire()
    try:
        assert said == [] and log.records[-1].op == "claim" and log.records[-1].holder == again.me.holder
    finally:
        again.release()


def test_the_lock_clients_do_not_create_the_lock_topic(monkeypatch):
    """A lock topic deleted under its holder must make its heartbeats fail (the lease runs
    out), not come back empty for another redrive to claim, whatever the relay's
    properties say."""
    confs: dict[str, dict] = {}
    monkeypatch.setattr("relay.ops.redrive_lock.ensure_lock_topic", lambda kafka, topic: None)
    monkeypatch.setattr("relay.ops.kafka_range.Consumer", lambda conf: confs.setdefault("consumer", conf))
    monkeypatch.setattr("relay.ops.redrive_lock.Producer", lambda conf: confs.setdefault("producer", conf))
    kafka = relay_config("127.0.0.1:9", "t", {"a": "http://127.0.0.1:9"}, group="g", dlq="d").kafka
    kafka = kafka.model_copy(update={"consumer_properties": {"allow.auto.create.topics": "true"},
                                     "producer_properties": {"allow.auto.create.topics": "true"}})
    RedriveLock(kafka)._open()
    assert confs["producer"]["allow.auto.create.topics"] is False, confs
    assert confs["consumer"]["allow.auto.create.topics"] is False, confs


#: Short, for the claimant tests that wait for real (the watch polls every heartbeat_s / 2).
QUICK = LeaseTiming(heartbeat_s=0.05, holder_s=0.5, takeover_s=1.0)


def test_heartbeats_with_no_claim_before_them_are_watched_before_the_lease_is_claimed():
    """The log was deleted under holder ``a``: the new one holds only its heartbeats. The
    claimant waits ``takeover_s`` of silence first, then claims after them."""
    log = MemoryLog()
    log.append(other("a"))
    log.append(other("a"))
    said: list[str] = []
    lock = on_log(log, QUICK, say=said.append)
    started = time.monotonic()
    lock.acquire()
    try:
        assert time.monotonic() - started >= QUICK.takeover_s
        assert "held by a redrive whose claim is not in its log" in said[0], said
        claim = log.records[2]
        assert claim.op == "claim" and claim.holder == lock.me.holder and claim.after == 1
    finally:
        lock.release()


def test_a_heartbeat_while_watching_a_claimless_lease_refuses_naming_its_writer():
    log = MemoryLog()
    log.append(other("a"))
    lock = on_log(log, QUICK)
    ends = 0

    def end() -> tuple[int, int]:
        nonlocal ends
        ends += 1
        if ends == 3:  # the holder of the deleted log lives: its next heartbeat
            log.append(other("a"))
        return 0, log.next

    lock._end = end  # type: ignore[method-assign]
    with pytest.raises(LockHeld, match="another redrive of this dead-letter topic is running: host elsewhere, "
                                       "pid 4242"):
        lock.acquire()
    assert [r.op for r in log.records] == ["heartbeat", "heartbeat"], "it claimed nothing"


@pytest.mark.parametrize("times", [dict(heartbeat_s=10.0, holder_s=10.0, takeover_s=20.0),
                                   dict(heartbeat_s=2.0, holder_s=20.0, takeover_s=20.0),
                                   dict(heartbeat_s=0.0, holder_s=10.0, takeover_s=20.0)])
def test_lease_times_must_keep_their_order(times):
    with pytest.raises(ValueError, match="0 < heartbeat_s < holder_s < takeover_s"):
        LeaseTiming(**times)
