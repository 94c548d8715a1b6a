"""One ``dlq redrive`` at a time per dead-letter topic (relay.ops.redrive_lock), against a
real broker: the first redrive is a child process held mid-delivery by a collector that
answers only when the test lets it; a second redrive (in-process) refuses while the first
lives, takes over only once its lease expired after it was killed, and a first one stopped
(SIGSTOP) past its lease sends and commits nothing more when it resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from relay.cli import main as cli
from relay.config import RelayConfig
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.ops.ledger import RedriveLedger
from relay.ops.redrive import RedriveSummary
from relay.ops.redrive_lock import LeaseTiming
from relay.ops.redrive_targets import TopicRedrive
from relay.source.admin import create_topic
from tests.support.dead_letters import write_dead_letters
from tests.support.gated_collector import GatedCollector
from tests.support.kafka import committed_offsets, end_offsets, process_state, read_to_end
from tests.support.relay import eventually, relay_config

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[3]
#: Small leases for the tests that wait one out; the machine may be slow: wide margins.
FAST = LeaseTiming(heartbeat_s=0.5, holder_s=8.0, takeover_s=16.0)


def write_config(path: Path, config: RelayConfig) -> str:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
    return str(path)


class Setup:
    """Dead letters for collector ``a``; two config files for the same topics and group,
    whose ``a`` is the first redrive's collector and the second's."""

    def __init__(self, kafka, tmp_path: Path, first_url: str, second_url: str) -> None:
        self.kafka = kafka
        self.dlq = kafka.new_topic("dlq")
        self.stream = sample_stream(3, seed=97)[:6]
        self.count = len(self.stream)
        assert self.count >= 3
        write_dead_letters(kafka.bootstrap_servers, self.dlq, self.stream, reason="collector_rejected",
                           collector="a")
        self.group = kafka.new_group()

        def config(url: str) -> RelayConfig:
            # One request at a time, and a timeout far above any wait here.
            return relay_config(kafka.bootstrap_servers, "ol", {"a": url}, group=self.group, dlq=self.dlq,
                                collector={"concurrency": 1, "timeout_s": 300})

        self.first = write_config(tmp_path / "first.yaml", config(first_url))
        self.second = write_config(tmp_path / "second.yaml", config(second_url))

    def position(self) -> int:
        return committed_offsets(self.kafka.bootstrap_servers, self.dlq, f"{self.group}.dlq-redrive", 1)[0]

    def lock_records(self) -> list[dict]:
        return [orjson.loads(r.value) for r in read_to_end(self.kafka.bootstrap_servers, f"{self.dlq}.redrive-lock")]


class RedriveProcess:
    """``lineage-relay dlq redrive --all`` in a child process, with lease ``timing``."""

    def __init__(self, config: str, timing: LeaseTiming, log_path: Path) -> None:
        self.log_path = log_path
        args = [sys.executable, "-m", "tests.support.ops_cli", json.dumps(timing.__dict__),
                "dlq", "redrive", "--config", config, "--all"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=ROOT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()


def redrive_in_process(capsys, config: str) -> tuple[int, str, str, float]:
    started = time.monotonic()
    code = cli(["dlq", "redrive", "--config", config, "--all"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, time.monotonic() - started


def sent_once(collector: RecordingCollector, stream: list[tuple[bytes, bytes]]) -> bool:
    got = sorted(orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in collector.events())
    return got == sorted(orjson.dumps(orjson.loads(v), option=orjson.OPT_SORT_KEYS) for _, v in stream)


def holding_first(setup: Setup, gated: GatedCollector, timing: LeaseTiming, tmp_path: Path) -> RedriveProcess:
    """The first redrive, once it holds the lease and waits in its first request."""
    first = RedriveProcess(setup.first, timing, tmp_path / "first.log")
    assert eventually(lambda: gated.count == 1 or first.proc.poll() is not None, 120), first.output()
    assert first.proc.poll() is None and gated.count == 1, first.output()
    return first


def test_a_second_redrive_refuses_naming_the_first_which_finishes(kafka, tmp_path, capsys):
    """Production timing. While the first redrive waits on its collector, a second one
    exits 2 naming the first (host, pid, since when) and sends nothing; the first then
    re-drives every record, once."""
    with GatedCollector() as gated, RecordingCollector() as second_collector:
        setup = Setup(kafka, tmp_path, gated.url, second_collector.url)
        first = holding_first(setup, gated, LeaseTiming(), tmp_path)
        try:
            code, out, err, _ = redrive_in_process(capsys, setup.second)
            assert code == 2, out + err
            assert re.search(rf"another redrive of this dead-letter topic is running: host \S+, pid {first.proc.pid}, "
                             rf"holding the redrive lock {setup.dlq}\.redrive-lock since \S+", err), err
            assert "run one redrive at a time" in err, err
            assert second_collector.count == 0 and gated.count == 1

            gated.open()
            assert first.wait(240) == 0, first.output()
        finally:
            first.close()
        assert gated.count == setup.count and len(set(gated.bodies)) == setup.count, first.output()
        assert setup.position() == setup.count
    ops = [r["op"] for r in setup.lock_records()]
    assert ops[0] == "claim" and ops[-1] == "release" and ops.count("claim") == 1, ops


def test_a_killed_holder_is_taken_over_only_once_its_lease_expired(kafka, tmp_path, capsys, monkeypatch):
    """The first redrive is killed (SIGKILL) mid-delivery: no release. The second waits the
    takeover time without a heartbeat, sending nothing meanwhile, then re-drives every
    record (the one the first sent and could not mark, again: at least once)."""
    monkeypatch.setattr("relay.ops.redrive_lock.TIMING", FAST)
    with GatedCollector() as gated, RecordingCollector() as second_collector:
        setup = Setup(kafka, tmp_path, gated.url, second_collector.url)
        first = holding_first(setup, gated, FAST, tmp_path)
        try:
            first.proc.send_signal(signal.SIGKILL)
            first.wait(30)
        finally:
            first.close()
        arrivals: list[float] = []
        second_collector.reject_when(lambda _doc: arrivals.append(time.monotonic()) or None)
        started = time.monotonic()
        code, out, err, took = redrive_in_process(capsys, setup.second)
        assert code == 0, out + err
        assert f"waiting {FAST.takeover_s:g}s for a heartbeat before taking it over" in err, err
        assert f"no record in {setup.dlq}.redrive-lock for {FAST.takeover_s:g}s: taking the lock over" in err, err
        assert took >= FAST.takeover_s and min(arrivals) - started >= FAST.takeover_s, (took, arrivals)
        assert sent_once(second_collector, setup.stream)
        assert setup.position() == setup.count
    claims = [r for r in setup.lock_records() if r["op"] == "claim"]
    assert len(claims) == 2 and claims[1]["pid"] == os.getpid()


def test_a_holder_stopped_past_its_lease_sends_and_commits_nothing_more(kafka, tmp_path, capsys, monkeypatch):
    """The first redrive is stopped (SIGSTOP) mid-delivery, long enough for the second to
    take over and finish. Resumed, its request in flight is answered, and it stops: it
    sends no other record, writes no marker, commits no position (which would move the
    second's back) and says that its lease was lost."""
    monkeypatch.setattr("relay.ops.redrive_lock.TIMING", FAST)
    with GatedCollector() as gated, RecordingCollector() as second_collector:
        setup = Setup(kafka, tmp_path, gated.url, second_collector.url)
        first = holding_first(setup, gated, FAST, tmp_path)
        try:
            first.proc.send_signal(signal.SIGSTOP)
            assert eventually(lambda: process_state(first.proc.pid) == "T", 30)
            code, out, err, took = redrive_in_process(capsys, setup.second)
            assert code == 0, out + err
            assert took >= FAST.takeover_s
            assert sent_once(second_collector, setup.stream)
            assert setup.position() == setup.count
            markers = end_offsets(kafka.bootstrap_servers, f"{setup.dlq}.redriven")

            gated.open()  # the first's request in flight is answered...
            first.proc.send_signal(signal.SIGCONT)
            code = first.wait(240)  # ...and it ends
        finally:
            first.close()
        output = first.output()
        assert code == 2, output
        assert re.search("ran out: no heartbeat of this redrive was confirmed|was taken over by", output), output
        assert "This redrive stopped" in output, output
        assert "no redrive position was committed" in output, output
        assert gated.count == 1, f"the first sent {gated.count - 1} more after its lease was lost"
        assert setup.position() == setup.count, "the first committed its position over the second's"
        assert end_offsets(kafka.bootstrap_servers, f"{setup.dlq}.redriven") == markers, "markers written"
    releases = [r for r in setup.lock_records() if r["op"] == "release"]
    assert [r["pid"] for r in releases] == [os.getpid()], "only the second released the lock"


def test_a_lease_lost_while_records_go_back_to_the_topic_stops_them_and_commits_nothing(
        kafka, tmp_path, capsys, monkeypatch):
    """``--to-topic``, acknowledged one record at a time: the redrive's clock jumps an hour
    (a suspended machine) once two records were marked. It produces nothing more, commits
    no position, and says what it had re-driven."""
    monkeypatch.setattr("relay.ops.redrive_targets.TOPIC_FLUSH_EVERY", 1)
    marked: list[int] = []
    mark = RedriveLedger.mark

    def counted(self, partition, offset, *args):
        mark(self, partition, offset, *args)
        marked.append(offset)

    monkeypatch.setattr(RedriveLedger, "mark", counted)
    monkeypatch.setattr("relay.ops.redrive_lock.boot_clock",
                        lambda: time.monotonic() + (3600.0 if len(marked) >= 2 else 0.0))
    with RecordingCollector() as a:
        setup = Setup(kafka, tmp_path, a.url, a.url)
        topic = kafka.new_topic("ol")
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=setup.group, dlq=setup.dlq)
        path = write_config(tmp_path / "topic.yaml", config)
        code = cli(["dlq", "redrive", "--config", path, "--all", "--to-topic"])
        out, err = capsys.readouterr()
        assert code == 2, out + err
        assert "ran out: no heartbeat of this redrive was confirmed within 10s" in err, err
        assert "This redrive stopped" in err, err
        assert ("run the redrive again: it re-drives what is still pending (`dlq list` shows it), once no other "
                "redrive holds the lock (a lock without a heartbeat is taken over after 20s)") in err, err
        back = read_to_end(kafka.bootstrap_servers, topic)
        assert len(back) == 2 and marked == [0, 1], f"{len(back)} of {setup.count} records went back: {out}{err}"
        assert setup.position() < 0, "a position was committed after the loss"
        assert re.search(rf"re-driven\s+{len(back)}$", out, re.MULTILINE), out


def test_records_lingering_in_the_producer_when_the_lease_is_lost_are_dropped_not_written(
        kafka, tmp_path, capsys, monkeypatch):
    """``--to-topic`` with a producer lingering a minute (``_LINGER_MS``): three
    records are queued (none sent yet) when the redrive's clock jumps an hour. Checked
    before the fourth, the lease is lost: the queued ones are purged, so the topic gets
    none, no marker is written, no position committed; the summary counts them as not
    confirmed, not as failures."""
    produced: list[int] = []

    class CountingProducer(Producer):
        def produce(self, *args, **kwargs):
            super().produce(*args, **kwargs)
            produced.append(1)

    monkeypatch.setattr("relay.ops.redrive_targets.Producer", CountingProducer)
    monkeypatch.setattr("relay.ops.redrive_targets._LINGER_MS", 60000)
    monkeypatch.setattr("relay.ops.redrive_lock.boot_clock",
                        lambda: time.monotonic() + (3600.0 if len(produced) >= 3 else 0.0))
    with RecordingCollector() as a:
        setup = Setup(kafka, tmp_path, a.url, a.url)
        topic = kafka.new_topic("ol")
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=setup.group, dlq=setup.dlq)
        path = write_config(tmp_path / "topic.yaml", config)
        started = time.monotonic()
        code = cli(["dlq", "redrive", "--config", path, "--all", "--to-topic"])
        out, err = capsys.readouterr()
        assert time.monotonic() - started < 50, "it waited for the records to linger"
        assert code == 2, out + err
        assert len(produced) == 3, produced
        assert "This redrive stopped" in err, err
        assert read_to_end(kafka.bootstrap_servers, topic) == [], "a queued record was written after the loss"
        assert end_offsets(kafka.bootstrap_servers, f"{setup.dlq}.redriven") == {0: 0}, "markers written"
        assert setup.position() < 0, "a position was committed after the loss"
        assert re.search(r"^\s+not confirmed\s+3$", out, re.MULTILINE), out
        assert re.search(r"^\s+failed\s+0$", out, re.MULTILINE), out
        assert "NOT CONFIRMED (lease lost; may have arrived): 3 record(s)" in out, out


def test_the_topic_producer_lingers_20ms_whatever_the_producer_properties_say(monkeypatch):
    """``--to-topic`` waits for its records every ``TOPIC_FLUSH_EVERY``: a relay's
    ``linger.ms`` of a second would make that 50 records a second."""
    confs: list[dict] = []

    class Capturing:
        def __init__(self, conf: dict) -> None:
            confs.append(conf)

        def __len__(self) -> int:
            return 0

    monkeypatch.setattr("relay.ops.redrive_targets.Producer", Capturing)
    config = relay_config("127.0.0.1:9", "ol", {"a": "http://127.0.0.1:9"}, group="g", dlq="d")
    config = config.model_copy(update={"kafka": config.kafka.model_copy(
        update={"producer_properties": {"linger.ms": "1000", "compression.type": "zstd"}})})
    TopicRedrive(config, None, RedriveSummary()).run(object(), None)  # type: ignore[arg-type]
    assert len(confs) == 1 and confs[0]["linger.ms"] == 20 and confs[0]["compression.type"] == "zstd", confs


@pytest.mark.parametrize(("partitions", "config", "wrong"), [
    (1, {"cleanup.policy": "compact"}, "cleanup.policy=compact"),
    (2, {"cleanup.policy": "delete"}, "2 partitions"),
    (1, {"cleanup.policy": "delete", "retention.ms": "3600000", "retention.bytes": "-1"}, "retention.ms=3600000"),
    (1, {"retention.bytes": "1048576"}, "retention.bytes=1048576"),
])
def test_a_lock_topic_that_cannot_keep_the_lock_is_refused_naming_the_fix(kafka, tmp_path, capsys, partitions,
                                                                           config, wrong):
    """Compaction would keep only the last record, a retention would cut the log (a claim
    could vanish under its holder); several partitions would not order the records. Such a
    topic, created beforehand, is refused before anything is sent."""
    with RecordingCollector() as a:
        setup = Setup(kafka, tmp_path, a.url, a.url)
        create_topic(kafka.bootstrap_servers, f"{setup.dlq}.redrive-lock", partitions, config)
        code, out, err, _ = redrive_in_process(capsys, setup.first)
        assert code == 2, out + err
        assert f"the redrive lock topic {setup.dlq}.redrive-lock has {wrong}: the lock needs one ordered log" in err
        assert "(1 partition, cleanup.policy=delete, retention.ms=-1, retention.bytes=-1)" in err, err
        assert a.count == 0 and setup.position() < 0
        assert read_to_end(kafka.bootstrap_servers, f"{setup.dlq}.redrive-lock") == [], "it wrote to the topic"


def test_a_redrive_stopped_with_sigterm_releases_the_lock_at_once(kafka, tmp_path, capsys):
    """``docker stop`` / ``kubectl delete`` of a redrive (SIGTERM; as PID 1 a signal without a
    handler would even be ignored): it stops as an interrupt does, releasing its lease, so
    the next redrive starts at once instead of waiting out the takeover time; it commits
    no position past what it did not re-drive."""
    with GatedCollector() as gated, RecordingCollector() as second_collector:
        setup = Setup(kafka, tmp_path, gated.url, second_collector.url)
        first = holding_first(setup, gated, LeaseTiming(), tmp_path)
        try:
            first.proc.send_signal(signal.SIGTERM)
            code = first.wait(60)
        finally:
            first.close()
        assert code == 130, first.output()
        assert "interrupted" in first.output(), first.output()
        assert [r["op"] for r in setup.lock_records()][-1] == "release", setup.lock_records()
        code, out, err, _ = redrive_in_process(capsys, setup.second)
        assert code == 0, out + err
        assert "waiting" not in err, err
        assert sent_once(second_collector, setup.stream)
        assert setup.position() == setup.count
