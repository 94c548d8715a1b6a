"""A relay that starts on a topic already partly delivered knows the runs begun before the
committed offset (it reads back ``pipeline.lookback.max_records`` records per partition
before it): their terminal events are delivered at once instead of being held for a START
delivered long ago, and an event sent again by its producer across the restart is a
duplicate still."""

from __future__ import annotations

import logging

import orjson
import pytest

from relay.embedded.broker import EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.relay.test_relay_end_to_end import assert_run_order
from tests.support.kafka import committed_offsets, produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka

TERMINALS = {"COMPLETE", "FAIL", "ABORT"}
#: Far longer than the test waits: an event held for its START is never released by time.
HOLD_S = 600.0


def split_by_terminal(stream):  # noqa: ANN001, ANN201
    """Records up to each run's terminal (not included), and the terminals."""
    before, terminals = [], []
    for key, value in stream:
        (terminals if orjson.loads(value).get("eventType") in TERMINALS else before).append((key, value))
    return before, terminals


def committed(broker, partitions: int) -> int:  # noqa: ANN001
    return sum(max(0, o) for o in committed_offsets(broker.bootstrap_servers, "events", "g", partitions).values())


@pytest.mark.parametrize("max_records", [10_000, 0], ids=["lookback", "no-lookback"])
def test_a_restarted_relay_knows_the_runs_begun_before_its_committed_offset(caplog, max_records):
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        before, terminals = split_by_terminal(sample_stream(12, seed=5, out_of_order_ratio=0.0, running_per_run=(1, 2)))
        runs = len(terminals)
        assert runs == 12
        resent = next(v for _, v in before if orjson.loads(v)["eventType"] == "RUNNING")

        def config():  # noqa: ANN202
            return relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                                pipeline={"ordering": {"hold_timeout_s": HOLD_S, "on_hold_timeout": "dead_letter"},
                                          "lookback": {"max_records": max_records}})

        produce(broker.bootstrap_servers, "events", before)
        with RelayThread(config()) as first:
            assert collector.wait_for(lambda c: c.count == len(before), 60), "the runs' first events delivered"
            assert eventually(lambda: committed(broker, 2) == len(before), 30)
        assert first.error is None

        # Across the restart: each run's terminal, and a RUNNING its producer sent again.
        key = next(k for k, v in before if v == resent)
        produce(broker.bootstrap_servers, "events", [*terminals, (key, resent)])
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config()) as second:
            if max_records:
                assert collector.wait_for(lambda c: c.count == len(before) + runs, 60), \
                    f"{len(before) + runs - collector.count} terminals not delivered (held for their START?)"
                assert eventually(lambda: committed(broker, 2) == len(before) + runs + 1, 30)
                assert second.metric("lineage_relay_events_deduplicated_total", collector="c") == 1
                assert second.metric("lineage_relay_lookback_events_total") == len(before)
                assert second.metric("lineage_relay_events_held", collector="c") == 0
            else:
                # Without it, each terminal waits for a START the relay never sees again.
                # (and the RUNNING sent again is held too: its run is unknown).
                assert eventually(lambda: second.metric("lineage_relay_events_held", collector="c") == runs + 1, 60)
                assert collector.count == len(before)
        assert second.error is None
    if max_records:
        events = collector.events()
        assert len(events) == len(before) + runs  # the RUNNING sent again was not delivered twice
        assert_run_order(events)
        assert any(r.getMessage() == "lookback_read" for r in caplog.records)
        assert second.metric("lineage_relay_events_dead_lettered_total", reason="hold_timeout") == 0


def test_a_look_back_out_of_time_is_logged_and_the_relay_goes_on(caplog):
    """Out of time (timeout_s), the relay says which partitions it did not read back, and
    consumes them all the same: their runs' later events wait for a START as before."""
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 1)
        before, terminals = split_by_terminal(sample_stream(3, seed=6, running_per_run=(1, 1)))

        def config(timeout_s: float):  # noqa: ANN202
            return relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                                pipeline={"ordering": {"hold_timeout_s": HOLD_S},
                                          "lookback": {"timeout_s": timeout_s}})

        produce(broker.bootstrap_servers, "events", before)
        with RelayThread(config(10)):
            assert collector.wait_for(lambda c: c.count == len(before), 60)
            assert eventually(lambda: committed(broker, 1) == len(before), 30)
        produce(broker.bootstrap_servers, "events", terminals)
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config(1e-6)) as second:
            assert eventually(lambda: second.metric("lineage_relay_events_held", collector="c") == len(terminals), 60)
            assert second.metric("lineage_relay_lookback_events_total") == 0
        incomplete = [r for r in caplog.records if r.getMessage() == "lookback_incomplete"]
        assert incomplete and incomplete[0].fields["partitions"] == "events/0"


@pytest.mark.parametrize(("search_records", "search_timeout_s", "policy"),
                         [(200_000, 60, "dead_letter"), (200_000, 60, "forward"), (0, 60, "dead_letter"),
                          (200_000, 1e-6, "dead_letter")],
                         ids=["search", "search-forward", "no-search", "search-out-of-time"])
def test_runs_begun_further_back_than_the_look_back_are_found_by_searching(caplog, search_records,
                                                                          search_timeout_s, policy):
    """A run whose START lies further back than ``max_records`` (a long job on a busy
    topic) is held after a restart; once held ``search_after_s``, the partition is searched
    further back: its held events go out at once instead of after ``hold_timeout_s``, and a
    late event of a run that had ended there is dropped as after its terminal. A search out
    of time says so, and the runs it did not find stay held. (With ``on_hold_timeout:
    forward``, that late event would otherwise reach the collector after the run's end.)"""
    found = search_records and search_timeout_s > 1
    with EmbeddedBroker() as broker, RecordingCollector() as collector:
        broker.create_topic("events", 2)
        ended = sample_stream(3, seed=8, out_of_order_ratio=0.0, running_per_run=(1, 1))
        before, terminals = split_by_terminal(sample_stream(12, seed=5, out_of_order_ratio=0.0, running_per_run=(1, 2)))
        late_key, late = next((k, v) for k, v in ended if orjson.loads(v)["eventType"] == "RUNNING")

        def config(max_records: int):  # noqa: ANN202
            return relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g", dlq="dlq",
                                pipeline={"ordering": {"hold_timeout_s": HOLD_S, "on_hold_timeout": policy},
                                          "dedupe": {"enabled": False},
                                          "lookback": {"max_records": max_records, "search_records": search_records,
                                                       "search_after_s": 0.5, "search_timeout_s": search_timeout_s}})

        produce(broker.bootstrap_servers, "events", [*ended, *before])
        delivered = len(ended) + len(before)
        with RelayThread(config(10_000)):
            assert collector.wait_for(lambda c: c.count == delivered, 60)
            assert eventually(lambda: committed(broker, 2) == delivered, 30)

        # A late copy of an ended run's RUNNING (its producer retried), then each run's terminal.
        produce(broker.bootstrap_servers, "events", [(late_key, late), *terminals])
        with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config(1)) as second:
            if found:
                assert collector.wait_for(lambda c: c.count == delivered + len(terminals), 60), \
                    f"{delivered + len(terminals) - collector.count} terminals still held for their START"
                assert eventually(lambda: committed(broker, 2) == delivered + len(terminals) + 1, 30)
                assert second.metric("lineage_relay_events_held", collector="c") == 0
                assert second.metric("lineage_relay_events_dropped_total", collector="c", reason="after_terminal") == 1
                assert second.metric("lineage_relay_lookback_runs_found_total", collector="c", result="finished") == 1
                # One record per partition read back: at most two runs known without a search.
                assert second.metric("lineage_relay_lookback_runs_found_total", collector="c",
                                     result="open") >= len(terminals) - 2
            else:
                assert eventually(lambda: second.metric("lineage_relay_events_held", collector="c")
                                  == len(terminals) + 1, 60)
                assert collector.count == delivered
                if search_records:
                    assert eventually(lambda: any(r.getMessage() == "run_search_incomplete" for r in caplog.records),
                                      30)
                    assert second.metric("lineage_relay_lookback_runs_found_total", collector="c",
                                         result="open") == 0
        assert second.error is None
    if found:
        assert_run_order(collector.events())
        searched = [r for r in caplog.records if r.getMessage() == "run_search_read"]
        assert searched and searched[0].fields["records"] > 0
        assert second.metric("lineage_relay_events_dead_lettered_total", reason="hold_timeout") == 0
