"""The run search: its filter (which records are worth decoding: a START or a terminal),
its reader against a real broker, and what it tells each collector's sequencer."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time

import orjson
import pytest

from relay.config import KafkaConfig, LookbackConfig
from relay.embedded.sample import sample_stream
from relay.events import LineageEvent, SourceRef
from relay.source import run_search
from relay.source.run_search import _may_start_or_end
from relay.stages.decisions import Drop, Forward
from relay.stages.sequence import RunSequencer

WANTED = {"START", "COMPLETE", "FAIL", "ABORT"}


def test_the_filter_agrees_with_the_event_type_on_a_spark_like_stream():
    values = [v for _, v in sample_stream(60, seed=3, running_per_run=(1, 3))]
    types = [orjson.loads(v).get("eventType") for v in values]
    assert {"START", "RUNNING", "COMPLETE"} <= set(types)
    assert [_may_start_or_end(v) for v in values] == [t in WANTED for t in types]


@pytest.mark.parametrize("event_type", ["START", "RUNNING", "COMPLETE", "FAIL", "ABORT", "OTHER"])
@pytest.mark.parametrize("dump", [orjson.dumps, json.dumps, lambda d: json.dumps(d, indent=2)],
                         ids=["compact", "spaced", "indented"])
def test_the_filter_reads_the_event_type_however_the_json_is_spaced(event_type, dump):
    doc = {"job": {"facets": {"x": {"note": "START FAIL"}}}, "eventType": event_type}
    raw = dump(doc)
    assert _may_start_or_end(raw if isinstance(raw, bytes) else raw.encode()) is (event_type in WANTED)


@pytest.mark.parametrize("event_type", ["START", "RUNNING", "COMPLETE", "FAIL", "ABORT", "OTHER", None, "start"])
def test_the_filter_reads_an_avro_records_event_type(event_type):
    """Avro writes eventType as an enum index, not text: every Avro START and terminal was
    skipped, so a run begun before the look-back on an Avro topic was never found."""
    from producer.codec import avro

    doc = {"eventTime": "2024-01-01T00:00:00Z", "producer": "https://p", "schemaURL": "https://s",
           "run": {"runId": "3f5e83fa-3480-44ff-99c5-ff943904e5e8", "facets": {"f": {"eventType": "START"}}},
           "job": {"namespace": "n", "name": "j"}}
    if event_type is not None:
        doc["eventType"] = event_type
    data = avro.encode(doc)
    assert _may_start_or_end(data) is (event_type in WANTED)
    assert _may_start_or_end(memoryview(data)) is (event_type in WANTED)
    # Another writer schema's record, or a corrupt one: decode judges it.
    assert _may_start_or_end(data[:2] + bytes(8) + data[10:])
    assert _may_start_or_end(data[:11])


def test_a_search_finds_the_runs_of_avro_records(monkeypatch):
    from producer.codec import avro, encode_json

    run = "3f5e83fa-3480-44ff-99c5-ff943904e5e8"

    def ev(event_type: str, run_id: str = run) -> dict:
        return {"eventType": event_type, "eventTime": "2024-01-01T00:00:00Z", "producer": "https://p",
                "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
                "run": {"runId": run_id}, "job": {"namespace": "n", "name": "j"}}

    class Msg:
        def __init__(self, value: bytes) -> None:
            self._value = value

        def value(self) -> bytes:
            return self._value

        def topic(self) -> str:
            return "openlineage"

        def partition(self) -> int:
            return 0

    other = "0b5e83fa-3480-44ff-99c5-ff943904e5e9"
    for encode in (avro.encode, encode_json):
        msgs = [Msg(encode(e)) for e in (ev("START"), ev("RUNNING"), ev("COMPLETE"), ev("START", other))]
        monkeypatch.setattr(run_search, "read_topics", lambda *a, msgs=msgs, **k: (m for m in msgs))
        reader = run_search._Reader(None, {("openlineage", 0): (0, 10)}, 100, 1 << 20, deadline=1e18,
                                    live=lambda p, f: True, routes=[lambda e: True])
        reader._read(None, {})
        assert reader.found == {("openlineage", 0): {run: 3, other: 1}}, encode


def test_a_nested_event_type_key_does_not_hide_the_event_s_own():
    assert _may_start_or_end(b'{"run": {"facets": {"f": {"eventType": "x"}}}, "eventType": "START"}')
    assert not _may_start_or_end(b'{"eventType": null, "note": "START"}')
    assert not _may_start_or_end(b'{"note": "COMPLETE"}')
    assert not _may_start_or_end(b'{"eventType"')


@pytest.mark.kafka
def test_a_search_finds_which_runs_began_and_ended_and_stops_once_its_partitions_are_revoked(kafka):
    from relay.config import KafkaConfig
    from relay.source.run_search import _Reader
    from tests.support.kafka import produce

    topic = kafka.new_topic("ol")
    stream = sample_stream(40, seed=4, running_per_run=(1, 2))
    docs = [orjson.loads(v) for _, v in stream]
    produce(kafka.bootstrap_servers, topic, stream)
    config = KafkaConfig(bootstrap_servers=kafka.bootstrap_servers, topics=[topic], group_id=kafka.new_group())
    floor = (0, len(stream))  # the look-back began at the end: search everything below it

    # Two collectors: the first takes everything; the second only the jobs of one name.
    job = docs[0]["job"]["name"]
    routes = [lambda event: True, lambda event: event.job_name == job]

    def search(records: int, live) -> _Reader:  # noqa: ANN001
        reader = _Reader(config, {(topic, 0): floor}, records, 1 << 25, deadline=time.monotonic() + 60, live=live,
                         routes=routes)
        reader.run()
        return reader

    reader = search(len(stream), lambda part, f: f is floor)
    runs = reader.found[(topic, 0)]
    assert reader.records == len(stream) and not reader.unfinished

    def expected(lane: int, types: set[str]) -> set[str]:
        return {d["run"]["runId"] for d in docs
                if d.get("eventType") in types and (lane == 0 or d["job"]["name"] == job)}

    for lane in (0, 1):
        began = {r for r, bits in runs.items() if bits >> 2 * lane & run_search._BEGAN}
        ended = {r for r, bits in runs.items() if bits >> 2 * lane & run_search._ENDED}
        assert began == expected(lane, {"START"}) and ended == expected(lane, {"COMPLETE", "FAIL", "ABORT"})
        assert ended
    assert expected(1, WANTED) < expected(0, WANTED)  # the second collector's route took fewer
    # search_records bounds it: only the last 10 records below the floor.
    assert search(10, lambda part, f: True).records == 10
    # Revoked before it began (the floor is no longer this assignment's): it stops before
    # its first fetch, records or not; revoked after its first record: it stops at the next.
    revoked = search(len(stream), lambda part, f: False)
    assert revoked.records == 0 and revoked.found == {} and revoked.unfinished == {(topic, 0)}
    answers = iter([True, True])
    revoked = search(len(stream), lambda part, f: next(answers, False))
    assert revoked.records == 2


# -- what the search tells the lanes ------------------------------------------------------
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
PART = ("ol", 0)


def event(run_id: str, event_type: str, offset: int, second: int = 0) -> LineageEvent:
    return LineageEvent("run", None, b"{}", f"{run_id}/{event_type}/{offset}".encode(),
                        T0 + dt.timedelta(seconds=second), run_id, event_type, source=SourceRef("ol", 0, offset))


class Lane:
    """A collector lane's sequencer, as the search sees it (CollectorLane's methods)."""

    def __init__(self, name: str = "c", takes=lambda event: True) -> None:  # noqa: ANN001
        self.name = name
        self.takes = takes
        self.sequencer = RunSequencer(hold_timeout_s=600, on_hold_timeout="dead_letter", max_held_events=1000,
                                      max_tracked_runs=1000, finished_ttl_s=10)
        self.decisions: list = []

    def held_runs(self):  # noqa: ANN201
        return self.sequencer.held_since()

    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> None:
        self.decisions += self.sequencer.learn_earlier(run_id, finished=finished, now=now)

    def routes(self, event: LineageEvent) -> bool:
        return self.takes(event)

    def hold(self, *events: LineageEvent, now: float = 0) -> None:
        for e in events:
            assert self.sequencer.offer(e, now) == []  # held: no START seen


def released(lane: Lane) -> list[tuple[str, str, str]]:
    return [(type(d).__name__, d.event.run_id, d.event.event_type) for d in lane.decisions]


class FakeReader:
    """Stands in for the broker read: what the search "finds" below the floor."""

    instances: list[FakeReader] = []
    script: dict = {}

    def __init__(self, kafka, parts, search_records, max_bytes, *, deadline, live, routes) -> None:  # noqa: ANN001
        self.parts, self.routes = parts, routes
        self.found: dict = {}
        self.unfinished: set = set()
        self.records = 0
        FakeReader.instances.append(self)

    def run(self) -> dict:
        for part, events in FakeReader.script.get("events", {}).items():
            runs = self.found.setdefault(part, {})
            for e in events:
                bit = run_search._BEGAN if e.event_type == "START" else run_search._ENDED
                for i, route in enumerate(self.routes):
                    if route(e):
                        runs[e.run_id] = runs.get(e.run_id, 0) | bit << 2 * i
                self.records += 1
        self.unfinished |= FakeReader.script.get("unfinished", set())
        if FakeReader.script.get("raise"):
            raise RuntimeError("broker gone")
        return self.found


@pytest.fixture
def fake_reader(monkeypatch):
    FakeReader.instances, FakeReader.script = [], {}
    monkeypatch.setattr(run_search, "_Reader", FakeReader)
    return FakeReader


async def search_once(search: run_search.RunSearch, now: float) -> None:
    """One tick that starts a search, the search to its end, and the tick that uses it."""
    search.tick(now)
    assert search._task is not None, "a search was started"
    await asyncio.wait_for(search._task, 10)
    search.tick(now)


def new_search(floors: dict, *lanes: Lane, found: list | None = None) -> run_search.RunSearch:
    return run_search.RunSearch(KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["ol"], group_id="g"),
                                LookbackConfig(), search_after_s=5, max_bytes=1 << 20, floors=floors, lanes=lanes,
                                on_found=lambda name, finished: found is not None and found.append((name, finished)))


async def test_runs_found_are_released_in_order_or_dropped_when_they_had_ended(fake_reader):
    lane, found = Lane(), []
    lane.hold(event("open", "RUNNING", 100, 2), event("open", "COMPLETE", 101, 3), event("ended", "RUNNING", 102, 1))
    lane.hold(event("unknown", "COMPLETE", 103))
    fake_reader.script = {"events": {PART: [event("open", "START", 5), event("ended", "START", 6),
                                            event("ended", "COMPLETE", 7)]}}
    search = new_search({PART: (0, 50)}, lane, found=found)
    search.tick(1)  # held for less than search_after_s: no search yet
    assert search._task is None
    await search_once(search, 6)
    assert released(lane) == [("Forward", "open", "RUNNING"), ("Forward", "open", "COMPLETE"),
                              ("Drop", "ended", "RUNNING")]
    assert [run for run, _since, _e in lane.held_runs()] == ["unknown"]
    assert sorted(found) == [("c", False), ("c", True)]
    search.close()


async def test_an_incomplete_search_uses_only_the_runs_it_saw_end(fake_reader):
    """A START read before the search ran out of time: the run's terminal may lie in what
    was not read, so releasing its held events could send them after that terminal."""
    lane = Lane()
    lane.hold(event("began", "COMPLETE", 100), event("ended", "RUNNING", 101))
    fake_reader.script = {"events": {PART: [event("began", "START", 5), event("ended", "COMPLETE", 6)]},
                          "unfinished": {PART}}
    search = new_search({PART: (0, 50)}, lane)
    await search_once(search, 6)
    assert released(lane) == [("Drop", "ended", "RUNNING")]
    assert [run for run, _since, _e in lane.held_runs()] == ["began"]


async def test_a_failed_search_uses_only_the_runs_it_saw_end(fake_reader):
    lane = Lane()
    lane.hold(event("began", "COMPLETE", 100), event("ended", "RUNNING", 101))
    fake_reader.script = {"events": {PART: [event("began", "START", 5), event("ended", "COMPLETE", 6)]},
                          "raise": True}
    search = new_search({PART: (0, 50)}, lane)
    await search_once(search, 6)
    assert released(lane) == [("Drop", "ended", "RUNNING")]
    search.tick(7)
    assert search._task is None  # not searched again in this assignment


async def test_what_was_found_is_forgotten_when_the_partition_is_revoked(fake_reader):
    """Even when nothing stays assigned: a later assignment of the partition searches
    afresh, from its own look-back's floor."""
    lane = Lane()
    floors = {PART: (0, 50)}
    fake_reader.script = {"events": {PART: [event("old", "START", 5)]}}
    lane.hold(event("old", "RUNNING", 100))
    search = new_search(floors, lane)
    await search_once(search, 6)
    assert released(lane) == [("Forward", "old", "RUNNING")]
    del floors[PART]  # all partitions revoked (or lost)
    search.tick(7)
    assert search._found == {}
    floors[PART] = (0, 80)  # assigned again: a new look-back, a new floor
    lane.hold(event("new", "RUNNING", 200), now=10)
    fake_reader.script = {"events": {PART: [event("new", "START", 60)]}}
    await search_once(search, 16)
    assert [r.parts for r in fake_reader.instances] == [{PART: (0, 50)}, {PART: (0, 80)}]
    assert released(lane)[-1] == ("Forward", "new", "RUNNING")


async def test_a_lane_is_told_about_a_run_once_then_its_own_state_decides(fake_reader):
    """Once the sequencer has forgotten a run it finished (finished_ttl_s), a late event
    of it is held as for any run it never saw begin, not released again by the search."""
    lane = Lane()
    lane.hold(event("r", "RUNNING", 100, 1))
    fake_reader.script = {"events": {PART: [event("r", "START", 5)]}}
    search = new_search({PART: (0, 50)}, lane)
    await search_once(search, 6)
    assert released(lane) == [("Forward", "r", "RUNNING")]
    assert isinstance(lane.sequencer.offer(event("r", "COMPLETE", 101, 2), 7)[0], Forward)
    lane.sequencer.expire(30)  # finished_ttl_s passed: the run is forgotten
    lane.decisions.clear()
    lane.hold(event("r", "RUNNING", 102, 3), now=30)
    search.tick(40)
    assert released(lane) == [] and [run for run, _s, _e in lane.held_runs()] == ["r"]


async def test_a_start_counts_only_for_the_collectors_whose_route_takes_it(fake_reader):
    """As the look-back's: a collector whose route never took the START never had it."""
    everything = Lane("all")
    picky = Lane("picky", takes=lambda e: e.event_type != "START")
    for lane in (everything, picky):
        lane.hold(event("r", "COMPLETE", 100))
    fake_reader.script = {"events": {PART: [event("r", "START", 5)]}}
    search = new_search({PART: (0, 50)}, everything, picky)
    await search_once(search, 6)
    assert released(everything) == [("Forward", "r", "COMPLETE")]
    assert released(picky) == [] and [run for run, _s, _e in picky.held_runs()] == ["r"]
    assert not any(isinstance(d, Drop) for d in everything.decisions)
