"""Every dropped event is counted and logged with its reason (rate-limited), no broker needed."""

from __future__ import annotations

import errno
import logging

import orjson
import pytest

from producer import LineageProducer, events
from producer import journal as journal_module
from producer import sender as sender_module
from producer.event_values import NotAnEvent, as_event
from producer.journal import Journal
from producer.keys import message_key
from producer.orphans import adopt_orphans
from producer.sender import _should_log
from tests.producer.support import wait_for


def test_an_emit_after_close_is_counted_and_logged(tmp_path, caplog):
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path)
    producer.close(0)
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer.emit(events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name="j"))
    assert producer.stats.dropped == {"closed": 1}
    assert any("event=dropped reason=closed" in r.getMessage() for r in caplog.records)


def test_drop_logging_is_rate_limited_also_for_many_at_once():
    assert [c for c in range(1, 2001) if _should_log(c)] == [*range(1, 11), 1000, 2000]
    # lost_in_fatal_producer drops many at once: logged when the run reaches the first ten
    # or crosses a thousand, whatever its size.
    assert _should_log(500, 500) and _should_log(1005, 10) and _should_log(4000, 3000)
    assert not _should_log(990, 5) and not _should_log(1500, 400)


def test_a_value_that_is_not_an_event_is_dropped_never_queued(tmp_path, caplog):
    """emit() never raises: None, a number, a list, text that is not a JSON object are
    counted and logged as not_an_event and never reach the journal (the relay would only
    dead-letter them). A dict, JSON object text and an openlineage-python event are events."""
    caplog.set_level(logging.ERROR, "producer.kafka")
    event = events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name="j")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path)
    try:
        for bad in (None, 42, "not json", b"\xff\xfe", "[1, 2]", [event], object()):
            producer.emit(bad)
        assert producer.stats.dropped == {"not_an_event": 7} and producer.pending == 0
        producer.emit(event)
        producer.emit(orjson.dumps(event).decode())
        producer.emit(orjson.dumps(event))
        assert producer.stats.dropped == {"not_an_event": 7}
        # A record moving to the journal (the broker is unreachable) counts in both places for
        # a moment: pending errs high, never low.
        wait_for(lambda: producer.pending == 3, 10, "the three events pending")
    finally:
        producer.close(0)
    lines = [r.getMessage() for r in caplog.records if "reason=not_an_event" in r.getMessage()]
    assert len(lines) == 7 and "detail=NoneType is not an OpenLineage event" in lines[0]
    assert producer.stats.journaled == 3


def test_an_openlineage_python_event_object_is_an_event():
    pytest.importorskip("openlineage.client")
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    run_id = events.new_run_id()
    obj = RunEvent(eventType=RunState.START, eventTime="2024-01-01T00:00:00+00:00", run=Run(runId=run_id),
                   job=Job(namespace="ns", name="j"), producer="https://example.com/p")
    doc = as_event(obj)
    assert doc["run"]["runId"] == run_id and doc["eventType"] == "START" and message_key(doc) == "run:ns/j"
    with pytest.raises(NotAnEvent, match="^EventType is not an OpenLineage event"):
        as_event(RunState.START)


def test_an_event_given_as_json_text_keeps_its_integers_beyond_64_bits():
    text = ('{"eventType":"START","eventTime":"2024-01-01T00:00:00Z","producer":"https://p","schemaURL":"https://s",'
            '"run":{"runId":"3f5e83fa-3480-44ff-99c5-ff943904e5e8","facets":{"stats":{"_producer":"https://p",'
            '"_schemaURL":"https://s","rows":1180591620717411303425,"small":-9223372036854775809,"f":1.5}}},'
            '"job":{"namespace":"n","name":"j"}}')
    for value in (text, text.encode(), bytearray(text.encode()), memoryview(text.encode())):
        stats = as_event(value)["run"]["facets"]["stats"]
        assert stats == {"_producer": "https://p", "_schemaURL": "https://s", "rows": 1180591620717411303425,
                         "small": -9223372036854775809, "f": 1.5}
        assert type(stats["rows"]) is int and type(stats["small"]) is int
    assert as_event('{"n": 18446744073709551615}') == {"n": 18446744073709551615}
    with pytest.raises(NotAnEvent, match="not JSON text"):
        as_event('{"n": 1180591620717411303425')


def _job_event(name: str) -> dict:
    return events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name=name)


def test_a_key_too_long_for_a_journal_record_is_dropped_at_emit_and_the_rest_journaled(tmp_path, caplog):
    """A key over 65,534 bytes (a job name of 70,000 characters; the value is far under
    message.max.bytes) does not fit a journal record's key length: emit() drops it as
    too_large, the detail naming the key. The events around it are journaled, and none is
    left in transit (pending is exact: flush() and close() do not wait for it)."""
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=1)
    try:
        for i in range(3):
            producer.emit(_job_event(f"job{i}"))
        producer.emit(_job_event("x" * 70_000))
        for i in range(3, 6):
            producer.emit(_job_event(f"job{i}"))
        assert producer.stats.dropped == {"too_large": 1}, producer.stats
        wait_for(lambda: producer.stats.journaled == 6, 10, "the six other events journaled")
        assert producer.pending == 6 and producer.stats.dropped == {"too_large": 1}, producer.stats
    finally:
        producer.close(0)
    lines = [r.getMessage() for r in caplog.records if "reason=too_large" in r.getMessage()]
    assert len(lines) == 1 and "a key of 70007 bytes" in lines[0], lines


def test_a_journal_append_failing_in_any_way_counts_the_batch_dropped_and_leaves_nothing_in_transit(
        tmp_path, monkeypatch, caplog):
    """Whatever the journal's append raises (not only an OSError), every record of the batch
    is counted, journal_write_failed, and logged; none stays in transit, so pending goes back
    to 0 and close() does not wait its whole budget for records that are gone."""
    def broken(self, records):  # noqa: ANN001, ANN202
        raise RuntimeError("unexpected")
    monkeypatch.setattr(Journal, "append", broken)
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=1)
    try:
        for i in range(5):
            producer.emit(_job_event(f"job{i}"))
        wait_for(lambda: producer.stats.dropped.get("journal_write_failed") == 5, 10, "five drops counted")
        wait_for(lambda: producer.pending == 0, 10, "nothing pending")
        assert producer.stats.journaled == 0 and producer.flush(0) == 0, producer.stats
    finally:
        producer.close(0)
    assert any("event=journal_write_failed" in r.getMessage() and "unexpected" in r.getMessage()
               for r in caplog.records)


def test_an_append_failing_part_way_counts_journaled_what_is_on_disk_and_dropped_the_rest(tmp_path, monkeypatch):
    """The journal's disk fails on the 2nd record written (ENOSPC): the record before it is
    on disk and counted journaled; the rest of that batch is counted dropped,
    journal_write_failed; nothing on disk is counted dropped, nothing counted journaled is missing."""
    real_write_all, calls = journal_module._write_all, [0]

    def failing_once(fd, data):  # noqa: ANN001, ANN202
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_all(fd, data)
    monkeypatch.setattr(journal_module, "_write_all", failing_once)
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=1)
    try:
        for i in range(5):
            producer.emit(_job_event(f"job{i}"))
        wait_for(lambda: producer.stats.journaled + producer.stats.dropped.get("journal_write_failed", 0) == 5, 10,
                 "every event journaled or dropped")
        stats = producer.stats
        assert stats.journaled >= 1 and stats.dropped["journal_write_failed"] >= 1, stats
        assert producer.pending == stats.journaled, stats
    finally:
        producer.close(0)
    left = adopt_orphans(tmp_path, max_bytes=1 << 30, segment_bytes=1 << 20)
    try:
        assert sum(journal.pending for journal in left) == stats.journaled
    finally:
        for journal in left:
            journal.close()


def test_a_journal_that_cannot_be_written_logs_its_failures_rate_limited_and_counts_them_all(
        tmp_path, monkeypatch, caplog):
    """The disk fills while Kafka is down: every batch the journal is handed then fails. Each
    is counted (journal_write_failed, exactly), but logged as drops are, the first ten and
    then every thousandth: a job emitting steadily must not flood the log with ERROR lines."""
    real_write_all, written = journal_module._write_all, []

    def full_after_one(fd, data):  # noqa: ANN001, ANN202
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(data)
        return real_write_all(fd, data)
    monkeypatch.setattr(journal_module, "_write_all", full_after_one)
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=1)
    dropped = lambda: producer.stats.dropped.get("journal_write_failed", 0)  # noqa: E731
    try:
        producer.emit(_job_event("first"))   # journaled: the producer stays in journal mode
        wait_for(lambda: producer.stats.journaled == 1, 20, "the first event journaled")
        for i in range(30):   # one batch each: the next event once the last one is counted
            producer.emit(_job_event(f"job{i}"))
            wait_for(lambda: dropped() == i + 1, 10, f"drop {i + 1}")
        assert producer.pending == 1, producer.stats
    finally:
        producer.close(0)
    lines = [r.getMessage() for r in caplog.records]
    failures = [m for m in lines if m.startswith("event=journal_write_failed")]
    drops = [m for m in lines if m.startswith("event=dropped reason=journal_write_failed")]
    assert len(failures) == 10 and len(drops) == 10, (len(failures), len(drops))
    assert "count=10 dropped_now=1" in drops[-1], drops[-1]
    assert producer.stats.dropped == {"journal_write_failed": 30}


def test_a_second_disk_full_after_writes_recovered_logs_its_first_drops_again(tmp_path, monkeypatch, caplog):
    """A long-lived driver: the disk fills (more than ten drops), space comes back, days later
    it fills again. The second incident logs its first drops as the first did, not only at
    the next thousand; the recovery is logged once, with what the first incident cost."""
    real_write_all, full = journal_module._write_all, [False]

    def write_all(fd, data):  # noqa: ANN001, ANN202
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_all(fd, data)
    monkeypatch.setattr(journal_module, "_write_all", write_all)
    monkeypatch.setattr(sender_module, "INCIDENT_QUIET_S", 0.0)   # space came back for good
    caplog.set_level(logging.WARNING, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=1)
    dropped = lambda: producer.stats.dropped.get("journal_write_failed", 0)  # noqa: E731
    try:
        producer.emit(_job_event("first"))
        wait_for(lambda: producer.stats.journaled == 1, 20, "the first event journaled")
        full[0] = True
        for i in range(15):
            producer.emit(_job_event(f"job{i}"))
            wait_for(lambda: dropped() == i + 1, 10, f"drop {i + 1}")
        full[0] = False
        producer.emit(_job_event("space again"))
        wait_for(lambda: producer.stats.journaled == 2, 10, "journaled again")
        full[0] = True
        for i in range(3):
            producer.emit(_job_event(f"later{i}"))
            wait_for(lambda: dropped() == 16 + i, 10, f"drop {16 + i}")
    finally:
        full[0] = False
        producer.close(0)
    lines = [r.getMessage() for r in caplog.records]
    drops = [m for m in lines if m.startswith("event=dropped reason=journal_write_failed")]
    failures = [m for m in lines if m.startswith("event=journal_write_failed")]
    recovered = [m for m in lines if m.startswith("event=journal_writes_recovered")]
    assert len(drops) == 10 + 3 and len(failures) == 10 + 3, (len(drops), len(failures))
    assert "count=18 dropped_now=1" in drops[-1], drops[-1]
    assert len(recovered) == 1, recovered
    assert "failures=15" in recovered[0] and "dropped_journal_write_failed=15" in recovered[0], recovered
    assert producer.stats.dropped == {"journal_write_failed": 18}


class _FlappingJournal:
    """A journal at its journal_max_bytes while replay frees a little: every other batch fits."""

    max_bytes = 0
    size_bytes = 0

    def __init__(self) -> None:
        self.appends = 0

    def append(self, batch):  # noqa: ANN001, ANN201
        self.appends += 1
        return len(batch) if self.appends % 2 == 0 else 0


def test_a_journal_flapping_at_its_size_limit_logs_its_drops_rate_limited_and_recovers_nothing(tmp_path, caplog):
    """journal_full is no write failure that recovers: batches that fit between ones that do
    not end nothing, and the plain drop rate limit holds (first ten, then every thousandth)."""
    caplog.set_level(logging.INFO, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=0)
    producer.close()   # its sender thread is done: batches are appended from here
    journal = _FlappingJournal()
    for _ in range(2000):
        producer._append_counted(lambda: journal, [(b"k", b"v")] * 5)
    lines = [r.getMessage() for r in caplog.records if "journal" in r.getMessage()]
    assert not [m for m in lines if "recovered" in m], lines[:4]
    assert len([m for m in lines if m.startswith("event=dropped reason=journal_full")]) <= 10 + 5, lines[:4]
    assert producer.stats.dropped == {"journal_full": 5000}


def test_writes_recover_once_the_failures_have_stayed_away_a_while_not_at_each_write_between_them(
        tmp_path, monkeypatch, caplog):
    """A disk that fails every other write is one incident: one recovered line, once writes
    have gone through for INCIDENT_QUIET_S with no failure, with every failure it counted."""
    now = [1000.0]
    monkeypatch.setattr(sender_module, "_now", lambda: now[0], raising=False)
    quiet_s = getattr(sender_module, "INCIDENT_QUIET_S", 60.0)
    caplog.set_level(logging.WARNING, "producer.kafka")
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path, close_timeout_s=0)
    producer.close()

    class Failing(_FlappingJournal):
        def append(self, batch):  # noqa: ANN001, ANN201
            self.appends += 1
            if self.appends % 2:
                raise OSError(errno.EIO, "Input/output error")
            return len(batch)
    journal = Failing()
    for _ in range(200):
        producer._append_counted(lambda: journal, [(b"k", b"v")])
        now[0] += 0.1
    recovered = lambda: [r.getMessage() for r in caplog.records  # noqa: E731
                         if r.getMessage().startswith("event=journal_writes_recovered")]
    assert recovered() == []
    journal.appends = 1   # the next write goes through
    now[0] += quiet_s
    producer._append_counted(lambda: journal, [(b"k", b"v")])
    assert len(recovered()) == 1 and "failures=100" in recovered()[0], recovered()
    producer._append_counted(lambda: journal, [(b"k", b"v")])
    assert len(recovered()) == 1, "once per incident"
