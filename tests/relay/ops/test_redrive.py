"""``lineage-relay dlq redrive`` when things go wrong half-way -- the broker stops answering,
a record meant for several collectors reaches only some of them -- and over many large
records. Each time the command ends, says what to do, and a second run finishes without
sending anything twice; its memory does not grow with the records' values."""

from __future__ import annotations

import hashlib
import re
import threading
import zlib
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from aiohttp import web
from confluent_kafka import Producer

from relay.cli import main as cli
from relay.config import RelayConfig
from relay.embedded.collector import AppThread, RecordingCollector
from relay.embedded.sample import sample_stream
from relay.ops.redrive_lock import LeaseTiming
from tests.support.dead_letters import padded, write_dead_letters
from tests.support.hanging_proxy import FETCH, OFFSET_COMMIT, hanging_broker
from tests.support.kafka import committed_offsets, produce, read_topic
from tests.support.python_memory import peak_python_memory
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


def canonical(doc: dict) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def received(collector: RecordingCollector, doc: dict) -> int:
    return sum(canonical(e) == canonical(doc) for e in collector.events())


def summary_value(out: str, name: str) -> int:
    match = re.search(rf"^\s+{re.escape(name)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no {name!r} in summary:\n{out}"
    return int(match.group(1))


def write_config(path: Path, config: RelayConfig) -> str:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
    return str(path)


def run_cli_within(capsys, timeout_s: float, *args: str) -> tuple[int, str, str]:
    """Run the CLI on a thread; fail if it has not ended within ``timeout_s``."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(cli(list(args))), daemon=True)
    thread.start()
    thread.join(timeout_s)
    captured = capsys.readouterr()
    assert not thread.is_alive(), f"`{' '.join(args[:2])}` still running after {timeout_s}s:\n{captured.err[-2000:]}"
    assert result, f"the command raised:\n{captured.err[-2000:]}"
    return result[0], captured.out, captured.err


def test_a_broker_that_stops_answering_at_the_position_commit_fails_redrive_in_time_and_a_rerun_finishes(
        tmp_path, capsys, monkeypatch):
    """The broker hangs when the redrive position is committed (the deliveries and their
    markers went through). The command ends within its Kafka timeout, exit 2, naming the
    commit, the group and what to do; run again once the broker is back, it sends nothing
    twice and commits the position (once the lease of the first run, which could not
    release it, expired)."""
    monkeypatch.setattr("relay.ops.ledger._TIMEOUT_S", 3.0)
    monkeypatch.setattr("relay.ops.redrive_lock.TIMING", LeaseTiming(heartbeat_s=0.5, holder_s=5.0, takeover_s=8.0))
    stream = sample_stream(2, seed=61)[:3]
    with hanging_broker() as (broker, proxy), RecordingCollector() as a:
        broker.create_topic("ol", 1)
        broker.create_topic("dlq", 1)
        write_dead_letters(broker.bootstrap_servers, "dlq", stream, reason="collector_rejected", collector="a")
        config = relay_config(broker.bootstrap_servers, "ol", {"a": a.url}, group="g", dlq="dlq")
        path = write_config(tmp_path / "relay.yaml", config)

        proxy.hang_at(OFFSET_COMMIT)
        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all")
        assert proxy.hung.is_set(), "the broker hung at the commit"
        assert code == 2, out + err
        assert "cannot commit the redrive position of group g.dlq-redrive" in err, err
        assert "run the command again" in err, err
        assert a.count == len(stream)

        proxy.recover()
        code, out, err = run_cli_within(capsys, 60, "dlq", "redrive", "--config", path, "--all")
        assert code == 0, out + err
        assert summary_value(out, "already re-driven") == len(stream) and summary_value(out, "re-driven") == 0
        assert "redrive position 0:3 committed (group g.dlq-redrive)" in out, out
        assert a.count == len(stream) and all(received(a, orjson.loads(v)) == 1 for _, v in stream)
        assert committed_offsets(broker.bootstrap_servers, "dlq", "g.dlq-redrive", 1) == {0: 3}


def test_a_record_meant_for_several_collectors_is_not_sent_again_to_one_that_has_it(kafka, tmp_path, capsys):
    """The relay dead-letters an event over ``max_event_bytes`` (too_large) before any
    collector saw it, so the dead letter names no collector. Once the limit is raised, a
    redrive sends it to every collector whose route takes it: ``a`` takes it, ``b`` refuses
    it; the record stays pending. The next redrive, ``b`` fixed, sends it to ``b`` only."""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = sample_stream(2, seed=1)
    sizes = sorted(len(v) for _, v in stream)
    assert sizes[-1] > sizes[-2] + 100, "one event is larger than the others"
    victim = orjson.loads(max(stream, key=lambda r: len(r[1]))[1])
    with RecordingCollector() as a, RecordingCollector() as b:
        urls = {"a": a.url, "b": b.url}
        group = kafka.new_group()
        relay = relay_config(kafka.bootstrap_servers, topic, urls, group=group, dlq=dlq,
                             pipeline={"max_event_bytes": sizes[-2] + 50})
        produce(kafka.bootstrap_servers, topic, stream)
        with RelayThread(relay):
            assert a.wait_for(lambda c: c.count == len(stream) - 1, 30), f"a got {a.count}"
            assert b.wait_for(lambda c: c.count == len(stream) - 1, 30), f"b got {b.count}"
            [dead] = read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=30)
        assert dead.headers["reason"] == b"too_large" and "collector" not in dead.headers
        # The limit raised: the record now decodes, and both collectors route it.
        path = write_config(tmp_path / "relay.yaml", relay_config(kafka.bootstrap_servers, topic, urls,
                                                                  group=group, dlq=dlq))
        b.reject_when(lambda doc: 400 if doc == victim else None)

        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all")
        assert code == 1, out + err
        assert "FAILED 0:0 (too_large" in out and "collector b: collector_rejected" in out, out
        assert received(a, victim) == 1 and received(b, victim) == 0

        b.reject_when(lambda doc: None)
        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all")
        assert code == 0, out + err
        assert summary_value(out, "re-driven") == 1
        assert received(b, victim) == 1
        assert received(a, victim) == 1, "a got the record again"

        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all")
        assert code == 0 and summary_value(out, "records scanned") == 0, out + err  # the position passed it
        assert received(a, victim) == 1 and received(b, victim) == 1


def test_a_record_handed_back_to_the_relay_skips_the_collectors_a_redrive_reached(kafka, tmp_path, capsys):
    """As above, ``a`` got the record from a first redrive and ``b`` refused it; then the
    record goes back to the topic (``--to-topic``) for the relay: ``b`` gets it, ``a`` not
    again (header ``redriven_have``)."""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = sample_stream(2, seed=1)
    sizes = sorted(len(v) for _, v in stream)
    victim = orjson.loads(max(stream, key=lambda r: len(r[1]))[1])
    with RecordingCollector() as a, RecordingCollector() as b:
        urls = {"a": a.url, "b": b.url}
        group = kafka.new_group()
        produce(kafka.bootstrap_servers, topic, stream)
        with RelayThread(relay_config(kafka.bootstrap_servers, topic, urls, group=group, dlq=dlq,
                                      pipeline={"max_event_bytes": sizes[-2] + 50})):
            assert a.wait_for(lambda c: c.count == len(stream) - 1, 30), f"a got {a.count}"
            assert b.wait_for(lambda c: c.count == len(stream) - 1, 30), f"b got {b.count}"
            read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=30)
        config = relay_config(kafka.bootstrap_servers, topic, urls, group=group, dlq=dlq)
        path = write_config(tmp_path / "relay.yaml", config)
        b.reject_when(lambda doc: 400 if doc == victim else None)
        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all")
        assert code == 1 and received(a, victim) == 1 and received(b, victim) == 0, out + err

        b.reject_when(lambda doc: None)
        code, out, err = run_cli_within(capsys, 15, "dlq", "redrive", "--config", path, "--all", "--to-topic")
        assert code == 0 and summary_value(out, "re-driven") == 1, out + err
        back = read_topic(kafka.bootstrap_servers, topic, expected=len(stream) + 1)[-1]
        assert back.headers["redriven_have"] == b"a"
        with RelayThread(config):
            assert b.wait_for(lambda c: received(c, victim) == 1, 30), "b never got the record"
            # a settled record is committed: wait for the group to pass it, then look at a
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1).get(0, -1)
                              >= len(stream) + 1, 30), "the relay did not settle it"
        assert received(a, victim) == 1, "a got the record again"


def test_a_handed_back_record_whose_redriven_have_is_not_utf8_still_reaches_the_others(kafka):
    """A record with ``redriven_from`` and a ``redriven_have`` naming ``a`` and a name that
    is not UTF-8 (any producer may write these headers): the relay leaves ``a`` out, sends it
    to ``b`` (the unreadable name names no collector) and goes on with the record after it.
    (The header's decoding raised in the relay's loop: it failed, and again on that record
    after every restart.)"""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = sample_stream(2, seed=7)
    victim = orjson.loads(stream[-1][1])  # the last: ``a`` holds none of its run's events for it
    with RecordingCollector() as a, RecordingCollector() as b:
        group = kafka.new_group()
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url}, group=group, dlq=dlq)
        produce(kafka.bootstrap_servers, topic, stream[:-2])
        produce(kafka.bootstrap_servers, topic, stream[-1:],
                headers=[("redriven_from", b"dlq/0/0"), ("redriven_have", b"a,b\xff")])
        produce(kafka.bootstrap_servers, topic, stream[-2:-1])
        with RelayThread(config):
            assert b.wait_for(lambda c: c.count == len(stream), 30), f"b got {b.count} of {len(stream)}"
            assert a.wait_for(lambda c: c.count == len(stream) - 1, 30), f"a got {a.count}"
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1).get(0, -1)
                              >= len(stream), 30), "the relay did not settle the records"
        assert received(a, victim) == 0 and received(b, victim) == 1


class DigestCollector:
    """A collector that keeps only a digest of each body it takes: the memory measured in
    this process is then the command's, not the collector's."""

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        app = web.Application(client_max_size=4 << 20)
        app.router.add_post("/api/v1/lineage", self._handle)
        self._thread = AppThread(app, "127.0.0.1", 0, name="digest-collector")

    async def _handle(self, request: web.Request) -> web.Response:
        self.received[hashlib.sha256(await request.read()).hexdigest()] += 1
        return web.Response(status=201)

    def __enter__(self) -> DigestCollector:
        self.url = f"http://127.0.0.1:{self._thread.start()}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop()


def test_redrive_holds_a_bounded_part_of_the_values_however_many_it_sends(kafka, tmp_path, capsys, monkeypatch):
    """64 dead letters of ~900 kB (57 MB) are re-driven while the command's Python memory
    stays well under their total: each value is read back when it is sent, with a few MB
    read ahead (4 MB here), not held from the read of the topic to the last delivery.
    (Two requests at a time: each one in flight holds its event, here and in the collector.)"""
    monkeypatch.setattr("relay.ops.stored_values.READ_AHEAD_BYTES", 4 << 20)
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = [(k, padded(v, 900_000)) for k, v in sample_stream(20, seed=71)][:64]
    total = sum(len(v) for _, v in stream)
    write_dead_letters(kafka.bootstrap_servers, dlq, stream, reason="collector_rejected", collector="a")
    with DigestCollector() as a:
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url}, group=kafka.new_group(), dlq=dlq,
                              collector={"concurrency": 2})
        path = write_config(tmp_path / "relay.yaml", config)
        code, peak = peak_python_memory(lambda: cli(["dlq", "redrive", "--config", path, "--all"]))
        out = capsys.readouterr().out
        assert code == 0, out
        assert summary_value(out, "re-driven") == len(stream)
        assert a.received == Counter(hashlib.sha256(v).hexdigest() for _, v in stream), "each sent once"
    assert peak < total * 0.6, f"peak {peak / 1e6:.0f} MB of Python memory for {total / 1e6:.0f} MB of values"


def test_a_dead_letter_whose_source_topic_is_gone_fails_alone(kafka, tmp_path, capsys):
    """Two dead letters written without their value name originals in a topic deleted since
    and in a partition the topic no longer has; a third is whole. Each of the two fails,
    naming where its original was, and stays pending; the third is re-driven. (The command
    stopped at the first, exit 2, "is the broker reachable?", re-driving nothing, every time.)"""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    [(key, value)] = sample_stream(1, seed=81)[:1]
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    headers = [("reason", b"collector_rejected"), ("detail", b"HTTP 400"), ("collector", b"a"),
               ("relay_time", b"2024-05-01T00:00:00+00:00")]
    for source, whole in ((f"{topic}-deleted/0/7", False), (f"{topic}/0/0", True), (f"{topic}/5/7", False)):
        omitted = [] if whole else [("value_omitted", b"1234")]
        producer.produce(dlq, key=key, value=value if whole else None,
                         headers=[*headers, ("source", source.encode()), *omitted])
    assert producer.flush(30) == 0
    with RecordingCollector() as a:
        path = write_config(tmp_path / "relay.yaml", relay_config(kafka.bootstrap_servers, topic, {"a": a.url},
                                                                  group=kafka.new_group(), dlq=dlq))
        for args in ((), ("--to-topic",)):
            code, out, err = run_cli_within(capsys, 60, "dlq", "redrive", "--config", path, "--all", *args)
            assert code == 1, out + err
            assert summary_value(out, "re-driven") == (1 if not args else 0), out
            assert f"FAILED 0:0 (collector_rejected, from {topic}-deleted/0/7): its value was omitted (1234 bytes) " \
                   f"and the original is no longer there: the record is no longer at {topic}-deleted/0/7" in out, out
            assert f"FAILED 0:2 (collector_rejected, from {topic}/5/7)" in out and "no partition 5" in out, out
            assert a.count == 1 and received(a, orjson.loads(value)) == 1


def test_a_record_one_collector_refused_goes_back_to_the_relay_for_that_collector_only(kafka, tmp_path, capsys):
    """``b`` refused an event that ``a`` took; the dead letter names ``b``. Handed back to
    the relay (``--to-topic``), it reaches ``b``, and not ``a`` a second time (the relay
    sent it to every collector again: ``a`` got it twice)."""
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = sample_stream(4, seed=83)
    victim = orjson.loads(stream[3][1])
    with RecordingCollector() as a, RecordingCollector() as b:
        group = kafka.new_group()
        config = relay_config(kafka.bootstrap_servers, topic, {"a": a.url, "b": b.url}, group=group, dlq=dlq)
        path = write_config(tmp_path / "relay.yaml", config)
        b.reject_when(lambda doc: 400 if doc == victim else None)
        produce(kafka.bootstrap_servers, topic, stream)
        with RelayThread(config):
            assert a.wait_for(lambda c: c.count == len(stream), 30), f"a got {a.count}"
            assert b.wait_for(lambda c: c.count == len(stream) - 1, 30), f"b got {b.count}"
            [dead] = read_topic(kafka.bootstrap_servers, dlq, expected=1, timeout_s=30)
        assert dead.headers["collector"] == b"b"
        b.reject_when(lambda doc: None)

        code, out, err = run_cli_within(capsys, 30, "dlq", "redrive", "--config", path, "--all", "--to-topic")
        assert code == 0 and summary_value(out, "re-driven") == 1, out + err
        with RelayThread(config):
            assert b.wait_for(lambda c: received(c, victim) == 1, 30), "b never got the record"
            assert eventually(lambda: committed_offsets(kafka.bootstrap_servers, topic, group, 1).get(0, -1)
                              >= len(stream) + 1, 30), "the relay did not settle it"
        assert received(a, victim) == 1, "a got the record again"
        assert a.count == len(stream) and b.count == len(stream)


def test_a_broker_that_stops_answering_while_values_are_read_back_fails_redrive_naming_the_read(
        tmp_path, capsys, monkeypatch):
    """The broker hangs once the first event reached the collector, as the next value is
    read back. The command ends in time, exit 2, saying which read got no answer and that
    the broker may be unreachable, besides the marker it could not write (it said only
    "1 redrive marker(s) were not written (first error: [])": the cause was lost)."""
    monkeypatch.setattr("relay.ops.ledger._TIMEOUT_S", 2.0)
    monkeypatch.setattr("relay.ops.ledger._ACK_TIMEOUT_S", 2.0)
    monkeypatch.setattr("relay.ops.kafka_range._STALL_S", 2.0)
    monkeypatch.setattr("relay.ops.stored_values.READ_AHEAD_BYTES", 1)  # every value is fetched when sent
    stream = sample_stream(3, seed=85)
    with hanging_broker() as (broker, proxy), RecordingCollector() as a:
        broker.create_topic("ol", 1)
        broker.create_topic("dlq", 1)
        write_dead_letters(broker.bootstrap_servers, "dlq", stream, reason="collector_rejected", collector="a")
        path = write_config(tmp_path / "relay.yaml", relay_config(broker.bootstrap_servers, "ol", {"a": a.url},
                                                                  group="g", dlq="dlq",
                                                                  collector={"concurrency": 1}))

        def hang_after_the_first(_doc: dict) -> None:
            if not proxy.hung.is_set():
                proxy.hang_at(FETCH)
            return None

        a.reject_when(hang_after_the_first)
        code, out, err = run_cli_within(capsys, 30, "dlq", "redrive", "--config", path, "--all")
        assert proxy.hung.is_set(), "the broker hung at a fetch"
        assert code == 2, out + err
        assert "no records arrived for 2s while reading dlq/0" in err and "is the broker reachable?" in err, err
        assert "redrive marker(s) were not written" in err, err
        assert a.count == 1


def test_records_handed_back_to_the_relay_go_to_the_partition_they_came_from(kafka, tmp_path, capsys):
    """``--to-topic`` produces each record to the partition its dead letter's ``source``
    names: the relay replica that owns that partition holds the record's run (a run keeps
    to the partition of its first event). A record from a topic the relay no longer
    consumes goes to the same partition number of the configured topic; one whose partition
    the topic does not have goes where the partitioner puts it, and the summary says both.
    (Every record went where librdkafka's partitioner put it: by CRC32 of the key, not the
    job's Java murmur2, and a null key anywhere.)"""
    topic, old, dlq = kafka.new_topic("ol", partitions=4), kafka.new_topic("old"), kafka.new_topic("dlq")
    values = [v for _, v in sample_stream(4, seed=85)][:12]
    # Keys librdkafka's partitioner (CRC32) does not put in partition 1; and null keys.
    keys = [k for k in (f"run:ns/job-{i}".encode() for i in range(100)) if zlib.crc32(k) % 4 != 1][:4]
    sources = ([(keys[i], f"{topic}/1/{i}") for i in range(4)] + [(None, f"{topic}/1/{i}") for i in range(4, 8)]
               + [(None, f"{old}/3/{i}") for i in range(2)] + [(keys[0], f"{topic}/6/{i}") for i in range(2)])
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for (key, source), value in zip(sources, values, strict=True):
        producer.produce(dlq, key=key, value=value, headers=[
            ("reason", b"collector_rejected"), ("detail", b"HTTP 400"), ("collector", b"a"),
            ("relay_time", b"2024-05-01T00:00:00+00:00"), ("source", source.encode())])
    assert producer.flush(30) == 0
    with RecordingCollector() as a:
        path = write_config(tmp_path / "relay.yaml", relay_config(kafka.bootstrap_servers, topic, {"a": a.url},
                                                                  group=kafka.new_group(), dlq=dlq))
        code, out, err = run_cli_within(capsys, 60, "dlq", "redrive", "--config", path, "--all", "--to-topic")
    assert code == 0 and summary_value(out, "re-driven") == len(sources), out + err
    back = read_topic(kafka.bootstrap_servers, topic, expected=len(sources), timeout_s=30)
    where = {int(r.headers["redriven_from"].rsplit(b"/", 1)[1]): r.partition for r in back}
    assert [where[i] for i in range(10)] == [1] * 8 + [3] * 2, where
    assert f"NOTE 2 record(s) came from {old}, which the relay does not consume: produced to {topic}, " \
           f"partition 3 as in the source" in out, out
    assert f"NOTE 2 record(s) {topic} has no partition 6: produced to {topic}, partition chosen by the " \
           f"partitioner (by key)" in out, out
