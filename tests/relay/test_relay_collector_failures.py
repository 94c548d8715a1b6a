"""An event a collector fails on, told from an outage, through the relay against a real
broker and a loopback Marquez (tests/support/kind_servers.py) that answers chosen events
a steady bare 500 while it takes the others, as Marquez does for an event it throws on."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import chain

import orjson
import pytest

from relay.config import build_config
from relay.embedded.broker import FAST_GROUP_PROPERTIES
from relay.embedded.sample import message_key, spark_run
from tests.support.kafka import committed_offsets, produce, read_to_end
from tests.support.kind_servers import MARQUEZ, KindServer
from tests.support.relay import RelayThread, eventually
from tests.support.runs import by_run

pytestmark = pytest.mark.kafka

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
PARTITIONS = 2


def records(events: list[dict]) -> list[tuple[bytes, bytes]]:
    return [(message_key(e).encode(), orjson.dumps(e)) for e in events]


def identity(doc: dict) -> tuple[str, str, str]:
    return doc["run"]["runId"], doc["eventType"], doc["eventTime"]


def test_an_event_the_collector_fails_on_is_dead_lettered_its_run_goes_on_and_an_outage_is_waited_out(kafka):
    """Two events Marquez answers 500 every time: one run's START, another's RUNNING. Each
    held its run, the partition's offset commits and, through backpressure, consumption for
    good. Now each is dead-lettered as collector_failed_event once it got five 500s with
    other events taken in between; every other event is delivered, each run's in order (a
    run whose START failed so goes on without it, as after a START refused with a 400), and
    every offset is committed. Then Marquez answers everything 500 (an outage): nothing is
    dead-lettered, commits wait, and once it is back everything is delivered."""
    topic, dlq, group = kafka.new_topic("failing", partitions=PARTITIONS), kafka.new_topic("dlq"), kafka.new_group()
    rng = random.Random(23)
    runs = [spark_run("ns", f"etl.job_{i}", start=T0 + timedelta(minutes=i), rng=rng, with_running=2)
            for i in range(6)]
    poison = {identity(runs[1][0]): "START", identity(runs[4][2]): "RUNNING"}
    assert sorted(poison.values()) == ["RUNNING", "START"]
    produced = records(list(chain.from_iterable(runs)))
    produce(kafka.bootstrap_servers, topic, produced)

    def committed() -> int:
        return sum(o for o in committed_offsets(kafka.bootstrap_servers, topic, group, PARTITIONS).values() if o > 0)

    with KindServer(MARQUEZ, fails_on=lambda doc: identity(doc) in poison) as marquez:
        config = build_config({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                      "dlq_topic": dlq, "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
            "collectors": [{"name": "marquez", "type": "marquez", "url": marquez.url,
                            # Retries far apart next to the traffic, as in production (up to
                            # 30 s): the two failing events' 500s are a small share of all.
                            "retry": {"initial_backoff_s": 0.2, "max_backoff_s": 1.0}}],
            "http": {"port": None}, "drain_timeout_s": 10})
        with RelayThread(config) as relay:
            def failed_events() -> float:
                return relay.metric("lineage_relay_events_dead_lettered_total", reason="collector_failed_event")

            # Other runs keep coming while the two are retried: ten filler runs at a time,
            # the next ten once they were delivered (a collector nothing else reaches cannot
            # tell an event it fails on from an outage, nor one whose other events fail about
            # as often as they are accepted, and the relay keeps retrying then).
            fillers = 0
            while failed_events() < 2:
                assert fillers < 600, f"not dead-lettered after {fillers} filler runs: {failed_events()}"
                batch = [spark_run("ns-filler", f"filler.job_{fillers + i}", rng=rng, with_running=2,
                                   start=T0 + timedelta(hours=1, seconds=fillers + i)) for i in range(10)]
                batch_records = records(list(chain.from_iterable(batch)))
                produce(kafka.bootstrap_servers, topic, batch_records)
                produced += batch_records
                last = {identity(run[-1]) for run in batch}
                assert marquez.wait_for(lambda s: last <= {identity(e) for e in s.received()}, 30)
                fillers += 10
            assert eventually(lambda: committed() == len(produced), 30), (committed(), len(produced))
            assert eventually(lambda: len(marquez.received()) == len(produced) - 2, 30)

            # An outage: everything answered 500, for far longer than five attempts each.
            before_outage = len(produced)
            marquez.outage = 500
            late = [spark_run("ns-late", f"late.job_{i}", start=T0 + timedelta(hours=2, minutes=i), rng=rng,
                              with_running=1) for i in range(3)]
            produce(kafka.bootstrap_servers, topic, records(list(chain.from_iterable(late))))
            produced += records(list(chain.from_iterable(late)))
            seen_before = len(marquez.seen())
            assert eventually(lambda: len(marquez.seen()) - seen_before >= 3 * 15, 60)
            assert failed_events() == 2 and committed() == before_outage
            marquez.outage = None
            assert eventually(lambda: len(marquez.received()) == len(produced) - 2, 60)
            assert eventually(lambda: committed() == len(produced), 30), (committed(), len(produced))
            assert failed_events() == 2
            assert relay.metric("lineage_relay_events_dead_lettered_total", reason="retries_exhausted") == 0

    dead = read_to_end(kafka.bootstrap_servers, dlq)
    assert sorted(poison[identity(orjson.loads(d.value))] for d in dead) == ["RUNNING", "START"]
    for record in dead:
        assert record.headers["reason"] == b"collector_failed_event" and record.headers["collector"] == b"marquez"
        assert b"HTTP 500 to this event 5 times while the collector accepted other events" in record.headers["detail"]
    # Every other event delivered, each run's in its own order, the failing ones left out.
    sent = [orjson.loads(v) for _, v in produced]
    got = by_run(marquez.received())
    for run_id, expected in by_run([e for e in sent if identity(e) not in poison]).items():
        assert [identity(e) for e in got[run_id]] == [identity(e) for e in expected], run_id
    assert [e["eventType"] for e in got[runs[1][0]["run"]["runId"]]] == ["RUNNING", "RUNNING", "COMPLETE"]
