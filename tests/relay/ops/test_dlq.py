"""``lineage-relay dlq list|redrive`` against a real broker, a real relay and real HTTP
collectors: a record the relay dead-lettered is re-driven after a fix exactly once."""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka.admin import AdminClient

from relay.cli import main as cli
from relay.config import RelayConfig
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.ops.redrive_lock import LeaseTiming
from relay.source.admin import create_topic
from tests.support.dead_letters import write_dead_letters
from tests.support.kafka import committed_offsets, produce, read_to_end, read_topic
from tests.support.kafka_proxy import MESSAGE_TOO_LARGE, OUT_OF_ORDER_SEQUENCE_NUMBER, PRODUCE, proxied_broker
from tests.support.python_memory import peak_python_memory
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka

MALFORMED = b'{"eventTime": "2024-01-01T00:00:00Z", '


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_value(out: str, name: str) -> int:
    match = re.search(rf"^\s+{re.escape(name)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no {name!r} in summary:\n{out}"
    return int(match.group(1))


def received(collector: RecordingCollector, doc: dict) -> int:
    return sum(canonical(e) == canonical(doc) for e in collector.events())


@pytest.fixture
def setup(kafka, tmp_path):
    """A topic, its dead-letter topic, collector ``a`` and a config file for both the
    relay (in-process) and the CLI."""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    with RecordingCollector() as a:
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=kafka.new_group(), dlq=dlq)
        path = tmp_path / "relay.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
        yield config, str(path), a


def dead_letter(kafka, config: RelayConfig, a: RecordingCollector, records: list[tuple[bytes, bytes]],
                *, delivered: int, dead: int) -> None:
    """Run the relay over ``records`` until ``a`` has ``delivered`` events and the
    dead-letter topic ``dead`` records; stop it."""
    produce(kafka.bootstrap_servers, config.kafka.topics[0], records)
    with RelayThread(config):
        assert a.wait_for(lambda c: c.count == delivered, 30), f"a got {a.count} of {delivered}"
        got = read_topic(kafka.bootstrap_servers, config.kafka.dlq_topic, expected=dead, timeout_s=30)
        assert len(got) == dead


def test_a_fixed_record_is_redriven_once_and_other_reasons_stay_pending(kafka, setup, capsys):
    config, path, a = setup
    stream = sample_stream(6, seed=11)
    victim = orjson.loads(stream[4][1])
    a.reject_when(lambda doc: 400 if doc == victim else None)
    # The malformed record is dead-lettered first, so it sits before the victim in the
    # dead-letter topic: a --reason redrive must get past it without forgetting it.
    dead_letter(kafka, config, a, [(b"bad", MALFORMED)], delivered=0, dead=1)
    dead_letter(kafka, config, a, stream, delivered=len(stream) - 1, dead=2)
    relay_offsets = committed_offsets(kafka.bootstrap_servers, config.kafka.topics[0], config.kafka.group_id, 1)

    code, out, _ = run_cli(capsys, "dlq", "list", "--config", path)
    assert code == 0
    assert re.search(r"^collector_rejected\s+1 record\(s\)\s+1 pending .*collectors: a$", out, re.MULTILINE), out
    assert re.search(r"^invalid_json\s+1 record\(s\)\s+1 pending .*collectors: -$", out, re.MULTILINE), out
    code, out, _ = run_cli(capsys, "dlq", "list", "--config", path, "--reason", "collector_rejected", "--show")
    assert code == 0 and "invalid_json" not in out
    assert f"--- 0:1 collector_rejected [pending] collector=a source={config.kafka.topics[0]}/0/5 " in out
    assert "detail: HTTP 400: rejected by script" in out and victim["run"]["runId"] in out

    a.reject_when(lambda doc: None)  # the collector is fixed
    code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--reason", "collector_rejected")
    assert code == 0, out + err
    assert summary_value(out, "re-driven") == 1 and summary_value(out, "not selected") == 1
    assert received(a, victim) == 1 and a.count == len(stream)
    assert "dlq: re-driving" in err

    # Again, every pending record (--all): the victim is not sent again; the malformed
    # record still cannot be delivered, says so, and stays pending.
    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--all")
    assert code == 1
    assert summary_value(out, "already re-driven") == 1 and summary_value(out, "re-driven") == 0
    assert "FAILED 0:0 (invalid_json" in out and "still not a valid event (invalid_json)" in out
    assert received(a, victim) == 1 and a.count == len(stream)

    code, out, _ = run_cli(capsys, "dlq", "list", "--config", path)
    assert re.search(r"^collector_rejected\s+1 record\(s\)\s+0 pending", out, re.MULTILINE), out
    assert re.search(r"^invalid_json\s+1 record\(s\)\s+1 pending", out, re.MULTILINE), out
    # The relay's own consumer group was not touched.
    assert committed_offsets(kafka.bootstrap_servers, config.kafka.topics[0], config.kafka.group_id, 1) == relay_offsets


def test_selected_offsets_are_remembered_beyond_the_redrive_position(kafka, setup, capsys):
    config, path, a = setup
    stream = sample_stream(6, seed=12, running_per_run=(0, 0))
    first, second = orjson.loads(stream[2][1]), orjson.loads(stream[7][1])
    a.reject_when(lambda doc: 400 if doc in (first, second) else None)
    dead_letter(kafka, config, a, stream, delivered=len(stream) - 2, dead=2)
    dead = read_topic(kafka.bootstrap_servers, config.kafka.dlq_topic, expected=2)
    ref = {orjson.loads(r.value)["eventTime"]: f"{r.partition}:{r.offset}" for r in dead}
    # The relay may dead-letter the two in either order: "second" is the one at the higher
    # offset, beyond the redrive position once the other is left pending.
    first, second = (orjson.loads(r.value) for r in sorted(dead, key=lambda r: (r.partition, r.offset)))
    a.reject_when(lambda doc: None)

    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--dry-run")
    assert code == 0 and summary_value(out, "would re-drive") == 2
    assert a.count == len(stream) - 2

    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--offsets", ref[second["eventTime"]])
    assert code == 0 and summary_value(out, "re-driven") == 1
    assert received(a, second) == 1 and received(a, first) == 0

    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--all")
    assert code == 0 and summary_value(out, "re-driven") == 1
    assert summary_value(out, "already re-driven") == 1
    assert received(a, second) == 1 and received(a, first) == 1

    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--all")
    assert code == 0 and summary_value(out, "re-driven") == 0 and summary_value(out, "records scanned") == 0
    assert a.count == len(stream)
    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--offsets", "0:99")
    assert code == 1 and "NOT FOUND (no such dead-letter record): 0:99" in out


def recreate_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` and create it again, empty. A broker may finish a deletion after
    answering it: the topic is created once the broker no longer lists it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], request_timeout=15)[topic].result(timeout_s)
    assert eventually(lambda: topic not in admin.list_topics(timeout=15).topics, timeout_s), \
        f"{topic} still listed {timeout_s}s after its deletion"
    create_topic(bootstrap, topic, 1)


def test_a_dead_letter_topic_created_again_is_not_hidden_by_the_markers_of_the_old_one(kafka, setup, capsys):
    """Markers are keyed by offset and outlive the dead-letter topic (their topic is
    compacted). An operator who empties the dead-letter topic by deleting and creating it
    again gets new records at the old offsets: they are pending, not "already re-driven"."""
    config, path, a = setup
    dlq, collector = config.kafka.dlq_topic, "a"
    old, new = sample_stream(1, seed=21)[:3], sample_stream(1, seed=22)[:3]
    write_dead_letters(kafka.bootstrap_servers, dlq, old, reason="collector_rejected", collector=collector)
    # Only 0:1 and 0:2: 0:0 stays pending, so the position cannot pass them and only their
    # markers remember them.
    code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--offsets", "0:1,0:2")
    assert code == 0 and summary_value(out, "re-driven") == 2, out + err
    assert all(received(a, orjson.loads(v)) == 1 for _, v in old[1:])

    recreate_topic(kafka.bootstrap_servers, dlq)
    for i, record in enumerate(new):
        write_dead_letters(kafka.bootstrap_servers, dlq, [record], reason="collector_rejected", collector=collector,
                           source_topic=f"ol-later-{i}")
    # Tansu's high watermark of a partition created again trails what was written (3
    # records, one write each, read back as 2 until a later write), and a scan stops at it:
    # the checks are about the records the scan sees, 0:1 among them (marked as re-driven
    # in the old topic).
    code, out, _ = run_cli(capsys, "dlq", "list", "--config", path)
    listed = re.search(r"^collector_rejected\s+(\d) record\(s\)\s+(\d) pending", out, re.MULTILINE)
    assert listed and int(listed[1]) >= 2 and listed[2] == listed[1], out
    seen = int(listed[1])
    # A selective redrive of the first: the position it commits must not pass 0:1, which
    # only the old topic's marker calls re-driven.
    code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--offsets", "0:0")
    assert code == 0 and summary_value(out, "re-driven") == 1, out + err
    code, out, _ = run_cli(capsys, "dlq", "list", "--config", path)
    assert re.search(rf"^collector_rejected\s+{seen} record\(s\)\s+{seen - 1} pending", out, re.MULTILINE), out
    code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--all")
    assert code == 0, out + err
    assert summary_value(out, "re-driven") == seen - 1 and summary_value(out, "already re-driven") == 0, out
    assert all(received(a, orjson.loads(v)) == 1 for _, v in new[:seen])
    # Each of them once: another run finds nothing to do.
    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--all")
    assert code == 0 and summary_value(out, "re-driven") == 0, out


def test_redrive_to_topic_hands_the_record_back_to_the_relay_once(kafka, setup, capsys):
    config, path, a = setup
    topic = config.kafka.topics[0]
    stream = sample_stream(4, seed=13)
    victim = orjson.loads(stream[3][1])
    a.reject_when(lambda doc: 400 if doc == victim else None)
    dead_letter(kafka, config, a, stream, delivered=len(stream) - 1, dead=1)
    a.reject_when(lambda doc: None)

    code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--all", "--to-topic")
    assert code == 0, out + err
    assert summary_value(out, "re-driven") == 1
    records = read_topic(kafka.bootstrap_servers, topic, expected=len(stream) + 1)
    assert len(records) == len(stream) + 1
    back = records[-1]
    assert back.value == stream[3][1] and back.key == stream[3][0]
    assert back.headers["redriven_from"] == f"{config.kafka.dlq_topic}/0/0".encode()

    code, out, _ = run_cli(capsys, "dlq", "redrive", "--config", path, "--all", "--to-topic")
    assert code == 0 and summary_value(out, "re-driven") == 0
    # The relay picks the record up where its group left off: the victim arrives once.
    with RelayThread(config):
        assert a.wait_for(lambda c: c.count == len(stream), 30)
    assert received(a, victim) == 1
    assert len(read_to_end(kafka.bootstrap_servers, topic)) == len(stream) + 1


@pytest.mark.parametrize("event_type", ["COMPLETE", "START"])
def test_a_record_redriven_to_the_topic_reaches_the_collector_while_the_relay_runs(kafka, setup, capsys, event_type):
    """The relay saw the record's content before (it dead-lettered it) and, for a terminal,
    ended the run; and a restarted relay learns both from what precedes its committed offset
    (lookback). A record written back by ``redrive --to-topic`` is delivered all the same:
    neither a duplicate nor after its run's terminal."""
    config, path, a = setup
    stream = sample_stream(4, seed=17)
    index = next(i for i, (_, v) in enumerate(stream) if orjson.loads(v)["eventType"] == event_type)
    victim = orjson.loads(stream[index][1])
    a.reject_when(lambda doc: 400 if doc == victim else None)
    produce(kafka.bootstrap_servers, config.kafka.topics[0], stream)
    with RelayThread(config) as relay:
        assert a.wait_for(lambda c: c.count == len(stream) - 1, 30), f"a got {a.count}"
        assert len(read_topic(kafka.bootstrap_servers, config.kafka.dlq_topic, expected=1, timeout_s=30)) == 1
        a.reject_when(lambda doc: None)
        code, out, err = run_cli(capsys, "dlq", "redrive", "--config", path, "--all", "--to-topic")
        assert code == 0 and summary_value(out, "re-driven") == 1, out + err
        assert a.wait_for(lambda c: received(c, victim) == 1, 30), "the re-driven record delivered"
        assert relay.metric("lineage_relay_events_deduplicated_total", collector="a") == 0
        assert relay.metric("lineage_relay_events_dropped_total", collector="a", reason="after_terminal") == 0
    assert a.count == len(stream)


@contextmanager
def proxied_setup(tmp_path: Path, stream: list[tuple[bytes, bytes]], *, victim: int):
    """A broker behind a fault proxy with topic ``ol`` holding ``stream``, collector ``a``
    refusing ``stream[victim]`` (400), and the relay's config (and its file)."""
    doomed = orjson.loads(stream[victim][1])
    with proxied_broker() as (broker, proxy), RecordingCollector() as a:
        broker.create_topic("ol", 1)
        config = relay_config(broker.bootstrap_servers, "ol", {"a": a.url}, group="g", dlq="dlq")
        path = tmp_path / "relay.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
        a.reject_when(lambda doc: 400 if doc == doomed else None)
        produce(broker.bootstrap_servers, "ol", stream)
        yield broker, proxy, a, config, path


def test_a_dead_letter_written_without_its_value_is_redriven_from_the_source_topic(tmp_path, capsys):
    """The dead-letter topic refused the dead letter as too large (through a fault proxy),
    so the relay wrote it without its value. ``list --show`` says where the original is,
    and ``redrive`` reads it back from the source topic and delivers it."""
    stream = sample_stream(6, seed=12)
    with proxied_setup(tmp_path, stream, victim=3) as (broker, proxy, a, config, path):
        victim = orjson.loads(stream[3][1])
        proxy.refuse_produce(MESSAGE_TOO_LARGE, times=2)
        with RelayThread(config):
            assert a.wait_for(lambda c: c.count == len(stream) - 1, 30)
            [dead] = read_topic(broker.bootstrap_servers, "dlq", expected=1, timeout_s=30)
        assert dead.value is None and dead.headers["value_omitted"] == str(len(stream[3][1])).encode()

        code, out, _ = run_cli(capsys, "dlq", "list", "--config", str(path), "--show")
        assert code == 0
        assert (f"value: (omitted: {len(stream[3][1])} bytes, too large for the dead-letter topic; "
                f"the original is at ol/0/3)") in out, out
        a.reject_when(lambda doc: None)
        code, out, err = run_cli(capsys, "dlq", "redrive", "--config", str(path), "--all")
        assert code == 0, out + err
        assert summary_value(out, "re-driven") == 1
        assert received(a, victim) == 1 and a.count == len(stream)


def test_a_producer_made_fatal_by_the_broker_fails_redrive_with_the_reason_and_a_rerun_finishes(
        tmp_path, capsys, monkeypatch):
    """The broker answers the re-driven record with an out-of-order sequence (through a
    fault proxy): the redrive producer is fatal. The command says so and exits 2 (it raised
    out of the command before); run again, it re-drives the record. (The produce answered
    as it is: the claim of the redrive lock; no heartbeat in between.)"""
    monkeypatch.setattr("relay.ops.redrive_lock.TIMING", LeaseTiming(heartbeat_s=600, holder_s=1200, takeover_s=2400))
    stream = sample_stream(4, seed=13)
    with proxied_setup(tmp_path, stream, victim=3) as (broker, proxy, a, config, path):
        with RelayThread(config):
            assert a.wait_for(lambda c: c.count == len(stream) - 1, 30)
            assert len(read_topic(broker.bootstrap_servers, "dlq", expected=1, timeout_s=30)) == 1
        proxy.answer_with_error(PRODUCE, OUT_OF_ORDER_SEQUENCE_NUMBER, after=1)
        code, out, err = run_cli(capsys, "dlq", "redrive", "--config", str(path), "--all", "--to-topic")
        assert code == 2, out + err
        assert "lineage-relay dlq redrive: producing to the input topic failed:" in err
        assert "sequence desynchronization" in err and "run redrive again" in err
        code, out, err = run_cli(capsys, "dlq", "redrive", "--config", str(path), "--all", "--to-topic")
        assert code == 0, out + err
        assert summary_value(out, "re-driven") == 1


def test_list_streams_the_records_it_shows_and_holds_none(kafka, tmp_path, capsys):
    """``list --show`` over 64 dead letters of 900 kB (58 MB) prints every record and the
    summary while the command's Python memory stays a fraction of the topic: each record
    is printed as it is read, not held until the end. ``--limit`` stops the read early."""
    dlq = kafka.new_topic("dlq")
    values = [str(i).encode() + b"x" * 900_000 for i in range(64)]
    write_dead_letters(kafka.bootstrap_servers, dlq, [(b"k%d" % i, v) for i, v in enumerate(values)],
                       reason="collector_rejected", collector="a")
    config = relay_config(kafka.bootstrap_servers, "ol", {"a": "http://127.0.0.1:9"}, group=kafka.new_group(),
                          dlq=dlq)
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))

    code, peak = peak_python_memory(lambda: cli(["dlq", "list", "--config", str(path), "--show"]))
    out = capsys.readouterr().out
    assert code == 0
    assert len(re.findall(r"^--- 0:\d+ collector_rejected \[pending\] collector=a ", out, re.MULTILINE)) == 64
    assert "    value: 63xxxxxxx" in out and "... (900002 bytes)" in out
    assert re.search(r"^collector_rejected\s+64 record\(s\)\s+64 pending\s+offsets 0:0 \.\. 0:63", out, re.MULTILINE)
    total = sum(map(len, values))
    assert peak < total * 0.3, f"peak {peak / 1e6:.0f} MB of Python memory for {total / 1e6:.0f} MB of records"

    code, out, _ = run_cli(capsys, "dlq", "list", "--config", str(path), "--show", "--limit", "3")
    assert code == 0 and len(re.findall(r"^--- ", out, re.MULTILINE)) == 3
    assert re.search(r"^collector_rejected\s+3 record\(s\)\s+3 pending\s+offsets 0:0 \.\. 0:2", out, re.MULTILINE)
