"""A producer inherited through fork() (multiprocessing's default start method on Linux):
the child's events are delivered, the parent's too, and nothing is lost without a word."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import weakref

import pytest
from confluent_kafka import Producer

from producer import LineageProducer, events, forking, job, log_gate, replacement
from producer.job import lineage_job
from producer.journal import Journal
from producer.journal_dir import Destination, lock_existing
from producer.orphans import adopt_orphans
from tests.producer.support import decode, wait_for
from tests.support.children import exit_status as _exit_status
from tests.support.children import run_in_child as _in_child
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka


def _event(job_name: str) -> dict:
    return events.run_event("START", run_id=events.new_run_id(), job_namespace="fork", job_name=job_name)


def _worker(producer: LineageProducer, n: int) -> None:
    # No flush, no close: the worker just returns, as a multiprocessing task does.
    with lineage_job(f"worker.{n}", producer=producer):
        producer.emit(_event(f"worker.{n}.extra"))


def test_a_multiprocessing_fork_child_delivers_through_the_inherited_producer(kafka, tmp_path):
    topic = kafka.new_topic("fork")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        producer.emit(_event("parent.before"))
        assert producer.flush(10) == 0
        children = [multiprocessing.get_context("fork").Process(target=_worker, args=(producer, n))
                    for n in range(2)]
        for child in children:
            child.start()
        for child in children:
            child.join(30)
        assert [c.exitcode for c in children] == [0, 0]
        producer.emit(_event("parent.after"))
        assert producer.flush(10) == 0
    finally:
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=8, timeout_s=30)
    names = sorted(decode(r.value)["job"]["name"] for r in records)
    assert names == sorted(["parent.before", "parent.after", "worker.0", "worker.0", "worker.0.extra",
                            "worker.1", "worker.1", "worker.1.extra"])
    # The children's records went straight to Kafka: the parent's journal holds nothing.
    assert producer.stats.journaled == 0


def test_an_os_fork_child_flushes_its_events_to_kafka(kafka, tmp_path):
    topic = kafka.new_topic("osfork")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        pid = os.fork()
        if pid == 0:  # the child: os._exit, so pytest does not run on in it
            code = 0
            try:
                producer.emit(_event("osfork.child"))
                code = 0 if producer.flush(20) == 0 else 3
            finally:
                os._exit(code)
        assert _exit_status(pid, 60) == 0, "the child's flush left its event pending (or hung)"
    finally:
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=1, timeout_s=30)
    assert [decode(r.value)["job"]["name"] for r in records] == ["osfork.child"]


def test_a_grandchild_forked_while_its_parent_starts_the_producer_emits(kafka, tmp_path):
    # A forked child's first emit starts its producer under _fork_lock; a fork from another
    # of its threads meanwhile (a pool started while a thread's first job runs) must not
    # leave the grandchild waiting for a lock held by a thread it does not have.
    topic = kafka.new_topic("grandchild")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        pid = os.fork()
        if pid == 0:
            def child() -> int:
                held, release = threading.Event(), threading.Event()

                def starting() -> None:   # holds the lock as start_in_forked_child does
                    with producer._fork_lock:
                        held.set()
                        release.wait(60)

                threading.Thread(target=starting, daemon=True).start()
                held.wait(10)
                grandchild = os.fork()
                if grandchild == 0:
                    def emits() -> int:
                        producer.emit(_event("grandchild"))
                        return 0 if producer.flush(20) == 0 else 3
                    _in_child(emits)
                status = _exit_status(grandchild, 30)
                release.set()
                return 0 if status == 0 else 5
            _in_child(child)
        assert _exit_status(pid, 60) == 0, "the grandchild's emit blocked (or its flush left the event)"
    finally:
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=1, timeout_s=30)
    assert [decode(r.value)["job"]["name"] for r in records] == ["grandchild"]


def test_a_fork_while_another_thread_builds_the_default_producer_does_not_block_the_child(
        kafka, tmp_path, monkeypatch):
    # Building the default producer takes a while (configuration sources, the resolver
    # probe); a fork from another thread meanwhile must not leave the lock held in the child.
    topic = kafka.new_topic("deflock")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TOPIC_NAME", topic)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    monkeypatch.setenv("LINEAGE_RELAY_JOURNAL_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(job, "_default", None)
    building, done = threading.Event(), threading.Event()

    def slow_build() -> None:   # holds the lock as default_producer() does while it builds
        with job._default_lock:
            building.set()
            done.wait(60)

    builder = threading.Thread(target=slow_build)
    builder.start()
    try:
        assert building.wait(10)
        pid = os.fork()
        if pid == 0:
            def child() -> int:
                with lineage_job("child.job"):
                    pass
                return 0 if job.default_producer().flush(20) == 0 else 3
            _in_child(child)
        assert _exit_status(pid, 30) == 0, "the child's lineage_job blocked on the parent's lock"
    finally:
        done.set()
        builder.join(10)
    records = read_topic(kafka.bootstrap_servers, topic, expected=2, timeout_s=30)
    assert [decode(r.value)["eventType"] for r in records] == ["START", "COMPLETE"]


def _builds_its_own(bootstrap: str, topic: str, journal_dir: str) -> None:
    # No flush, no close: a task returns, and a fork or forkserver child ends with os._exit.
    producer = LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir)
    with lineage_job("built.in.child", producer=producer):
        pass


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_producer_built_in_a_multiprocessing_child_delivers_at_its_exit(kafka, tmp_path, method):
    topic = kafka.new_topic(f"childbuilt-{method}")
    child = multiprocessing.get_context(method).Process(
        target=_builds_its_own, args=(kafka.bootstrap_servers, topic, str(tmp_path)))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    records = read_topic(kafka.bootstrap_servers, topic, expected=2, timeout_s=30)
    assert [decode(r.value)["eventType"] for r in records] == ["START", "COMPLETE"]


def _orphans_pending(journal_dir) -> list[int]:
    """Events pending in each journal a dead process left in ``journal_dir`` (adopted, then let go)."""
    adopted = adopt_orphans(journal_dir, max_bytes=1 << 30, segment_bytes=1 << 20)
    try:
        return [j.pending for j in adopted]
    finally:
        for journal in adopted:
            journal.close()


def _emit_once(producer: LineageProducer) -> None:
    producer.emit(_event("short.task"))


@pytest.mark.parametrize("kafka_state", ["refusing", "silent"])
def test_a_fork_childs_exit_does_not_wait_for_a_kafka_that_never_answers(tmp_path, kafka_state, monkeypatch):
    # A pool of short tasks (maxtasksperchild) must not wait close_timeout_s (or the stall
    # detector) at every worker's exit while Kafka is down or silent: Kafka gets the grace
    # (_DOWN_GRACE_S) to acknowledge the child's first record, none once it is known down;
    # then the record goes to the child's journal, for the next producer. The child inherits
    # the module state: a 0.25 s grace and a 30 s stall period put the exit expected (~0.5 s)
    # far under the bound, and the exit without the grace (30 s) far over it.
    monkeypatch.setattr(replacement, "_DOWN_GRACE_S", 0.25)
    monkeypatch.setattr(forking, "_FIRST_ANSWER_S", 0.25)
    monkeypatch.setattr(replacement, "_STALL_S", (30.0, 60.0))
    bound_s = 10.0
    server = socket.socket()
    server.bind(("127.0.0.1", 0))   # refusing: bound, never listening
    if kafka_state == "silent":
        server.listen(16)           # connections complete in the backlog; nothing answers
    try:
        producer = LineageProducer(bootstrap_servers=f"127.0.0.1:{server.getsockname()[1]}", topic="t",
                                   journal_dir=tmp_path, close_timeout_s=30)
        try:
            child = multiprocessing.get_context("fork").Process(target=_emit_once, args=(producer,))
            started = time.monotonic()
            child.start()
            child.join(60)
            took = time.monotonic() - started
            assert child.exitcode == 0
            assert took < bound_s, f"the child's exit took {took:.1f}s"
            assert _orphans_pending(tmp_path) == [1], "the child's event is in its journal"
        finally:
            producer.close(0.1)
    finally:
        server.close()


class _Holder:
    client: Producer | None = None


#: In a forked child: the parent's unreachable librdkafka instance (_leave_to_the_garbage_collector).
_garbage: weakref.ref[_Holder] | None = None


def _leave_to_the_garbage_collector(bootstrap: str) -> None:
    """A librdkafka instance in a reference cycle, unreachable: only the garbage collector frees it."""
    global _garbage
    holder = _Holder()
    holder.client = Producer({"bootstrap.servers": bootstrap, "log_level": 0,
                              "error_cb": lambda err, holder=holder: None})
    _garbage = weakref.ref(holder)


def _emit_and_collect(producer: LineageProducer) -> None:
    producer.emit(_event("gc.child"))   # starts the child's producer: its threads, and one that ends
    ended = threading.Thread(target=time.sleep, args=(0.05,))
    ended.start()
    ended.join()   # joined: its stack is back in glibc's cache, cut back to 40 MiB (the oldest unmapped)
    gc.collect()
    if _garbage is None or _garbage() is None:
        sys.exit(3)   # the parent's instance was freed here (when that did not crash or hang)


def test_a_fork_childs_garbage_collector_never_frees_a_librdkafka_instance_of_the_parent(tmp_path):
    # An instance the parent left to its garbage collector (a client in a reference cycle, the
    # application's or an earlier test's) was freed by the child's collector: rd_kafka_destroy()
    # there joins librdkafka's main thread, which stayed in the parent, through a descriptor on
    # that thread's stack, which glibc unmaps in the child once a thread of the child ends:
    # SIGSEGV, a wait for ever (the stack reused), or, the hole mapped again, a return. So the
    # child also reports the instance freed (3). The garbage is made first, newer threads after it
    # (as the instances the parent built since): the oldest stacks are the ones unmapped.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))   # refusing: bound, never listening
    bootstrap = f"127.0.0.1:{server.getsockname()[1]}"
    collecting = gc.isenabled()
    gc.disable()   # the garbage stays until the fork, as between two of the parent's collections
    newer: list[Producer] = []
    try:
        _leave_to_the_garbage_collector(bootstrap)
        newer.extend(Producer({"bootstrap.servers": bootstrap, "log_level": 0}) for _ in range(3))
        producer = LineageProducer(bootstrap_servers=bootstrap, topic="t", journal_dir=tmp_path,
                                   close_timeout_s=1)
        try:
            child = multiprocessing.get_context("fork").Process(target=_emit_and_collect, args=(producer,))
            child.start()
            child.join(20)
            if child.is_alive():
                child.kill()
                child.join(10)
            assert child.exitcode == 0
            assert gc.isenabled() is False, "the parent's collection is as it was before the fork"
        finally:
            producer.close(0.1)
    finally:
        newer.clear()
        left = _garbage() if _garbage is not None else None
        if left is not None:
            left.client = None   # freed here, in its own process
        if collecting:
            gc.enable()
        server.close()


def test_a_fork_leaves_garbage_collection_as_it_was_and_the_child_collects_what_it_allocates(tmp_path):
    producer = LineageProducer(bootstrap_servers="127.0.0.1:9", topic="t", journal_dir=tmp_path, close_timeout_s=1)
    try:
        assert gc.isenabled()
        pid = os.fork()
        if pid == 0:   # the child: os._exit, so pytest does not run on in it
            code = 1
            try:
                frozen = gc.get_freeze_count()
                mine = _Holder()
                mine.client = mine   # a cycle of the child's own
                alive = weakref.ref(mine)
                del mine
                gc.collect()
                code = 0 if gc.isenabled() and frozen > 0 and alive() is None else 2
            finally:
                os._exit(code)
        assert _exit_status(pid, 60) == 0
        assert gc.isenabled()
    finally:
        producer.close(0.1)


def _emit_and_tell(producer: LineageProducer | None, job_name: str, conn, bootstrap: str, topic: str,
                   journal_dir: str) -> None:
    if producer is None:   # built in the child, on the parent's journal directory
        producer = LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir)
    producer.emit(_event(job_name))
    producer.flush(20)   # as a pool task may: in a child that cannot send, until the event is in the journal
    conn.send(getattr(producer, "_can_send", True))   # False: this child found its resolver locked


def _resolve_until(stop: threading.Event) -> None:
    while not stop.is_set():
        socket.getaddrinfo("127.0.0.1", 9, 0, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)


@pytest.mark.parametrize("child_builds_its_own", [False, True])
def test_fork_children_while_a_parent_thread_resolves_names_exit_and_lose_nothing(kafka, tmp_path,
                                                                                   child_builds_its_own):
    # A parent thread inside getaddrinfo() at the fork (librdkafka reconnecting, any HTTP
    # client) holds glibc's interface lock for ever in the child: a librdkafka instance there
    # never resolves, and its close waited close_timeout_s, then 15 s for the sender, and lost
    # the event. Three parent threads resolving make most forks land while one holds it; each
    # child must flush and exit promptly, and every child's event reach the topic (directly, or
    # from the child's journal through the next producer on the directory).
    topic = kafka.new_topic(f"resolving-{child_builds_its_own}")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    stop = threading.Event()
    resolvers = [threading.Thread(target=_resolve_until, args=(stop,), daemon=True) for _ in range(3)]
    names, locked, child = [], 0, None
    try:
        for thread in resolvers:
            thread.start()
        while locked < 2 and len(names) < 30:
            names.append(f"child.{len(names)}")
            receive, send = multiprocessing.Pipe(duplex=False)
            child = multiprocessing.get_context("fork").Process(target=_emit_and_tell, args=(
                None if child_builds_its_own else producer, names[-1], send, kafka.bootstrap_servers, topic,
                str(tmp_path)))
            started = time.monotonic()
            child.start()
            send.close()
            child.join(60)
            took = time.monotonic() - started
            assert child.exitcode == 0
            assert took < 15, f"{names[-1]}'s exit took {took:.1f}s"
            locked += receive.poll(5) and receive.recv() is False
            receive.close()
    finally:
        if child is not None and child.is_alive():
            child.kill()
            child.join(10)
        stop.set()
        for thread in resolvers:
            thread.join(10)
        producer.close()
    assert locked, f"no child of {len(names)} forked while a parent thread held the resolver's lock"
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path) as next_run:
        assert next_run.flush(30) == 0
    records = read_topic(kafka.bootstrap_servers, topic, expected=len(names), timeout_s=30)
    assert sorted(decode(r.value)["job"]["name"] for r in records) == sorted(names)


def _late_probe(monkeypatch) -> threading.Event:
    """The next producer's resolver probe answers only once the returned event is set (a
    process too loaded to answer within _PROBE_S)."""
    release = threading.Event()
    resolve = socket.getaddrinfo

    def slow_resolve(*args):
        release.wait(30)
        return resolve(*args)

    monkeypatch.setattr(forking.socket, "getaddrinfo", slow_resolve)
    monkeypatch.setattr(forking, "_probe", None)
    monkeypatch.setattr(forking, "_PROBE_S", 0.05)
    return release


def test_a_resolver_probe_answering_late_brings_the_kafka_client_back(kafka, tmp_path, monkeypatch):
    # A process too loaded to answer the probe in time is not one whose resolver is locked for
    # ever: it journals meanwhile, then sends everything, in order, once the probe answers,
    # and what an earlier process (for the same topic and cluster: here an earlier producer
    # of this process that could not send either) left in the journal directory too.
    topic = kafka.new_topic("late-probe")
    release = _late_probe(monkeypatch)
    earlier = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    earlier.emit(_event("left.behind"))
    earlier.flush(0)
    wait_for(lambda: earlier.stats.journaled == 1, 30, "the earlier process's event in its journal")
    earlier.close(0.1)
    assert earlier.stats.pending == 1
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        producer.emit(_event("while.probing"))
        started = time.monotonic()
        assert producer.flush(60) == 1, "journaled: nothing can send it yet"
        assert time.monotonic() - started < 20, "flush() returns once the event is in the journal"
        assert producer.stats.journaled == 1 and producer.stats.mode == "journal"
        release.set()
        wait_for(lambda: producer.stats.mode == "direct", 30, "back to direct sending")
        producer.emit(_event("after.the.answer"))
        assert producer.flush(30) == 0
        assert producer.stats.delivered == 3 and producer.stats.replayed == 2
    finally:
        release.set()
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=3, timeout_s=30)
    assert [decode(r.value)["job"]["name"] for r in records] == ["left.behind", "while.probing", "after.the.answer"]


def test_a_late_kafka_client_refusing_its_configuration_is_reported_once(tmp_path, monkeypatch):
    # Construction built no client (the probe was late), so librdkafka's check of the
    # properties comes when the probe answers: one error, and the journal keeps the events.
    release = _late_probe(monkeypatch)
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", topic="t", journal_dir=tmp_path,
                               properties={"no.such.property": "1"})
    try:
        producer.emit(_event("kept"))
        release.set()
        wait_for(lambda: producer.stats.errors == 1, 30, "the refused configuration reported")
        producer.emit(_event("kept.too"))
        wait_for(lambda: producer.stats.journaled == 2, 30, "the next event journaled (a later turn of the sender)")
        assert producer.flush(30) == 2
    finally:
        release.set()
        producer.close()   # the sender's last turns: a retried client would count errors there too
    assert producer.stats.errors == 1 and producer.stats.mode == "journal" and producer.stats.journaled == 2


def test_a_resolver_probe_that_raises_counts_as_an_answer(monkeypatch):
    # Only a resolver that never returns means a lock held for ever; a test harness's blocked
    # network (getaddrinfo raising anything) must not leave the process without Kafka.
    def refuse(*args):
        raise RuntimeError("network access disabled")

    monkeypatch.setattr(forking.socket, "getaddrinfo", refuse)
    monkeypatch.setattr(forking, "_probe", None)
    assert forking.resolver_usable() is True


def test_a_long_lived_fork_child_does_not_keep_the_parents_journal_from_being_adopted(tmp_path):
    # The parent journaled during an outage and ended (or crashed) while a child it forked
    # lives on: the next run must adopt the parent's journal, not find it locked.
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    read_end, write_end = os.pipe()
    try:
        producer = LineageProducer(bootstrap_servers=f"127.0.0.1:{refusing.getsockname()[1]}", topic="t",
                                   journal_dir=tmp_path)
        producer.emit(_event("parent"))
        producer.flush(0)
        wait_for(lambda: producer.stats.journaled == 1, 30, "the parent's event in its journal")
        pid = os.fork()
        if pid == 0:   # lives until the test closes the pipe; never emits
            os.close(write_end)
            _in_child(lambda: len(os.read(read_end, 1)))
        os.close(read_end)
        producer.close(0.1)
        assert _orphans_pending(tmp_path) == [1], "the parent's journal is held by its child"
    finally:
        os.close(write_end)
        refusing.close()
    assert _exit_status(pid, 10) == 0


def test_a_fork_child_closes_a_journal_lock_the_parent_was_taking_over_and_nothing_deeper(tmp_path):
    # A fork between the sender's lock_existing() and the journal object it builds: the LOCK
    # descriptor is in no journal the fork hook knows of; its /proc scan closes it in the child.
    # A file named LOCK deeper under the journal directory is not a journal's: left open.
    # Written for another cluster: the producer below leaves it alone.
    orphan = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096,
                            destination=Destination("t", "127.0.0.1:9"))
    orphan.append([(None, b"left")])
    os.close(orphan._writer)
    os.close(orphan._lock_fd)   # its process died
    deeper = tmp_path / "a" / "b"
    deeper.mkdir(parents=True)
    (deeper / "LOCK").touch()
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", topic="t", journal_dir=tmp_path)
    taking_over = lock_existing(orphan.path)
    unrelated = os.open(deeper / "LOCK", os.O_RDONLY)
    report_r, report_w = os.pipe()   # child -> parent
    go_r, go_w = os.pipe()           # parent -> child
    pid = None
    try:
        assert taking_over is not None
        pid = os.fork()
        if pid == 0:   # reports which descriptors it still has, then waits to be told to go
            def report() -> int:
                os.close(go_w)
                still = ",".join(str(fd) for fd in (taking_over, unrelated) if _is_open(fd))
                os.write(report_w, f"open:{still}".encode())
                return len(os.read(go_r, 1))
            _in_child(report)
        os.close(report_w)   # a child that died: EOF, not a hang
        report_w = None
        assert os.read(report_r, 64) == f"open:{unrelated}".encode(), \
            "the child kept the journal's LOCK, or closed another"
        os.close(taking_over)
        taking_over = None
        fd = lock_existing(orphan.path)
        assert fd is not None, "the journal is still locked (by the fork child)"
        os.close(fd)
    finally:
        os.close(go_w)   # the child's read returns (b"" if nothing was written)
        for fd in (taking_over, unrelated, report_r, report_w, go_r):
            if fd is not None:
                os.close(fd)
        producer.close(0)
    assert _exit_status(pid, 10) == 0


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("state", ["closed", "deferred_close"])
def test_a_fork_child_does_not_wait_for_locks_a_parent_thread_held(kafka, tmp_path, state):
    # A thread of the parent holds the producer's locks at the fork (an emit(), stats, the
    # sender): the child's copies were never released, and its stats, emit() or close() hung
    # on them -- a closed producer's (no longer live) and a deferred close's (not reset).
    topic = kafka.new_topic("fork-locks")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    producer.emit(_event("parent"))
    if state == "closed":
        producer.close()
    else:   # what a close() deferred in a signal handler leaves until the interrupted call returns
        producer._defer_close("inside_emit", time.monotonic() + 1, threading.get_ident())
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with producer._lock, producer._count_lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:   # the child: only this thread
        code = 1
        try:
            producer.stats
            producer.emit(_event("child"))
            producer.close()
            code = 0 if producer.stats.dropped.get("closed") == 1 else 2
        finally:
            os._exit(code)
    release.set()
    holder.join(10)
    status = _exit_status(pid, 10)
    producer.close()
    assert status == 0, f"the child hung on a lock, or failed: {status}"


class _SlowWriter(logging.Handler):
    """A handler whose write takes a while under a lock of its own, as a buffered file's
    does: no fork hook renews that lock, so a child forked mid-write could never take it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.writing = threading.Event()
        self.stream_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.stream_lock:
            self.writing.set()
            time.sleep(0.3)   # ok: the write itself, on a slow disk (what the test is about)


def test_a_fork_waits_for_a_producer_thread_to_leave_a_log_handler():
    """A pool worker forked while the sender logged (librdkafka's refused connection) hung for
    ever at its first line, its close() at exit with it."""
    logger = logging.getLogger(log_gate.GATED[0])
    handler = _SlowWriter()
    logger.addHandler(handler)
    try:
        line = threading.Thread(target=logger.warning, args=("event=test_line from a producer thread",))
        line.start()
        assert handler.writing.wait(10)
        pid = os.fork()
        if pid == 0:   # the child: its own line through the same handler, then out
            try:
                logger.warning("event=test_line from the child")
            finally:
                os._exit(0)
        assert _exit_status(pid, 20) == 0, "the child hung on the handler's lock"
        line.join(10)
    finally:
        logger.removeHandler(handler)


def test_a_records_place_is_its_callers_through_the_gate(caplog):
    with caplog.at_level(logging.WARNING, logger=log_gate.GATED[0]):
        logging.getLogger(log_gate.GATED[0]).warning("event=test_line here")
    (record,) = [r for r in caplog.records if r.getMessage() == "event=test_line here"]
    assert (record.filename, record.funcName) == ("test_fork.py",
                                                  "test_a_records_place_is_its_callers_through_the_gate")


@pytest.mark.parametrize("handler", ["emit", "emit_and_close", "raise"])
def test_a_signal_handler_interrupting_a_forked_childs_producer_start(kafka, tmp_path, handler):
    # A forked child's first emit() starts its producer (the resolver probe may take up to
    # 1 s); a signal handler there that emits used to wait for the start's lock, held by the
    # very thread it interrupted (a hang); one that closed left the interrupted event dropped
    # as "closed" and a sender running; one that raised handed the event to the parent's
    # copy of librdkafka, which has no thread in the child (lost).
    topic = kafka.new_topic("fork-start-signal")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        pid = os.fork()
        if pid == 0:
            def child() -> int:
                start = producer._new_producer

                def interrupted_start(*args):
                    signal.raise_signal(signal.SIGUSR1)
                    return start(*args)

                def on_usr1(*_) -> None:
                    producer._new_producer = start
                    if handler == "raise":
                        raise KeyboardInterrupt("from the handler")
                    producer.emit(_event("handler"))
                    if handler == "emit_and_close":
                        producer.close()

                signal.signal(signal.SIGUSR1, on_usr1)
                producer._new_producer = interrupted_start
                try:
                    producer.emit(_event("child"))
                except KeyboardInterrupt:
                    pass
                left = producer.flush(20)
                producer.close()
                seen = {"left": left, "stopped": producer._stopped, "sender_alive": producer._sender.is_alive(),
                        "dropped": producer.stats.dropped}
                (tmp_path / "child.json").write_text(json.dumps(seen))
                return 0 if seen == {"left": 0, "stopped": True, "sender_alive": False, "dropped": {}} else 3
            _in_child(child)
        status = _exit_status(pid, 60)
        report = (tmp_path / "child.json").read_text() if (tmp_path / "child.json").exists() else "(no report)"
        assert status == 0, f"the child hung, dropped an event or left its sender running: {status}, {report}"
    finally:
        producer.close()
    expected = ["child"] if handler == "raise" else ["child", "handler"]
    records = read_topic(kafka.bootstrap_servers, topic, expected=len(expected), timeout_s=30)
    assert [decode(r.value)["job"]["name"] for r in records] == expected
