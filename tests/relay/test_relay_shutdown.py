"""How long a stopping relay takes: it returns within ``drain_timeout_s`` + ``CLOSE_MARGIN_S``
of the stop, whatever the broker and the collectors do (Kubernetes' SIGKILL comes at
terminationGracePeriodSeconds), and is not ready from the moment it starts stopping, an
error of its own included."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from confluent_kafka import OFFSET_INVALID

from relay.app import CLOSE_MARGIN_S
from relay.embedded.broker import EmbeddedBroker
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.source.lookback import Lookback
from tests.support.kafka import committed_offsets, produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka

DRAIN_S = 4.0
#: Thread hand-overs on the way out: every step of the relay's own is bounded by the deadline.
SLACK_S = 1.5
#: A look-back reading from a slow partition leader (within lookback.timeout_s).
LOOKBACK_S = 20.0


def stop_within(relay: RelayThread, timeout_s: float) -> float:
    """Stop ``relay``; the seconds it took (it must take less than ``timeout_s``)."""
    began = time.monotonic()
    relay.stop(timeout_s=timeout_s)
    return time.monotonic() - began


def logged(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(r.getMessage() == event for r in caplog.records)


def test_a_stop_with_the_broker_gone_returns_within_drain_timeout_and_the_close_margin():
    """A consolidated collector keeps run state in the broker; the broker is gone with run
    state unacknowledged. Each step used to wait its own timeout: the periodic commit's
    wait for the run state (20 s, blind to the stop), the drain, the final commit's wait
    (20 s more), leaving the group (up to 30 s), flushing the producers (10 s each): 83 s
    with drain_timeout_s 20, past the grace period, so the pod was killed."""
    with EmbeddedBroker() as broker, RecordingCollector(latency_s=0.2) as collector:
        broker.create_topic("events", 2)
        produce(broker.bootstrap_servers, "events", sample_stream(150, seed=1))
        relay = RelayThread(relay_config(broker.bootstrap_servers, "events", {"c": collector.url}, group="g",
                                         dlq="dlq", collector={"mode": "consolidated"},
                                         drain_timeout_s=DRAIN_S)).start()
        assert collector.wait_for(lambda c: c.count >= 20, 30), "the relay delivers before the broker goes"
        broker.stop()
        assert relay.relay is not None and relay.relay.state is not None
        changelog = relay.relay.state.changelog
        assert eventually(lambda: changelog.unacked > 0, 20), "run state the broker will never acknowledge"
        assert stop_within(relay, DRAIN_S + CLOSE_MARGIN_S + SLACK_S) > DRAIN_S - 0.5  # it did drain


def test_a_stop_during_a_revocations_wait_for_deliveries_ends_within_drain_timeout(kafka, caplog):
    """A replica joins while the first one's deliveries hang: the first waits for those of
    the partitions it gives up (up to drain_timeout_s). A stop meanwhile used to let that
    wait run out, and then drain for drain_timeout_s more (38 s with drain_timeout_s 20)."""
    topic, dlq, group = kafka.new_topic("revoke-stop", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    produce(kafka.bootstrap_servers, topic, sample_stream(40, seed=1))
    with RecordingCollector(latency_s=60) as collector:
        def config():  # noqa: ANN202
            return relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=group, dlq=dlq,
                                collector={"timeout_s": 120}, drain_timeout_s=DRAIN_S)
        first = RelayThread(config()).start()
        second = None
        try:
            assert eventually(lambda: first.relay is not None and len(first.relay.source.assignment) == 2
                              and first.relay.lanes[0].pending > 0, 30)
            with caplog.at_level(logging.INFO, logger="relay"):
                second = RelayThread(config()).start()
                assert eventually(lambda: logged(caplog, "revoke_waiting_for_deliveries"), 30)
            # The collector still holds every delivery: the drain runs out, closing is quick.
            took = stop_within(first, DRAIN_S + SLACK_S)
            assert took > DRAIN_S - 0.5
        finally:
            first.stop(timeout_s=60)
            if second is not None:
                second.stop(timeout_s=60)


def test_a_relay_failing_is_not_ready_and_leaves_the_group_without_waiting_again(kafka, caplog):
    """After an error in the main loop (a bug here; a fatal consumer error or a rebalance
    handler timeout alike) the relay drains and closes as on a stop. It used to be ready
    meanwhile (/readyz 200), and leaving the group ran the revocation as if the relay went
    on: it waited for the deliveries the drain had given up on, again, up to
    drain_timeout_s (with a batch collector for all of it: its stopped dispatcher never let
    go of them)."""
    topic, dlq, group = kafka.new_topic("fails", partitions=2), kafka.new_topic("dlq"), kafka.new_group()
    produce(kafka.bootstrap_servers, topic, sample_stream(40, seed=1))
    with RecordingCollector(batch_path="/api/v1/lineage/batch", latency_s=60) as collector:
        relay = RelayThread(relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=group, dlq=dlq,
                                         collector={"batch": {"max_events": 5}, "timeout_s": 120},
                                         drain_timeout_s=DRAIN_S)).start()
        assert eventually(lambda: relay.relay is not None and len(relay.relay.source.assignment) == 2
                          and relay.relay.lanes[0].pending > 0 and relay.relay.ready, 30)

        async def broken() -> None:
            raise RuntimeError("a bug in the main loop")
        with caplog.at_level(logging.INFO, logger="relay"):
            assert relay._loop is not None
            relay._loop.call_soon_threadsafe(setattr, relay.relay.backpressure, "apply", broken)
            assert eventually(lambda: logged(caplog, "relay_draining"), 10)
            assert not relay.relay.ready, "/readyz would answer 200 while the relay stops"
            # Not stopped from outside (a stop asked for would hide it): it ends by itself.
            assert relay._thread is not None
            relay._thread.join(DRAIN_S + SLACK_S)
            ended = not relay._thread.is_alive()
            with pytest.raises(RuntimeError, match="a bug in the main loop"):
                relay.stop(timeout_s=60)
        assert ended, "leaving the group waited for the deliveries again"
        assert not logged(caplog, "revoke_waiting_for_deliveries")


def test_a_stop_during_an_assignments_lookback_returns_within_drain_timeout(kafka, monkeypatch, caplog):
    """The look-back (or a run-state restore) runs in the assignment callback, inside the
    poll the loop waits on; it did not look at the stop: with a look-back taking 20 s
    (a slow partition leader, within lookback.timeout_s) the relay returned 20.6 s after a
    stop it had to answer within drain_timeout_s + 5 s. Now the stop ends it, and none of
    the partition's records is handled or committed (they are read again after the restart)."""
    topic, dlq, group = kafka.new_topic("assign-stop"), kafka.new_topic("dlq"), kafka.new_group()
    produce(kafka.bootstrap_servers, topic, sample_stream(3, seed=1))
    reading = threading.Event()

    async def slow_prime(self, partitions):  # noqa: ANN001, ANN202 - Lookback.prime
        reading.set()
        await asyncio.sleep(LOOKBACK_S)  # ok: the slow read itself, not a wait for a condition
        return 0
    monkeypatch.setattr(Lookback, "prime", slow_prime)
    with RecordingCollector() as collector:
        relay = RelayThread(relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=group, dlq=dlq,
                                         pipeline={"lookback": {"timeout_s": 50}}, drain_timeout_s=DRAIN_S)).start()
        try:
            assert reading.wait(30), "the assignment's look-back began"
            with caplog.at_level(logging.INFO, logger="relay"):
                took = stop_within(relay, LOOKBACK_S)
            assert took < DRAIN_S + CLOSE_MARGIN_S + SLACK_S, f"returned {took:.1f} s after the stop"
        finally:
            relay.stop(timeout_s=60)
        assert logged(caplog, "assignment_abandoned")
        assert collector.count == 0
        assert committed_offsets(kafka.bootstrap_servers, topic, group, 1) == {0: OFFSET_INVALID}
