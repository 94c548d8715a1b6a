"""Helpers shared by the producer's Kafka tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from producer import events
from producer.codec import avro
from tests.support.kafka import ReadRecord, process_state

ROOT = Path(__file__).resolve().parents[2]
#: Fast reconnects so a broker that comes back is noticed within ~200 ms.
FAST_RECONNECT = {"reconnect.backoff.ms": "20", "reconnect.backoff.max.ms": "200"}
JOBS = ("extract", "transform", "load")


class JobRecorder:
    """A sender for ``lineage_job`` (anything with ``emit`` will do) that keeps its events."""

    config = None

    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, event: dict) -> None:
        self.events.append(event)

    def by_job(self, name: str) -> list[dict]:
        return [e for e in self.events if e["job"]["name"] == name]

    def seen(self) -> list[tuple[str, str]]:
        return [(e["job"]["name"], e["eventType"]) for e in self.events]

    def validate(self) -> None:
        from tests.support.spec import validator

        for event in self.events:
            validator().validate(event)


def seq_event(i: int, run_id: str | None = None) -> dict:
    """Event number ``i``; three jobs, so three message keys, interleaved."""
    return events.run_event(
        "RUNNING", run_id=run_id or events.new_run_id(), job_namespace="tests",
        job_name=JOBS[i % len(JOBS)],
        run_facets={"seq": events.custom_facet({"i": i}, schema_url="https://example.com/seq.json")},
    )


def decode(value: bytes) -> dict:
    return avro.decode(value) if avro.is_single_object(value) else orjson.loads(value)


def seqs_by_key(records: Iterable[ReadRecord]) -> dict[bytes | None, list[int]]:
    out: dict[bytes | None, list[int]] = defaultdict(list)
    for rec in records:
        out[rec.key].append(decode(rec.value)["run"]["facets"]["seq"]["i"])
    return dict(out)


def assert_all_arrived_in_order(records: Iterable[ReadRecord], expected: Iterable[int]) -> None:
    """Every expected event arrived; per key, first arrivals are in emit order (a replay
    may repeat events: at-least-once)."""
    by_key = seqs_by_key(records)
    seen = [i for seqs in by_key.values() for i in seqs]
    assert set(seen) == set(expected), f"missing {sorted(set(expected) - set(seen))[:20]}"
    for key, seqs in by_key.items():
        first = list(dict.fromkeys(seqs))
        assert first == sorted(first), f"key {key!r} out of order: {first[:50]}"


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)  # ok: the poll interval of a wait with a deadline


@contextmanager
def frozen_with_an_aside_journal(producer: Any, broker: Any, make_event: Callable[[int], dict],
                                 logged: Callable[[str], bool]) -> Iterator[None]:
    """Event 0 delivered, then the broker frozen (SIGSTOP): events 1-50 go into librdkafka and
    are never answered (given back at the rebuild), 51-110 come during the reclaim's wait for
    those answers and go to a journal of their own (aside). Yields once everything is
    journaled (or dropped), the broker still frozen; thaws it on the way out."""
    producer.emit(make_event(0))
    assert producer.flush(15) == 0
    os.kill(broker._proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: process_state(broker._proc.pid) == "T", 10, "the broker stopped")
        for i in range(1, 51):
            producer.emit(make_event(i))
        wait_for(lambda: logged("reason=stalled"), 40, "the stall")
        for i in range(51, 111):
            producer.emit(make_event(i))
        wait_for(lambda: logged("event=producer_rebuilt"), 40, "the rebuild")
        wait_for(lambda: producer._not_journaled() == 0, 20, "everything journaled or dropped")
        assert logged("reason=reclaim_wait"), "the spill queue went aside"
        yield
    finally:
        os.kill(broker._proc.pid, signal.SIGCONT)


_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from producer import LineageProducer
    from tests.producer.support import FAST_RECONNECT, seq_event
    p = LineageProducer(bootstrap_servers={bootstrap!r}, topic={topic!r}, journal_dir={journal!r},
                        properties=FAST_RECONNECT, close_timeout_s=0.2)
    for i in range({start}, {start} + {count}):
        p.emit(seq_event(i))
    deadline = time.monotonic() + 20
    while p.stats.journaled < {count} and time.monotonic() < deadline:
        time.sleep(0.01)  # ok: polls a condition with a deadline (in the child process)
    print("journaled", p.stats.journaled, flush=True)
    {ending}
""")


def start_producer_child(journal_dir: Path, bootstrap: str, topic: str, count: int, ending: str,
                         start: int = 0) -> subprocess.Popen:
    """A process whose producer emits events ``start`` .. ``start + count - 1`` to a Kafka
    that must be unreachable (so they go to its journal), prints ``journaled <n>``, then
    runs ``ending``."""
    code = _CHILD.format(root=str(ROOT), bootstrap=bootstrap, topic=topic, journal=str(journal_dir),
                         count=count, start=start, ending=ending)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)


def journal_left_by_killed_producer(journal_dir: Path, bootstrap: str, topic: str, count: int,
                                    start: int = 0) -> None:
    """The journal a producer process left when it was killed (SIGKILL) while ``bootstrap``
    was unreachable: events ``start`` .. ``start + count - 1``, all journaled."""
    child = start_producer_child(journal_dir, bootstrap, topic, count, "time.sleep(60)", start)  # ok: killed
    try:
        assert child.stdout.readline().split() == ["journaled", str(count)]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)


_JOURNAL_WRITER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from producer.codec import encode_json
    from producer.journal import Journal
    from producer.journal_dir import Destination
    from producer.keys import message_key
    from tests.producer.support import seq_event
    for topic, bootstrap, start, count in {specs!r}:
        journal = Journal.create(Path({journal!r}), max_bytes=1 << 30, segment_bytes=1 << 20,
                                 destination=Destination(topic, bootstrap) if topic else None)
        journal.append([(message_key(e).encode(), encode_json(e)) for e in map(seq_event, range(start, start + count))])
        print(journal.path, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def journals_left_by_killed_process(journal_dir: Path, *specs: tuple[str | None, str, int, int]) -> list[Path]:
    """Journals one process wrote and left when it was killed (SIGKILL), without a Kafka
    client: one per ``(topic, bootstrap_servers, first event, count)``, oldest first; a topic
    of None writes one as producers did before journals named their destination."""
    child = subprocess.run([sys.executable, "-c", _JOURNAL_WRITER.format(
        root=str(ROOT), specs=list(specs), journal=str(journal_dir))], capture_output=True, text=True,
        cwd=ROOT, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    return [Path(line) for line in child.stdout.split()]


def open_paths_under(paths: Iterable[Path]) -> list[str]:
    """What this process's open file descriptors point to, under any of ``paths``."""
    prefixes = tuple(f"{p}/" for p in paths)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # closed meanwhile (the listing's own fd)
            continue
        if target.startswith(prefixes):
            out.append(target)
    return out


def write_ca_pem(path: Path) -> Path:
    """A self-signed CA certificate in PEM at ``path`` (librdkafka loads ``ssl.ca.location``
    when the producer is built, so it must be a real certificate)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def no_segments_left(root: Path) -> bool:
    """No journal segment under ``root``; a directory removed while it is walked (a journal
    sent meanwhile: ``Path.rglob`` raises on 3.11) is looked at again."""
    for _ in range(20):
        try:
            return not any(root.rglob("*.seg"))
        except FileNotFoundError:
            continue
    return False
