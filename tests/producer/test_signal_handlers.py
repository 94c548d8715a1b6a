"""The producer called from a signal handler: close(), flush(), emit() and stats work there
whatever the handler interrupted (an emit() holding the producer's lock, its counters, a
log handler, another thread holding the lock), the process exits promptly, and every event
emit() accepted reaches Kafka or the journal."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from producer import LineageProducer
from tests.producer.support import ROOT, decode
from tests.support.kafka import end_offsets, read_topic

pytestmark = pytest.mark.kafka

_CHILD = textwrap.dedent("""
    import logging, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    from producer import LineageProducer
    from tests.producer.support import FAST_RECONNECT, seq_event

    class Interrupting:
        '''librdkafka's producer, raising a signal right after its produce() number ``at``.'''
        def __init__(self, real, at, sig):
            self.real, self.at, self.sig, self.n = real, at, sig, 0
        def produce(self, *args):
            self.real.produce(*args)
            self.n += 1
            if self.n in self.at:
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
                        close_timeout_s={close_timeout_s}, properties={{**FAST_RECONNECT, "linger.ms": "1"}})
    ev = seq_event(0)
    seq = ev["run"]["facets"]["seq"]
    accepted, extra, flushes = 0, [], []

    def on_usr1(signum, frame):
        {action}

    def on_term(signum, frame):
        p.close()
        sys.exit(0)

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    try:
        {body}
    finally:
        print("accepted", accepted, "closed", p.stats.dropped.get("closed", 0), "extra", *extra, flush=True)
        print("flushes", *(f"{{t:.3f}}/{{n}}" for t, n in flushes), flush=True)
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
    "emit": "p.emit(seq_event(10_000_000 + len(extra))); extra.append(10_000_000 + len(extra))",
    "stats": "assert p.stats.emitted >= accepted",
    "flush": "t = time.monotonic(); n = p.flush(5); flushes.append((time.monotonic() - t, n))",
    "close": "p.close()",
}
#: The random-point variants read stats too, as a handler reporting progress would.
_RANDOM_ACTIONS = {name: action if name == "stats" else f"p.stats; {action}" for name, action in _ACTIONS.items()}


def _run_child(tmp_path, bootstrap: str, topic: str, body: str, action: str = "pass",
               close_timeout_s: float = 5.0) -> subprocess.Popen:
    code = _CHILD.format(root=str(ROOT), bootstrap=bootstrap, topic=topic, journal=str(tmp_path),
                         close_timeout_s=close_timeout_s, action=action,
                         body=textwrap.indent(body, "    ").lstrip())
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
        out, err = child.communicate()
        code = "hung"
    printed = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    return code, printed, err


def _seqs_sent(bootstrap: str, topic: str, journal_dir) -> set[int]:
    """Every event seq in the topic, once a producer of this process has sent on what the
    child left in its journal."""
    with LineageProducer(bootstrap_servers=bootstrap, topic=topic, journal_dir=journal_dir) as adopter:
        assert adopter.flush(30) == 0
    total = sum(end_offsets(bootstrap, topic).values())
    records = read_topic(bootstrap, topic, expected=total, timeout_s=60)
    assert len(records) == total
    return {decode(r.value)["run"]["facets"]["seq"]["i"] for r in records}


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
        time.sleep(rng.uniform(0.005, 0.03))
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
    assert not missing, sorted(missing)[:20]


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


def test_close_without_exit_journals_the_interrupted_event_and_drops_later_ones(kafka, tmp_path):
    # The handler closes and returns: the emit() it interrupted goes on; later ones are dropped.
    topic = kafka.new_topic("sig-close-return")
    body = _INTERRUPTED_AT_500.format(sig="SIGUSR1")
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, _ACTIONS["close"])
    code, printed, log = _finish(child, 30)
    assert code == 0, log[-3000:]
    assert printed["accepted"][:3] == ["1000", "closed", "500"]
    assert log.count("event=close_deferred") == 1
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


def test_close_in_a_handler_while_another_thread_holds_the_lock(kafka, tmp_path):
    topic = kafka.new_topic("sig-busy")
    body = textwrap.dedent("""\
        for i in range(100):
            seq["i"] = i
            p.emit(ev)
            accepted += 1
        assert p.flush(20) == 0
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
    child = _run_child(tmp_path, kafka.bootstrap_servers, topic, body, close_timeout_s=1.0)
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    code, printed, log = _finish(child, 15)
    assert code == 0, log[-3000:]
    assert log.count("event=close_deferred") == 1 and "reason=lock_busy" in log
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
    started = time.monotonic()
    code, printed, log = _finish(child, 40)
    assert code == 0, log[-3000:]
    assert time.monotonic() - started < 12, "the close waited for a sender blocked on the log handler"
    assert log.count("event=close_deferred") == 1 and "reason=inside_logging" in log
    broker.start()
    broker.create_topic("sig-logging", 1)
    assert set(range(100)) <= _seqs_sent(broker.bootstrap_servers, "sig-logging", tmp_path)

