"""Garbage cycles in a relay process: `tune_gc` makes the automatic collector rare (events
are acyclic and freed by reference counting), so the relay's loop collects on its own timer:
the young generations every `GC_EVERY_S`, everything every `_GC_FULL_EVERY` rounds."""

from __future__ import annotations

import gc
import weakref

import pytest

import relay.app
import relay.process
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.kafka import produce
from tests.support.relay import RelayThread, eventually, relay_config

pytestmark = pytest.mark.kafka


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def _garbage_cycle() -> weakref.ref:
    return weakref.ref(_Node())


def test_the_relays_loop_collects_young_and_promoted_cycles_on_its_timer(kafka, monkeypatch):
    monkeypatch.setattr(relay.app, "GC_EVERY_S", 0.2)
    monkeypatch.setattr(relay.process, "_GC_FULL_EVERY", 3)
    topic, dlq = kafka.new_topic("ol"), kafka.new_topic("dlq")
    stream = sample_stream(5, seed=3)
    produce(kafka.bootstrap_servers, topic, stream)
    with RecordingCollector() as collector:
        config = relay_config(kafka.bootstrap_servers, topic, {"c": collector.url}, group=kafka.new_group(),
                              dlq=dlq)
        gc.disable()  # only the relay's own collections may free the cycles below
        try:
            with RelayThread(config):
                assert collector.wait_for(lambda c: c.count >= len(stream), 60), f"got {collector.count}"
                promoted = _Node()
                gc.collect()  # promoted, while alive, to the oldest generation
                promoted_ref = weakref.ref(promoted)
                del promoted
                young_ref = _garbage_cycle()
                assert young_ref() is not None and promoted_ref() is not None
                assert eventually(lambda: young_ref() is None, 10), "a young cycle outlived the relay's collections"
                assert eventually(lambda: promoted_ref() is None, 10), \
                    "a cycle in the oldest generation outlived the relay's full collections"
        finally:
            gc.enable()


def test_after_tune_gc_what_a_relay_holds_in_flight_starts_no_automatic_collection():
    """A lane's `max_pending` events (~5 tracked objects each at the default 20,000) and a
    poll batch (8,000 records, ~5 each) come and go without one."""
    before, started = gc.get_threshold(), []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    try:
        relay.process.tune_gc()
        gc.callbacks.append(record)
        held = [[] for _ in range(5 * 20_000 + 5 * 8_000)]
        assert started == [] and len(held) == 140_000
        del held
    finally:
        if record in gc.callbacks:
            gc.callbacks.remove(record)
        gc.unfreeze()
        gc.set_threshold(*before)
