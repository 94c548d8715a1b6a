"""DecodeWorker: decode_record's answers from a child process, and never a lost batch."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime

import orjson
import psutil
import pytest

from producer.codec import avro
from relay import logs
from relay.embedded.sample import spark_run
from relay.events import LineageEvent, Rejection
from relay.stages import decode_pipe, decode_worker
from relay.stages.decode import AVRO_MARKER, decode_record
from relay.stages.decode_worker import DecodeWorker

MAX = 1 << 20


def values() -> list[bytes | None]:
    """Valid run events (JSON and Avro), and one record for each kind of rejection."""
    events = spark_run("spark-prod", "etl.orders", start=datetime(2024, 5, 1, tzinfo=UTC), rng=random.Random(3))
    good = [orjson.dumps(e) for e in events]
    return [
        *good,
        avro.encode(events[0]),
        None,
        b"",
        b"\xff\xfe not utf-8",
        b'{"eventTime": ',
        b"[1, 2]",
        orjson.dumps({**events[0], "eventType": "DONE"}),
        b"x" * (MAX + 1),
        good[1],  # a duplicate: same answer twice
        # the event time crosses the pipe as text: offset and truncated nanoseconds kept
        orjson.dumps({**events[1], "eventTime": "2024-05-01t12:00:00.123456789+02:00"}),
    ]


def same(got: LineageEvent | Rejection, want: LineageEvent | Rejection) -> bool:
    if type(want) is Rejection:
        return got == want
    want.doc = None
    return type(got) is LineageEvent and all(
        getattr(got, f) == getattr(want, f) for f in LineageEvent.__dataclass_fields__) \
        and got.event_time.utcoffset() == want.event_time.utcoffset()


def decode_all(worker: DecodeWorker, batch: list[bytes | None]) -> list:
    worker.start()
    try:
        return worker.decode(batch)
    finally:
        worker.close()


class Answer:
    """What :meth:`DecodeWorker.submit` hands over, once it has."""

    def __init__(self, worker: DecodeWorker, batch: list[bytes | None]) -> None:
        self._done = threading.Event()
        self._results: list = []
        worker.submit(batch, self._set)

    def _set(self, results: list) -> None:
        self._results = results
        self._done.set()

    def result(self, timeout: float) -> list:
        assert self._done.wait(timeout), "no answer"
        return self._results


def test_answers_exactly_what_decode_record_does():
    batch = values()
    got = decode_all(DecodeWorker(max_bytes=MAX), batch)
    assert len(got) == len(batch)
    for value, result in zip(batch, got):
        assert same(result, decode_record(value, max_bytes=MAX)), value[:80] if value else value
    # JSON events keep the record's own bytes; Avro ones carry their JSON re-encoding.
    assert got[0].body is batch[0]
    avro_at = next(i for i, v in enumerate(batch) if v and v.startswith(AVRO_MARKER))
    assert orjson.loads(got[avro_at].body) == orjson.loads(batch[0])


def test_batches_over_the_chunk_size_go_in_several_chunks(monkeypatch):
    sent: list[int] = []
    real = decode_worker.write_values
    monkeypatch.setattr(decode_worker, "write_values", lambda pipe, vs: sent.append(len(vs)) or real(pipe, vs))
    batch = values()[:4] * 50
    size = sum(len(v) for v in batch[:4])
    got = decode_all(DecodeWorker(max_bytes=MAX, chunk_bytes=size * 10), batch)
    assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(got, batch)] == [True] * len(batch)
    assert len(sent) == 5 and sum(sent) == len(batch)


def test_a_dead_child_costs_nothing_but_a_log_line(caplog):
    batch = values()

    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        first = worker.decode(batch)
        child = worker._proc
        child.kill()
        child.wait()
        # The batch the death interrupts is decoded here; the next gets a new child.
        second = worker.decode(batch)
        third = worker.decode(batch)
        got, pids, in_process = first + second + third, [child.pid, worker._proc.pid], worker.in_process
    finally:
        worker.close()
    want = [decode_record(v, max_bytes=MAX) for v in batch] * 3
    assert [same(g, w) for g, w in zip(got, want)] == [True] * len(want)
    assert pids[0] != pids[1] and not in_process
    assert "decode_worker_failed" in caplog.text


def test_the_child_exits_with_its_parent_input():
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    pid = worker._proc.pid
    assert worker.pids == [pid]  # what the throughput bench reads the CPU of
    worker.close()
    assert worker.pids == []
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(pid).status()


def test_batches_in_flight_at_once_are_answered_in_order_by_several_children():
    batches = [values()[:4] * (i + 1) for i in range(6)]
    worker = DecodeWorker(max_bytes=MAX, processes=2)
    worker.start()
    try:
        futures = [Answer(worker, b) for b in batches]  # none waited for before the last is sent
        pids = {child.proc.pid for child in worker._children}
        got = [f.result(timeout=30) for f in futures]
    finally:
        worker.close()
    assert len(pids) == 2
    for batch, answers in zip(batches, got):
        assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(answers, batch)] == [True] * len(batch)
        assert len(answers) == len(batch)


def test_a_child_reading_ahead_never_decodes_a_chunk_overwritten_by_the_next():
    """One child, many batches of many chunks in flight: it reads the next chunk while it
    decodes one, into the other of two reused buffers. Each event is distinct (its own run
    id and size), so a buffer refilled under the decoder would give a wrong answer."""
    rng = random.Random(7)
    base = orjson.loads(values()[0])
    batches = []
    for b in range(12):
        batch = []
        for i in range(40):
            event = {**base, "run": {**base["run"], "runId": f"{b:08x}-0000-4000-8000-{i:012x}"},
                     "padding": "x" * rng.randrange(0, 3000)}
            batch.append(orjson.dumps(event))
        batches.append(batch)
    worker = DecodeWorker(max_bytes=MAX, chunk_bytes=16 * 1024)  # several chunks per batch
    worker.start()
    try:
        futures = [Answer(worker, b) for b in batches]  # none waited for before the last is sent
        got = [f.result(timeout=30) for f in futures]
        pids = worker.pids
    finally:
        worker.close()
    assert len(pids) == 1
    for batch, answers in zip(batches, got):
        assert len(answers) == len(batch)
        assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(answers, batch)] == [True] * len(batch)


def test_a_child_killed_with_batches_in_flight_loses_none_of_them(caplog):
    small = [v for v in values() if v is None or len(v) <= MAX]  # so that five fit in the pipe
    batches = [small for _ in range(5)]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        child = worker._proc
        child.send_signal(signal.SIGSTOP)  # it answers nothing sent from now on
        futures = [Answer(worker, b) for b in batches[:2]]
        child.kill()
        futures += [Answer(worker, b) for b in batches[2:]]
        got = [f.result(timeout=30) for f in futures]
        got.append(worker.decode(small))  # once the death is seen, a new child serves
        replaced = worker._proc.pid != child.pid
    finally:
        worker.close()
    want = [decode_record(v, max_bytes=MAX) for v in batches[0]]
    for answers in got:
        assert [same(g, w) for g, w in zip(answers, want)] == [True] * len(want)
    assert replaced and not worker.in_process
    assert "decode_worker_failed" in caplog.text


def test_a_killed_child_not_gone_in_time_still_has_its_batches_answered(monkeypatch, caplog):
    """On a loaded machine a killed child can outlive reap()'s waits: the reader thread must
    not die of it (it would leave the child's batches unanswered and the pipeline stuck)."""
    small = [v for v in values() if v is None or len(v) <= MAX]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        child = worker._proc
        real_wait = subprocess.Popen.wait
        waits: list[float | None] = []

        def wait_not_gone(proc: subprocess.Popen, timeout: float | None = None):
            if proc.pid != child.pid:
                return real_wait(proc, timeout)
            waits.append(timeout)
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)

        monkeypatch.setattr(subprocess.Popen, "wait", wait_not_gone)
        child.send_signal(signal.SIGSTOP)  # it answers nothing sent from now on
        futures = [Answer(worker, small) for _ in range(2)]
        child.kill()
        got = [f.result(timeout=60) for f in futures]
        got.append(worker.decode(small))  # a new child serves
        replaced = worker._proc.pid != child.pid
    finally:
        monkeypatch.undo()
        worker.close()
    want = [decode_record(v, max_bytes=MAX) for v in small]
    for answers in got:
        assert [same(g, w) for g, w in zip(answers, want)] == [True] * len(want)
    assert replaced and waits, "reap() never waited on the killed child"
    assert "decode_worker_failed" in caplog.text
    assert real_wait(child, 30) == -signal.SIGKILL  # it was killed, and is reaped now


@pytest.mark.parametrize("priority", ["low", "idle"])
def test_the_child_runs_at_the_priority_asked_and_decodes_the_same(priority):
    worker = DecodeWorker(max_bytes=MAX, priority=priority)
    worker.start()
    try:
        vals = values()
        got = worker.decode(vals)
        assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(got, vals)] == [True] * len(vals)
        assert not worker.in_process
        pid = worker._proc.pid
        assert os.getpriority(os.PRIO_PROCESS, pid) >= decode_worker._NICE
        # "idle": only CPU nobody else wants; "low": a normal, lower-priority process.
        assert os.sched_getscheduler(pid) == (os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER)
    finally:
        worker.close()


def test_an_unknown_priority_is_refused():
    with pytest.raises(ValueError, match="priority"):
        DecodeWorker(max_bytes=MAX, priority="realtime")


@pytest.mark.parametrize("inbox", [False, True], ids=["bytes", "inbox"])
@pytest.mark.parametrize("writer", ["writev", "partial writev", "no writev"])
def test_values_cross_the_pipe_unchanged_however_the_kernel_takes_them(monkeypatch, writer, inbox):
    if writer == "partial writev":
        def stingy_writev(fd, buffers):  # takes at most 1000 bytes per call, as a busy pipe may
            return os.write(fd, b"".join(bytes(b) for b in buffers)[:1000])
        monkeypatch.setattr(decode_pipe, "_writev", stingy_writev)
    elif writer == "no writev":
        monkeypatch.setattr(decode_pipe, "_writev", None)
    # Small values on both sides of a large one: with an inbox (the child's reused buffer),
    # the two runs of small values must not share its bytes.
    batches = [[b"a" * 10, None, b"", b"b" * (decode_pipe.JOIN_BELOW + 7), b"c", b"d" * 70_000, None],
               [b"e" * 100_000, b"f" * 3, b"g" * (decode_pipe.JOIN_BELOW + 1), b"h" * 50]]
    read_fd, write_fd = os.pipe()
    got: list = []
    box = decode_pipe.Inbox() if inbox else None

    def read_all() -> None:  # each batch copied out before the next is read (into the same inbox)
        for _ in batches:
            got.append([None if v is None else bytes(v) for v in decode_pipe.read_values(inp, box)])

    with os.fdopen(read_fd, "rb") as inp, os.fdopen(write_fd, "wb") as out:
        reader = threading.Thread(target=read_all)
        reader.start()
        for batch in batches:
            decode_worker.write_values(out, batch)
        reader.join(timeout=10)
    assert got == batches


def test_a_record_whose_parse_kills_the_child_is_dead_lettered_not_decoded_in_the_relay(caplog):
    """A record under max_event_bytes whose parse takes more memory than the child has
    (millions of {}): the child dies on its chunk. The chunk's values go again one by one,
    each to a fresh child; the one that kills a child alone is answered decoder_crashed.
    It used to be decoded in the relay itself, which then died too, at every restart."""
    stop = threading.Event()

    def oom_killer() -> None:
        """As the kernel's: a child past ~150 MB is killed (SIGKILL) at once."""
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            for pid in worker.pids:
                try:
                    if psutil.Process(pid).memory_info().rss > 150 << 20:
                        os.kill(pid, signal.SIGKILL)
                except (psutil.NoSuchProcess, ProcessLookupError):
                    pass
            stop.wait(0.005)

    heavy = b'{"a": [' + b"{}," * 3_000_000 + b"{}]}"  # ~9 MB, ~300 MB parsed
    good = [v for v in values() if v is not None and 0 < len(v) <= MAX]
    batch = [*good[:3], heavy, *good[3:]]
    worker = DecodeWorker(max_bytes=16 << 20)
    worker.start()
    killer = threading.Thread(target=oom_killer, daemon=True)
    killer.start()
    try:
        got = worker.decode(batch, timeout_s=60)
        after = worker.decode(good, timeout_s=60)  # a new child serves what comes next
        in_process = worker.in_process
    finally:
        stop.set()
        killer.join()
        worker.close()
    crashed = got[3]
    assert type(crashed) is Rejection and crashed.reason == "decoder_crashed", crashed
    assert f"{len(heavy)} bytes" in crashed.detail
    want = [decode_record(v, max_bytes=16 << 20) for v in good]
    assert [same(g, w) for g, w in zip(got[:3] + got[4:], want)] == [True] * len(want)
    assert [same(g, w) for g, w in zip(after, want)] == [True] * len(want)
    assert not in_process
    assert caplog.text.count("decoder_crashed") >= 1


def test_whatever_else_writes_to_the_childs_stdout_never_mixes_with_its_answers(tmp_path, monkeypatch):
    """A sitecustomize (an APM agent...) printing at the child's start: its stdout carried
    the answers, so the text was read as a frame length and the batch never answered."""
    (tmp_path / "sitecustomize.py").write_text("print('agent 1.2.3 loaded', flush=True)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    batch = [v for v in values() if v is None or len(v) <= MAX]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        got = worker.decode(batch, timeout_s=30)
        in_process = worker.in_process
    finally:
        worker.close()
    assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(got, batch)] == [True] * len(batch)
    assert not in_process


_KILLER_SITE = """
import os, signal
try:
    import relay.stages.decode as _decode
    _real = _decode.decode_fields

    def decode_fields(value, *, max_bytes):
        if value is not None and b"KILLER" in bytes(value):  # as the out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
        return _real(value, max_bytes=max_bytes)

    _decode.decode_fields = decode_fields
except ImportError:
    pass
"""


def test_records_that_kill_children_one_after_another_never_get_decoded_in_the_relay(tmp_path, monkeypatch):
    """Three records in a row that each kill the child parsing them (one sent three times by
    a producer's retries): the fresh children that die on them alone had answered nothing,
    and counted as a broken environment, so the third was decoded in the relay (which died
    with it, at every restart). A death on a value alone is the value's doing."""
    (tmp_path / "sitecustomize.py").write_text(_KILLER_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    good = [v for v in values() if v is not None and 0 < len(v) <= MAX][:6]
    killer = orjson.dumps({**orjson.loads(good[0]), "note": "KILLER"})
    batch = [*good[:3], killer, killer, killer, *good[3:]]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        got = worker.decode(batch, timeout_s=60)
        in_process = worker.in_process
    finally:
        worker.close()
    assert [getattr(r, "reason", None) for r in got[3:6]] == ["decoder_crashed"] * 3
    want = [decode_record(v, max_bytes=MAX) for v in good]
    assert [same(g, w) for g, w in zip(got[:3] + got[6:], want)] == [True] * len(want)
    assert not in_process


def test_an_answer_longer_than_a_mebibyte_is_taken_from_a_reader_that_was_waiting(caplog):
    """The reader bounds an answer's length by the chunk it answers: it took the bound
    before waiting, when nothing was pending (1 MiB), and killed the child for every answer
    longer than that (a poll of 8,000 events), decoding each such batch twice."""
    batch = [orjson.dumps({  # small (one chunk) and distinct (pickle shares equal answers)
        "eventType": "START", "eventTime": "2024-05-01T12:00:00Z", "run": {"runId": str(uuid.UUID(int=i + 1))},
        "job": {"namespace": "airflow-prod", "name": f"dag_{i}.task_{i}"}, "producer": "https://example.com/p",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"}) for i in range(8000)]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        pid = worker._proc.pid
        for _ in range(3):
            got = worker.decode(batch, timeout_s=60)
            assert len(got) == 8000 and type(got[-1]) is LineageEvent
        assert worker._proc.pid == pid
    finally:
        worker.close()
    assert "decode_worker_failed" not in caplog.text


def test_an_event_holding_an_integer_beyond_64_bits_is_marked_across_the_pipe():
    plain = orjson.dumps(spark_run("spark-prod", "etl.big", start=datetime(2024, 5, 1, tzinfo=UTC),
                                   rng=random.Random(5))[0])
    big = plain.replace(b'"run":{', b'"run":{"n":18446744073709551616,', 1)
    looks_big = plain.replace(b'"run":{', b'"run":{"n":"1e+19","m":1e+19,', 1)  # a string, a float
    got = decode_all(DecodeWorker(max_bytes=MAX), [plain, big, looks_big, big])
    assert [e.big_int for e in got] == [False, True, False, True]
    assert [e.big_int for e in (decode_record(v, max_bytes=MAX) for v in (plain, big, looks_big))] == \
        [False, True, False]
    assert decode_record(big, max_bytes=MAX).doc["run"]["n"] == 2**64


_RAISING_SITE = _KILLER_SITE.replace("os.kill(os.getpid(), signal.SIGKILL)", "raise MemoryError")
_CANNOT_START_SITE = "import os\nos._exit(1)  # as a child that cannot import the relay\n"


@pytest.mark.parametrize("site", [_KILLER_SITE, _RAISING_SITE], ids=["killed-by-a-signal", "memory-error"])
def test_killing_records_each_in_a_batch_of_its_own_never_get_decoded_in_the_relay(tmp_path, monkeypatch, site):
    """Records that kill the child, each in a poll batch of its own (light traffic, or a
    producer retrying a huge record across polls): each first died in a fresh child, on a
    chunk, which counted as a broken environment; after three, decoding fell back into the
    relay for good, and the next such record was parsed in the relay itself."""
    (tmp_path / "sitecustomize.py").write_text(site)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    good = [v for v in values() if v is not None and 0 < len(v) <= MAX][0]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        assert type(worker.decode([good], timeout_s=30)[0]) is LineageEvent
        got = []
        for i in range(5):
            killer = orjson.dumps({**orjson.loads(good), "note": f"KILLER {i}"})
            got.append((getattr(worker.decode([killer], timeout_s=60)[0], "reason", None), worker.in_process))
        after = worker.decode([good], timeout_s=30)[0]
    finally:
        worker.close()
    assert got == [("decoder_crashed", False)] * 5
    assert same(after, decode_record(good, max_bytes=MAX))


def test_a_child_that_cannot_start_makes_the_relay_decode_itself_and_dead_letters_nothing(tmp_path, monkeypatch,
                                                                                           caplog):
    """A broken environment (the child exits at once, every time): after _MAX_FAILURES
    children, the batches are decoded in this process, none of their records dead-lettered
    as decoder_crashed (the children's deaths were not the records' doing)."""
    (tmp_path / "sitecustomize.py").write_text(_CANNOT_START_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    batch = [v for v in values() if v is None or len(v) <= MAX]
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        first = worker.decode(batch, timeout_s=60)
        in_process = worker.in_process
        second = worker.decode(batch, timeout_s=60)
    finally:
        worker.close()
    assert in_process
    for got in (first, second):
        assert [same(g, decode_record(v, max_bytes=MAX)) for g, v in zip(got, batch)] == [True] * len(batch)
    assert "decoder_crashed" not in caplog.text


def test_a_parse_that_fails_in_the_child_is_one_json_line_with_the_relays_context(tmp_path, monkeypatch, capfd):
    """The child's stderr is the relay's: a parse that raised (MemoryError) printed its raw
    traceback there, ~30 lines of text amid the JSON log lines, every time a record killed a
    child. Now one line in the relay's format, the worker index of the relay's lines on it."""
    (tmp_path / "sitecustomize.py").write_text(_RAISING_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    monkeypatch.setattr(logs, "_context", {})
    logs.set_log_context(worker=5)
    good = [v for v in values() if v is not None and 0 < len(v) <= MAX][0]
    killer = orjson.dumps({**orjson.loads(good), "note": "KILLER"})
    capfd.readouterr()
    worker = DecodeWorker(max_bytes=MAX)
    worker.start()
    try:
        got = worker.decode([good, killer], timeout_s=60)
    finally:
        worker.close()
    assert type(got[0]) is LineageEvent and got[1].reason == "decoder_crashed"
    err = capfd.readouterr().err
    lines = [orjson.loads(line) for line in err.splitlines()]  # every line is JSON
    failed = [line for line in lines if line["event"] == "decode_child_failed"]
    assert len(failed) == 2, err  # the chunk's child, then the child that had the killer alone
    for line in failed:
        assert line["level"] == "error" and line["logger"] == "relay.decode_child" and line["worker"] == 5
        assert line["error"] == "MemoryError: " and line["exit_code"] == decode_worker.DIED_DECODING
        assert "Traceback" in line["exception"] and line["exception"].rstrip().endswith("MemoryError")
    assert [line["values"] for line in failed] == [2, 1]
