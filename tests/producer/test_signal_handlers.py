"""The producer called from a signal handler: close(), flush(), emit() and stats work there
whatever the handler interrupted (an emit() holding the producer's lock, its counters, a
log handler, another thread holding the lock), the process exits promptly, and every event
emit() accepted reaches Kafka or the journal."""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from producer import LineageProducer
from tests.producer.support import FAST_RECONNECT, ROOT, decode, seq_event
from tests.support.kafka import end_offsets, read_topic

pytestmark = pytest.mark.kafka

_CHILD = textwrap.dedent("""
    import itertools, logging, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    from producer import LineageProducer
    from tests.producer.support import FAST_RECONNECT, seq_event

    class Interrupting:
        '''librdkafka's producer, raising a signal right after its produce() number in ``at``,
        or (``before``) right before it hands that record to librdkafka.'''
        def __init__(self, real, at, sig, before=False):
            self.real, self.at, self.sig, self.before, self.n = real, at, sig, before, 0
        def produce(self, *args):
            self.n += 1
            if self.before and self.n in self.at:
                signal.raise_signal(self.sig)
            self.real.produce(*args)
            if not self.before and self.n in self.at:
                signal.raise_signal(self.sig)
        def __getattr__(self, name):
            return getattr(self.real, name)
        def __len__(self):
            return len(self.real)

    class Trigger(logging.StreamHandler):
        '''Raises SIGTERM while it writes the main thread's "app" record (its lock held).'''
        def emit(self, record):
            super().emit(record)
            if record.name == "app" and threading.current_thread() is threading.main_thread():
                signal.raise_signal(signal.SIGTERM)

    handler = Trigger(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG, handlers=[handler])
    p = LineageProducer(bootstrap_servers={bootstrap!r}, topic={topic!r}, journal_dir={journal!r},
                        close_timeout_s={close_timeout_s},
                        properties={{**FAST_RECONNECT, "linger.ms": "1", **{properties}}}, {options})
    ev = seq_event(0)
    seq = ev["run"]["facets"]["seq"]
    accepted, extra, flushes = 0, [], []
    # The numbers of the handlers' events, one taken per event (next() is one call: a handler
    # interrupting another, as one may anywhere, never gets the same one).
    ids = itertools.count(10_000_000)

    def on_usr1(signum, frame):
        {action}

    def on_term(signum, frame):
        print("term_at", time.monotonic(), flush=True)   # CLOCK_MONOTONIC: the parent's clock too
        p.close()
        sys.exit(0)

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    try:
        {body}
    finally:
        print("accepted", accepted, "closed", p.stats.dropped.get("closed", 0), "extra", *extra, flush=True)
        print("flushes", *(f"{{t:.3f}}/{{n}}" for t, n in flushes), flush=True)
        print("stats", repr(p.stats).replace(" ", ""), flush=True)
""")

_LOOP = """\
print("ready", flush=True)
while True:
    seq["i"] = accepted
    p.emit(ev)
    accepted += 1
    if accepted % 2:
        p.stats"""

_ACTIONS = {
    # Its number taken once: one counted from len(extra) twice (for the event, then for the
    # record) was wrong when a second signal's handler ran in between (inside this one's emit()):
    # both events had one number, and the next one was expected.
    "emit": "n = next(ids); p.emit(seq_event(n)); extra.append(n)",
    "stats": "assert p.stats.emitted >= accepted",
    "flush": "t = time.monotonic(); n = p.flush(5); flushes.append((time.monotonic() - t, n))",
    "close": "p.close()",
}
#: The random-point variants read stats too, as a handler reporting progress would.
_RANDOM_ACTIONS = {name: action if name == "stats" else f"p.stats; {action}" for name, action in _ACTIONS.items()}


#: Records stay in librdkafka (a long linger) until a close takes them back.
_LINGERING = {"linger.ms": "60000", "message.timeout.ms": "120000"}


def _run_child(tmp_path, bootstrap: str, topic: str, body: str, action: str = "pass",
               close_timeout_s: float = 5.0, properties: dict[str, str] | None = None,
               options: str = "") -> subprocess.Popen:
    code = _CHILD.format(root=str(ROOT), bootstrap=bootstrap, topic=topic, journal=str(tmp_path),
                         close_timeout_s=close_timeout_s, action=textwrap.indent(action, "    ").lstrip(),
                         body=textwrap.indent(body, "    ").lstrip(), properties=properties or {},
                         options=options)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)


def _finish(child: subprocess.Popen, within_s: float) -> tuple[int | str, dict[str, list[str]], str]:
    """The child's exit code ("hung" if it was not done within ``within_s``: killed), what it
    printed (by first word) and its log."""
    try:
        out, err = child.communicate(timeout=within_s)
        code: int | str = child.returncode
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate(timeout=10)
        code = "hung"
    printed = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    return code, printed, err


def _seqs_sent(bootstrap: str, topic: str, journal_dir) -> set[int]:
    """Every event seq in the topic, once a producer of this process has sent on what the
    child left in its journal."""
    return set(_seqs_in_order(bootstrap, topic, journal_dir))


def _seqs_in_order(bootstrap: str, topic: str, journal_dir) -> list[int]:
    """The event seqs in the (one-partition) topic in offset order, once a producer of this
    process has sent on what the child left in its journal."""
    with LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir) as adopter:
        assert adopter.flush(30) == 0
    total = sum(end_offsets(bootstrap, topic).values())
    records = read_topic(bootstrap, topic, expected=total, timeout_s=60)
    assert len(records) == total
    return [decode(r.value)["run"]["facets"]["seq"]["i"] for r in records]


def _accepted(printed: dict[str, list[str]]) -> set[int]:
    """What emit() accepted: the main loop's events up to the first dropped as closed, and
    those the handler emitted."""
    words = printed["accepted"]
    accepted, closed = int(words[0]), int(words[2])
    return set(range(accepted - closed)) | {int(w) for w in words[4:]}


@pytest.mark.parametrize("action", sorted(_ACTIONS))
def test_signals_at_random_points_of_an_emit_loop(kafka, tmp_path, action):
    # The handler runs wherever the signal finds the main thread: inside emit() (often
    # holding the lock), inside the counters (stats), between calls.
    topic = kafka.new_topic(f"sig-{action}")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, _LOOP, _RANDOM_ACTIONS[action])
    assert child.stdout.readline().strip() == "ready"
    rng = random.Random(7)
    for _ in range(25):   # ok: spacing between signals, not a synchronisation
        child.send_signal(signal.SIGUSR1)
        time.sleep(rng.uniform(0.005, 0.03))   # ok: spacing between signals, not a synchronisation
    child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert time.monotonic() - started < 20
    for took_left in printed["flushes"]:
        took, left = took_left.split("/")
        assert float(took) < 3 and int(left) >= 0, printed["flushes"]
    assert log.count("event=close_deferred") <= 1
    missing = _accepted(printed) - _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)
    assert not missing, _missing_report(missing, printed, log)


def test_a_signal_inside_a_handlers_emit_counts_each_event_once(kafka, tmp_path):
    # The random-point test's handler, interrupted by a second SIGUSR1 inside its own emit()
    # (encoding its event), as signals close together find it under load; the first handler
    # interrupted event 499's emit() holding the lock. Each handler's event is sent, the outer
    # one's first; the handler used to take its event's number from len(extra) twice, so the
    # inner one sent the outer one's number again and the next number was expected, never sent.
    topic = kafka.new_topic("sig-nested-emit")
    body = textwrap.dedent("""\
        encode, nested = p._encode, []

        def interrupting_encode(event):
            if event["run"]["facets"]["seq"]["i"] >= 10_000_000 and not nested:
                nested.append(event["run"]["facets"]["seq"]["i"])
                signal.raise_signal(signal.SIGUSR1)
            return encode(event)

        p._encode = interrupting_encode
        """) + _INTERRUPTED_AT_500.format(sig="SIGUSR1") + "\np.close()"
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, _RANDOM_ACTIONS["emit"])
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][4:] == ["10000001", "10000000"], printed   # the inner handler's returned first
    order = _seqs_in_order(kafka.bootstrap_servers, topic, tmp_path)
    missing = _accepted(printed) - set(order)
    assert not missing, _missing_report(missing, printed, log)
    assert sorted(order) == [*range(1000), 10_000_000, 10_000_001], "lost or sent twice"
    assert order[499:503] == [499, 10_000_000, 10_000_001, 500]


def _missing_report(missing: set[int], printed: dict[str, list[str]], log: str) -> str:
    """What a failure shows: the events missing, what the child printed (its final stats among
    it) and its log's drops, journal mode changes and errors, then the log's tail."""
    notable = [line for line in log.splitlines()
               if any(word in line for word in ("event=dropped", "event=journal_mode", "event=direct_mode",
                                                "event=producer_rebuilt", "event=close", "ERROR"))]
    return "\n".join([f"missing {sorted(missing)[:20]}", *(f"{k} {' '.join(v)[:2000]}" for k, v in printed.items()),
                      *notable[-40:], "--- log tail ---", log[-3000:]])


_INTERRUPTED_AT_500 = """\
p._producer = Interrupting(p._producer, {{500}}, signal.{sig})
for i in range(1000):
    seq["i"] = i
    p.emit(ev)
    accepted += 1"""


def test_close_in_a_handler_that_interrupted_emit_holding_the_lock(kafka, tmp_path):
    # Right after produce(), inside emit(), the lock held: close() used to wait for the lock (a hang).
    topic = kafka.new_topic("sig-close")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, _INTERRUPTED_AT_500.format(sig="SIGTERM"))
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][0] == "499"
    assert log.count("event=close_deferred") == 1 and "reason=inside_emit" in log
    # The interrupted event was in librdkafka already: it is sent too.
    assert set(range(500)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


def test_close_without_exit_sends_the_interrupted_event_and_drops_later_ones(kafka, tmp_path):
    # The handler closes and returns: the emit() it interrupted goes on; later ones are dropped.
    topic = kafka.new_topic("sig-close-return")
    body = _INTERRUPTED_AT_500.format(sig="SIGUSR1") + '\nprint("deferred", p.stats.close_deferred, flush=True)'
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, _ACTIONS["close"])
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][:3] == ["1000", "closed", "500"]
    assert log.count("event=close_deferred") == 1
    assert printed["deferred"] == ["inside_emit"]   # in stats from then on
    assert set(range(500)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


def test_flush_in_a_handler_right_after_produce_counts_the_record(kafka, tmp_path):
    # A handler between produce() and the count used to see -1 pending and wait its whole timeout.
    topic = kafka.new_topic("sig-flush")
    body = _INTERRUPTED_AT_500.format(sig="SIGUSR1").replace("{500}", "set(range(100, 1000, 100))")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body + "\np.close()", _ACTIONS["flush"])
    code, printed, log = _finish(child, 60)
    assert code == 0, log[-3000:]
    assert len(printed["flushes"]) == 9
    for took_left in printed["flushes"]:
        took, left = took_left.split("/")
        assert float(took) < 3 and left == "0", printed["flushes"]
    assert set(range(1000)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


def test_close_in_a_handler_while_another_thread_holds_the_lock_journals_what_librdkafka_holds(kafka, tmp_path):
    # Not deferred (the handler's thread holds nothing), and the lock held past the close's
    # budget: the sender's last turn journals without it. It used to wait for the lock for
    # good at exit, and the records it had taken back from librdkafka were lost.
    topic = kafka.new_topic("sig-busy")
    body = textwrap.dedent("""\
        for i in range(100):
            seq["i"] = i
            p.emit(ev)
            accepted += 1
        held = threading.Event()

        def hold():
            with p._lock:
                held.set()
                time.sleep(120)   # ok: holds the lock past the test

        threading.Thread(target=hold, daemon=True).start()
        held.wait(10)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)   # ok: idles until the signal""")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, close_timeout_s=1.0,
                       properties=_LINGERING)
    assert child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert time.monotonic() - started < 8, log[-3000:]
    assert "event=close_deferred" not in log
    assert log.count("event=close_without_lock") == 1
    assert set(range(100)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


def test_close_in_a_handler_that_interrupted_logging_leaves_nothing_behind(broker, tmp_path):
    # Kafka down: the sender must log to journal the events, and the handler interrupted a
    # log handler (its lock held): a close waiting for the sender used to wait 15 s and more.
    body = textwrap.dedent("""\
        for i in range(100):
            seq["i"] = i
            p.emit(ev)
            accepted += 1
        logging.getLogger("app").info("about to be interrupted")""")
    child = _run_child(tmp_path, broker.bootstrap_servers, "sig-logging", body, close_timeout_s=3.0)
    code, printed, log = _finish(child, 40)
    exited = time.monotonic()
    assert code == 0, log[-3000:]
    # From the signal (the child's start is CI speed): 3 s close budget; it was 15 s and more.
    assert exited - float(printed["term_at"][0]) < 10, "the close waited for a sender blocked on the log handler"
    assert log.count("event=close_deferred") == 1 and "reason=inside_logging" in log
    broker.start()
    broker.create_topic("sig-logging", 1)
    assert set(range(100)) <= _seqs_sent(broker.bootstrap_servers, "sig-logging", tmp_path)


_BEFORE_PRODUCE_AT_501 = """\
p._producer = Interrupting(p._producer, {{501}}, signal.{sig}, before=True)
for i in range(1000):
    seq["i"] = i
    p.emit(ev)
    accepted += 1
p.close()"""

#: The handler emits an event of the same run (one message key).
_EMIT_SAME_RUN = """\
e = copy.deepcopy(ev)
e["run"]["facets"]["seq"]["i"] = n = next(ids)
p.emit(e)
extra.append(n)"""


def test_emit_in_a_handler_that_interrupted_emit_inside_the_lock_goes_after_its_event(kafka, tmp_path):
    # The handler runs after event 500 was counted and before produce() took it: its own
    # event used to take the (re-entrant) lock and go to Kafka first.
    topic = kafka.new_topic("sig-emit-order")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, _BEFORE_PRODUCE_AT_501.format(sig="SIGUSR1"),
                       "import copy\n" + _EMIT_SAME_RUN)
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][4:] == ["10000000"]
    order = _seqs_in_order(kafka.bootstrap_servers, topic, tmp_path)
    assert sorted(order) == [*range(1000), 10_000_000], "lost or sent twice"
    assert order.index(500) < order.index(10_000_000) < order.index(501), order[495:510]


def test_a_handler_that_closes_and_exits_before_produce_loses_nothing(kafka, tmp_path):
    # Event 500 counted, not yet handed to librdkafka (a produce() written in Python: an
    # instrumented client), when the handler closes and exits: it used to be lost, and the
    # exit to wait 5 s more than close_timeout_s for it. (The handler's close waits for it.)
    topic = kafka.new_topic("sig-exit-before-produce")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, _BEFORE_PRODUCE_AT_501.format(sig="SIGTERM"),
                       close_timeout_s=2.0)
    code, printed, log = _finish(child, 40)
    exited = time.monotonic()
    assert code == 0, log[-3000:]
    # From the signal to the exit (the child's start and its 500 events before are CI speed,
    # not the handler's): the 2 s close budget and the interpreter's exit; it was 5 s more.
    assert exited - float(printed["term_at"][0]) < 5, log[-3000:]
    assert printed["accepted"][0] == "500"
    assert set(range(501)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "RuntimeError"])
def test_a_handler_raising_inside_emit_loses_nothing(kafka, tmp_path, raised):
    # The job catches the interrupt and goes on (emit() itself takes an Exception and logs
    # it, emit_failed): event 500 is sent, nothing stays pending. It used to be lost, and
    # counted in librdkafka for ever.
    topic = kafka.new_topic("sig-interrupt")
    body = textwrap.dedent("""\
        p._producer = Interrupting(p._producer, {501}, signal.SIGUSR1, before=True)
        for i in range(1000):
            seq["i"] = i
            try:
                p.emit(ev)
            except KeyboardInterrupt:
                print("interrupted", i, flush=True)
            accepted += 1
        print("left", p.flush(10), flush=True)
        p.close()""")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, f"raise {raised}('from the handler')")
    code, printed, log = _finish(child, 40)
    assert code == 0, log[-3000:]
    if raised == "KeyboardInterrupt":
        assert printed["interrupted"] == ["500"]
    else:
        assert "interrupted" not in printed and log.count("event=emit_failed") == 1
    assert printed["left"] == ["0"], log[-3000:]
    assert set(range(1000)) <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)


def test_close_in_a_handler_that_interrupted_emit_before_the_lock_keeps_the_order(kafka, tmp_path):
    # The handler interrupts event 500's encoding and closes while events 0-499 are still in
    # librdkafka (a long linger); event 500 used to go to the journal at once, and 0-499,
    # taken back at the end of the close, after it.
    topic = kafka.new_topic("sig-close-order")
    body = textwrap.dedent("""\
        encode, calls = p._encode, [0]

        def interrupting_encode(event):
            calls[0] += 1
            if calls[0] == 501:
                signal.raise_signal(signal.SIGUSR1)
            return encode(event)

        p._encode = interrupting_encode
        for i in range(1000):
            seq["i"] = i
            p.emit(ev)
            accepted += 1""")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, _ACTIONS["close"], close_timeout_s=1.0,
                       properties=_LINGERING)
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][:3] == ["1000", "closed", "499"]
    assert _seqs_in_order(kafka.bootstrap_servers, topic, tmp_path) == list(range(501))
    assert "close_deferred=inside_emit interrupted=1" in log   # on the event=closed line


def test_close_in_a_handler_while_emit_waits_for_room_in_the_spill_queue(broker, tmp_path):
    # Kafka down, the journal writer held up, the spill queue (2 events) full: emit() waits
    # for room, and the handler closes. Its event used to be dropped as "closed".
    body = textwrap.dedent("""\
        from producer.journal import Journal
        deadline = time.monotonic() + 20
        while p.stats.mode != "journal" and time.monotonic() < deadline:
            time.sleep(0.01)   # ok: the poll interval of a wait with a deadline
        gate, append = threading.Event(), Journal.append

        def held_up_append(journal, batch):
            gate.wait(20)
            return append(journal, batch)

        Journal.append = held_up_append
        space_wait = p._space.wait

        def interrupting_wait(timeout=None):
            if not extra:
                extra.append(seq["i"])
                signal.raise_signal(signal.SIGUSR1)
            return space_wait(timeout)

        p._space.wait = interrupting_wait
        for i in range(20):
            seq["i"] = i
            p.emit(ev)
            accepted += 1""")
    child = _run_child(tmp_path, broker.bootstrap_servers, "sig-full", body, "p.close()\ngate.set()",
                       close_timeout_s=3.0, options="queue_max_events=2")
    code, printed, log = _finish(child, 40)
    assert code == 0, log[-3000:]
    interrupted = int(printed["accepted"][4])
    assert printed["accepted"][:3] == ["20", "closed", str(19 - interrupted)], printed
    assert "event=dropped reason=queue_full" not in log
    broker.start()
    broker.create_topic("sig-full", 1)
    assert _seqs_in_order(broker.bootstrap_servers, "sig-full", tmp_path) == list(range(interrupted + 1))


def test_a_close_outside_a_handler_is_never_deferred_while_another_thread_holds_the_lock(kafka, tmp_path, caplog):
    # The lock held for longer than a close used to wait for it (0.5 s): that close was
    # deferred, returned with the sender running and the records still in librdkafka.
    topic = kafka.new_topic("close-busy")
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path,
                        properties={**FAST_RECONNECT, **_LINGERING})
    for i in range(50):
        p.emit(seq_event(i))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with p._lock:
            held.set()
            release.wait(1.0)   # ok: how long the lock is held, not a synchronisation

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    with caplog.at_level(logging.INFO, logger="producer.kafka"):
        p.close(timeout_s=0.2)
    release.set()
    assert "event=close_deferred" not in caplog.text
    assert p.stats.close_deferred is None
    # Closed for good: what librdkafka held is in the journal, which the next producer sends.
    assert _seqs_sent(kafka.bootstrap_servers, topic, tmp_path) == set(range(50))


def test_emit_in_a_handler_that_interrupted_logging_while_another_thread_begins_journal_mode(kafka, tmp_path):
    # Another thread's emit() finds librdkafka's queue full and begins journal mode; its log
    # line waits for the log handler the main thread was writing to when a signal handler
    # interrupted it. The journal_mode line used to be written holding the producer's lock:
    # the handler's own emit() then waited for that lock, and that thread for the handler's
    # (a deadlock). It is written once the lock is released.
    topic = kafka.new_topic("sig-journal-mode-log")
    body = textwrap.dedent("""\
        class NoRoom:
            '''librdkafka's producer with its queue full: it refuses every record.'''
            def __init__(self, real):
                self.real = real
            def produce(self, *args):
                raise BufferError("Local: Queue full")
            def __getattr__(self, name):
                return getattr(self.real, name)
            def __len__(self):
                return len(self.real)

        other = []

        def on_term_while_logging(signum, frame):
            other.append(threading.Thread(target=p.emit, args=(seq_event(0),)))
            other[0].start()
            deadline = time.monotonic() + 10
            while not p._spilling and time.monotonic() < deadline:
                time.sleep(0.005)   # ok: the poll interval of a wait with a deadline
            p.emit(seq_event(1))   # that thread is logging journal mode now, through the held handler
            extra.append(1)

        p._producer = NoRoom(p._producer)
        signal.signal(signal.SIGTERM, on_term_while_logging)
        accepted = 1
        logging.getLogger("app").info("interrupted while this line is written")
        other[0].join(10)
        p.close()""")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, close_timeout_s=2.0)
    code, printed, log = _finish(child, 40)
    assert code == 0, log[-3000:]
    assert "event=journal_mode" in log and "reason=queue_full" in log
    assert {0, 1} <= _seqs_sent(kafka.bootstrap_servers, topic, tmp_path)
