"""``lineage-relay replay`` sends what the relay's own per-run stage sends the collector:
its delivery mode (consolidated, coalesce) and its sequencer's choice of terminal."""

from __future__ import annotations

import orjson
import pytest

from relay.config import OrderingConfig
from relay.embedded.collector import RecordingCollector
from relay.events import LineageEvent, SourceRef
from relay.ops.delivery import plan
from relay.ops.redrive_targets import _chains
from relay.stages.decode import decode_record
from relay.stages.merge import RunMerger
from tests.relay.ops.test_replay import canonical, run_cli, summary_value, write_config
from tests.support.kafka import produce

RUN = "0190a5c4-0000-7000-8000-0000000000a1"
OTHER_RUN = "0190a5c4-0000-7000-8000-0000000000b2"


@pytest.fixture
def backfill():
    with RecordingCollector() as collector:
        yield collector


def doc(event_type: str, second: int, run_id: str = RUN, *, run: dict | None = None, **extra) -> dict:
    return {"eventType": event_type, "eventTime": f"2024-05-01T10:00:{second:02d}Z", "producer": "https://x",
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": run_id, **(run or {})}, "job": {"namespace": "n", "name": "j"},
            "inputs": [], "outputs": [], **extra}


def facet(name: str) -> dict:
    return {name: {"_producer": "https://x", "_schemaURL": f"https://x/{name}.json", "value": name}}


def run_with_runnings() -> list[dict]:
    """START, three RUNNINGs each with its own run facet and output, COMPLETE."""
    docs = [doc("START", 0, inputs=[{"namespace": "db", "name": "in"}])]
    docs += [doc("RUNNING", i, run={"facets": facet(f"progress{i}")},
                 outputs=[{"namespace": "db", "name": f"out{i}"}]) for i in (1, 2, 3)]
    docs.append(doc("COMPLETE", 4, run={"facets": facet("done")}))
    return docs


def replay_all(kafka, tmp_path, capsys, backfill, docs: list[dict], **collector) -> str:
    topic = kafka.new_topic("ol")
    produce(kafka.bootstrap_servers, topic, [(RUN.encode(), orjson.dumps(d)) for d in docs])
    config = write_config(tmp_path, kafka, topic, {"backfill": backfill.url}, backfill=collector)
    code, out, err = run_cli(capsys, "replay", "--config", config, "--collector", "backfill",
                             "--from-offset", "0:0", "--to-end")
    assert code == 0, out + err
    return out


@pytest.mark.kafka
def test_replay_to_a_consolidated_collector_sends_start_and_one_merged_terminal(
        kafka, tmp_path, capsys, backfill):
    docs = run_with_runnings()
    out = replay_all(kafka, tmp_path, capsys, backfill, docs, mode="consolidated")

    got = backfill.events()
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    assert canonical(got[0]) == canonical(docs[0])
    merger = RunMerger()  # what the relay's consolidator merges the run into
    for d in docs:
        merger.add(d, decode_record(orjson.dumps(d), max_bytes=10_000).event_time)
    assert canonical(got[1]) == canonical(merger.consolidated_event())
    assert {"progress1", "progress2", "progress3", "done"} <= set(got[1]["run"]["facets"])
    assert [o["name"] for o in got[1]["outputs"]] == ["out1", "out2", "out3"]
    assert summary_value(out, "delivered") == 2
    assert "mode               consolidated" in out


@pytest.mark.kafka
def test_replay_to_a_coalesce_collector_merges_the_runnings(kafka, tmp_path, capsys, backfill):
    docs = run_with_runnings()
    out = replay_all(kafka, tmp_path, capsys, backfill, docs, mode="coalesce")

    got = backfill.events()
    assert [e["eventType"] for e in got] == ["START", "RUNNING", "COMPLETE"]
    assert canonical(got[0]) == canonical(docs[0]) and canonical(got[2]) == canonical(docs[4])
    merger = RunMerger()
    for d in docs[1:4]:
        merger.add(d, decode_record(orjson.dumps(d), max_bytes=10_000).event_time)
    assert canonical(got[1]) == canonical(merger.running_event())
    assert {"progress1", "progress2", "progress3"} <= set(got[1]["run"]["facets"])
    assert summary_value(out, "delivered") == 3


@pytest.mark.kafka
def test_replay_keeps_the_terminal_the_relay_sent_and_drops_what_it_dropped(
        kafka, tmp_path, capsys, backfill):
    """The run's START is out: its first terminal in topic order ends it (COMPLETE), though a
    FAIL with an earlier eventTime follows; a RUNNING after it is dropped, an OTHER is not."""
    docs = [doc("START", 0), doc("COMPLETE", 5), doc("FAIL", 4), doc("RUNNING", 3), doc("OTHER", 6)]
    out = replay_all(kafka, tmp_path, capsys, backfill, docs)

    assert [e["eventType"] for e in backfill.events()] == ["START", "COMPLETE", "OTHER"]
    assert summary_value(out, "after terminal") == 2
    assert summary_value(out, "delivered") == 3


# -- pure parts ---------------------------------------------------------------------------
def _event(d: dict, offset: int) -> LineageEvent:
    event = decode_record(orjson.dumps(d), max_bytes=10_000, source=SourceRef("t", 0, offset))
    assert isinstance(event, LineageEvent)
    return event


def _types(chains: list[list[LineageEvent]]) -> list[list[str]]:
    return [[f"{e.event_type}@{e.event_time.second}" for e in chain] for chain in chains]


def test_plan_follows_the_sequencer_before_and_after_the_start():
    # Held before the START: the earliest terminal by eventTime; the RUNNING read while it
    # waits out its grace goes before it. After the START: the first terminal read.
    early = [doc("COMPLETE", 9), doc("START", 0), doc("RUNNING", 1), doc("FAIL", 8)]
    late = [doc("START", 0, OTHER_RUN), doc("FAIL", 8, OTHER_RUN), doc("COMPLETE", 7, OTHER_RUN),
            doc("RUNNING", 2, OTHER_RUN), doc("OTHER", 3, OTHER_RUN)]
    events = [_event(d, i) for i, d in enumerate(early + late)]
    result = plan(events)
    assert _types(result.chains) == [["START@0", "RUNNING@1", "FAIL@8"], ["START@0", "FAIL@8", "OTHER@3"]]
    assert [f"{e.event_type}@{e.event_time.second}" for e, _ in result.dropped] == [
        "COMPLETE@9", "COMPLETE@7", "RUNNING@2"]
    # Without a grace the early terminal follows the START at once, and ends the run there.
    no_grace = plan(events, ordering=OrderingConfig(terminal_grace_s=0))
    assert _types(no_grace.chains)[0] == ["START@0", "COMPLETE@9"]
    # OTHER after the terminal is dropped when the relay drops it.
    strict = plan(events, ordering=OrderingConfig(
        forward_other_after_terminal=False))
    assert _types(strict.chains)[1] == ["START@0", "FAIL@8"]


def test_redrive_puts_what_the_relay_would_drop_in_its_run_never_after_the_terminal_but_terminals():
    events = [_event(d, i) for i, d in enumerate(
        [doc("START", 0), doc("COMPLETE", 5), doc("RUNNING", 3), doc("FAIL", 4)])]
    assert _types(_chains(events, ordered=True)) == [["START@0", "RUNNING@3", "COMPLETE@5", "FAIL@4"]]
