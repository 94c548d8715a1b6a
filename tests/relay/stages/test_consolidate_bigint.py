"""Consolidated and coalesce delivery, run state and the dedupe digest keep an integer
beyond 64 bits exactly (orjson reads one as the nearest float)."""

from __future__ import annotations

import orjson
import pytest

from relay.events import LineageEvent
from relay.stages.consolidate import Forward
from relay.stages.decode import decode_record
from relay.stages.json_bytes import loads
from tests.relay.stages.test_consolidate import FACET_URL, consolidator, spark

BIG = b"340282366920938463463374607431768211455"  # 2**128 - 1
NEG = b"-9223372036854775809"


def with_trace(event: LineageEvent, value: bytes = BIG, label: bytes | None = None) -> LineageEvent:
    """``event`` with a custom run facet holding ``value`` as a JSON number and as a string,
    parsed as the relay's lanes parse it (orjson: the number as the nearest float)."""
    doc = orjson.loads(event.body)
    doc["run"]["facets"]["trace"] = {"_producer": "https://example.com/p", "_schemaURL": FACET_URL,
                                     "id": "@id@", "label": (label or value).decode()}
    event = decode_record(orjson.dumps(doc).replace(b'"@id@"', value), max_bytes=1 << 22)
    assert isinstance(event, LineageEvent)
    event.doc = orjson.loads(event.body)
    return event


def trace_of(body: bytes) -> bytes:
    start = body.index(b'"trace":')
    return body[start:body.index(b"}", start) + 1]


def expected_trace(value: bytes) -> bytes:
    return (b'"trace":{"_producer":"https://example.com/p","_schemaURL":"' + FACET_URL.encode() +
            b'","id":' + value + b',"label":"' + value + b'"}')


def built(actions: list) -> list[LineageEvent]:
    return [a.event for a in actions if isinstance(a, Forward) and a.event.source is None]


@pytest.mark.parametrize("value", [BIG, NEG])
@pytest.mark.parametrize("restart", [False, True], ids=["in-memory", "saved-and-restored"])
def test_a_consolidated_terminal_keeps_an_integer_beyond_64_bits(value: bytes, restart: bool) -> None:
    c = consolidator("consolidated")
    start, running, complete = spark(1, running=1)
    actions = c.offer(start, 0.0) + c.offer(with_trace(running, value), 1.0)
    if restart:  # as the changelog table writes and reads its records
        state = loads(orjson.dumps({"state": c.to_state(running.run_id)}))["state"]
        c = consolidator("consolidated")
        c.restore(running.run_id, state, 1.0)
    actions += c.offer(complete, 2.0) + c.tick(10.0)
    terminal = built(actions)[-1]
    assert terminal.event_type == "COMPLETE"
    assert trace_of(terminal.body) == expected_trace(value)
    assert terminal.doc["run"]["facets"]["trace"]["id"] == int(value)


@pytest.mark.parametrize("restart", [False, True], ids=["in-memory", "saved-and-restored"])
def test_coalesced_runnings_and_held_events_keep_it(restart: bool) -> None:
    c = consolidator("coalesce")
    start, first, second, complete = spark(2, running=2)
    first = with_trace(first)
    actions = c.offer(first, 0.0)  # held: its run's START has not come
    if restart:
        state = loads(orjson.dumps({"state": c.to_state(first.run_id)}))["state"]
        c = consolidator("coalesce")
        c.restore(first.run_id, state, 0.0)
    actions += c.offer(start, 1.0) + c.offer(with_trace(second), 2.0) + c.tick(20.0)
    bodies = [e.body for e in built(actions) if e.event_type == "RUNNING"]
    assert bodies and all(trace_of(body) == expected_trace(BIG) for body in bodies)


def test_the_digest_tells_events_apart_that_differ_only_in_such_an_integer() -> None:
    _start, running, _complete = spark(3, running=1)
    one, other = with_trace(running, BIG), with_trace(running, BIG[:-1] + b"4", label=BIG)
    assert orjson.loads(one.body) == orjson.loads(other.body)  # alike to orjson: the same float
    assert one.digest != other.digest
    plain = decode_record(running.body, max_bytes=1 << 22)
    assert plain.digest == running.digest
    exact = decode_record(one.body, max_bytes=1 << 22)
    assert exact.doc["run"]["facets"]["trace"]["id"] == int(BIG)


@pytest.mark.parametrize("mode", ["consolidated", "coalesce"])
def test_only_an_event_decode_marked_is_read_again(mode: str, monkeypatch) -> None:
    # Reading every event again cost ~15% of offer; decode knows which hold such an integer.
    import relay.stages.consolidate as consolidate

    scanned: list[bytes] = []
    real = consolidate.exact

    def exact(body: bytes):
        scanned.append(body)
        return real(body)
    monkeypatch.setattr(consolidate, "exact", exact)
    c = consolidator(mode)
    start, running, complete = spark(4, running=1)
    marked = with_trace(running)
    plain = [start, complete]
    for event in plain:
        event.doc = orjson.loads(event.body)  # as the lanes parse it again
    actions = c.offer(start, 0.0) + c.offer(marked, 1.0) + c.offer(complete, 2.0) + c.tick(10.0)
    assert scanned == [marked.body]
    assert marked.big_int and not start.big_int and not complete.big_int
    assert any(trace_of(e.body) == expected_trace(BIG) for e in built(actions) if b'"trace"' in e.body)


def test_built_events_are_marked_as_decode_marks_them() -> None:
    c = consolidator("consolidated")
    start, running, complete = spark(5, running=1)
    actions = c.offer(start, 0.0) + c.offer(with_trace(running), 1.0) + c.offer(complete, 2.0) + c.tick(10.0)
    terminal = built(actions)[-1]
    assert terminal.event_type == "COMPLETE" and terminal.big_int  # a lane rewrites it from exact bytes
    plain = consolidator("consolidated")
    start, running, complete = spark(6, running=1)
    actions = plain.offer(start, 0.0) + plain.offer(running, 1.0) + plain.offer(complete, 2.0) + plain.tick(10.0)
    assert built(actions) and not any(e.big_int for e in built(actions))
