"""Search further back than the look-back for the runs held after an assignment.

The look-back (:mod:`relay.source.lookback`) reads ``max_records`` records before each
newly assigned partition's committed offset. A run begun before those (a long Spark job
on a busy topic) stays unknown: its later events are held for a START the relay will not
see again, for ``hold_timeout_s`` (then forwarded, or dead-lettered with
``on_hold_timeout: dead_letter``), and keep their offsets uncommitted meanwhile.

So when a run has been held ``search_after_s`` (5 s, or half of ``hold_timeout_s`` when
that is shorter) in a partition whose look-back began above the partition's start, that
partition's next ``search_records`` records below the look-back are read, once per
assignment, in the background (an assign-only consumer on a thread of its own;
consumption goes on), within ``search_timeout_s``. Only records whose
``eventType`` (read from the bytes) is START or a terminal type are decoded (every Avro
record is: its ``eventType`` is not text in the bytes), and what is
kept is which runs began there and which of them ended, per collector: a START or a
terminal counts for a collector only if its route takes it, as the look-back's do (a run
id and a few bits each, so at most ``search_records`` of them). Each collector's held runs
found there are then released (:meth:`relay.lane.CollectorLane.learn_earlier`): their
held events follow in order, or are dropped as ``after_terminal`` when the run had ended;
a run held later in that partition is looked up in what was found. A run not found is
held as before. A collector is told about a run once: from then on its own state
decides, as for any run it saw begin. Found runs are counted in
``lineage_relay_lookback_runs_found_total{collector,result}`` (``open``, ``finished``).

Everything below the committed offset was delivered, dead-lettered or deliberately not
forwarded (held events keep their offsets uncommitted), so a START found there is one
the collector had, as the look-back assumes. A search that fails or runs out of time is
logged (``run_search_failed``, ``run_search_incomplete``); of what it found, only the runs
seen to end are used (one seen to begin may have ended in what was not read). What was
found for a partition is forgotten when it is revoked; a search stops once none of its
partitions is still assigned as it was, or the relay closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from relay.config import KafkaConfig, LookbackConfig
from relay.events import LineageEvent
from relay.logs import log_event
from relay.ops.kafka_range import PartitionRange, open_consumer, read_topics
from relay.source.offsets import Partition, format_partitions
from relay.stages.decode import AVRO_MARKER, decode_record

log = logging.getLogger("relay.run_search")

#: What librdkafka fetches ahead for the search (its default is 64 MB a partition).
_QUEUED_KBYTES = "16384"
_EVENT_TYPE = b'"eventType"'
_START_OR_END = (b'START"', b'COMPLETE"', b'FAIL"', b'ABORT"')


def _may_start_or_end(value: bytes) -> bool:
    """Whether a record may be a START or a terminal event: worth decoding. Looks at the
    value of each ``"eventType"`` key in the bytes: 1.3 us per 3.5 KB record on a slow
    machine, against 4.9 for finding the four words anywhere (half the records of a
    Spark-like stream name one somewhere, and would then have been parsed too), 13 for a
    regular expression and 17 for parsing alone. An Avro record (marker ``C3 01``) has no
    such text (its ``eventType`` is an enum index): its type is read from the bytes of its
    first fields (:func:`producer.codec.avro.peek_event_type`), and one that cannot be
    (another writer schema, a corrupt record) may be either."""
    if value[:2] == AVRO_MARKER:
        return _avro_may_start_or_end(value)
    at = value.find(_EVENT_TYPE)
    while at >= 0:
        colon = value.find(b":", at + len(_EVENT_TYPE))
        quote = value.find(b'"', colon + 1) if colon >= 0 else -1
        if quote < 0:
            return False
        if value.startswith(_START_OR_END, quote + 1):
            return True
        at = value.find(_EVENT_TYPE, quote)
    return False


def _avro_may_start_or_end(value: bytes) -> bool:
    from producer.codec import avro  # imported lazily, as decode does: JSON topics never load fastavro

    try:
        return avro.peek_event_type(value) in _START_OR_END_TYPES
    except avro.AvroDecodeError:
        return True  # for decode to judge


_START_OR_END_TYPES = frozenset({"START", "COMPLETE", "FAIL", "ABORT"})


class HoldingLane(Protocol):
    name: str

    def held_runs(self) -> list[tuple[str, float, LineageEvent]]: ...

    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> None: ...

    def routes(self, event: LineageEvent) -> bool: ...


#: Per run found and per lane (two bits each, lane ``i`` at ``2 * i``): the lane takes the
#: START found (its route accepts it, or leaves it out by its type alone: see
#: CollectorLane.routes), the lane takes a terminal found.
_BEGAN, _ENDED = 1, 2


class _Found:
    """What one search found in one partition, for one assignment of it (``floor``)."""

    __slots__ = ("floor", "runs")

    def __init__(self, floor: tuple[int, int], runs: dict[str, int]) -> None:
        self.floor = floor
        #: Run id -> the lanes' bits (see _BEGAN); a lane's bits are cleared once it was told.
        self.runs = runs


class RunSearch:
    """See the module docstring. ``floors`` is the look-back's (shared, kept up to date by
    it); :meth:`tick` runs on the event loop, the reads on a thread of their own."""

    def __init__(self, kafka: KafkaConfig, config: LookbackConfig, *, search_after_s: float, max_bytes: int,
                 floors: dict[Partition, tuple[int, int]], lanes: Sequence[HoldingLane],
                 on_found: Callable[[str, bool], None]) -> None:
        self._kafka = kafka
        self._config = config
        self._search_after_s = search_after_s
        self._max_bytes = max_bytes
        self._floors = floors
        self._lanes = lanes
        self._on_found = on_found
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-search")
        self._found: dict[Partition, _Found] = {}
        self._task: asyncio.Task | None = None
        self._closed = False

    def tick(self, now: float) -> None:
        """Release the held runs found so far; start a search for the partitions whose
        runs have been held ``search_after_s`` (one search at a time)."""
        floors, found = self._floors, self._found
        for p in [p for p, f in found.items() if floors.get(p) is not f.floor]:
            del found[p]  # revoked (and maybe assigned again): a later search reads it afresh
        if not floors:
            return
        wanted: dict[Partition, tuple[int, int]] = {}
        due: list[tuple[int, str, int, _Found]] = []
        after_s = self._search_after_s
        for i, lane in enumerate(self._lanes):
            shift = 2 * i
            for run_id, since, event in lane.held_runs():
                src = event.source
                if src is None:
                    continue
                part = (src.topic, src.partition)
                floor = floors.get(part)
                if floor is None:
                    continue
                searched = found.get(part)
                if searched is None:
                    if now - since >= after_s:
                        wanted[part] = floor
                    continue
                bits = searched.runs.get(run_id, 0) >> shift & 3
                if bits:
                    due.append((i, run_id, bits, searched))
        # Told after the loops: learn_earlier changes what held_runs() lists.
        for i, run_id, bits, searched in due:
            lane = self._lanes[i]
            lane.learn_earlier(run_id, finished=bool(bits & _ENDED), now=now)
            self._on_found(lane.name, bool(bits & _ENDED))
            # This lane's own state takes over: were it to forget the run and hold it again,
            # it would be held as any run it never saw begin.
            rest = searched.runs.get(run_id, 0) & ~(3 << 2 * i)
            if rest:
                searched.runs[run_id] = rest
            else:
                searched.runs.pop(run_id, None)
        if wanted and self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._search(wanted))

    async def _search(self, parts: dict[Partition, tuple[int, int]]) -> None:
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        reader = _Reader(self._kafka, parts, self._config.search_records, self._max_bytes,
                         deadline=began + self._config.search_timeout_s, live=self._live,
                         routes=[lane.routes for lane in self._lanes])
        failed = False
        try:
            await loop.run_in_executor(self._executor, reader.run)
        except Exception as err:  # noqa: BLE001 - a background search must not stop the relay
            # (KafkaException, OpsError, or a bug): the runs it saw end are used, and the
            # partitions are not searched again in this assignment.
            failed = True
            log_event(log, logging.WARNING, "run_search_failed", partitions=format_partitions(sorted(parts)),
                      error=str(err)[:300], hint="runs not found are held until hold_timeout_s")
        finally:
            self._task = None
        live = {part: floor for part, floor in parts.items() if self._floors.get(part) is floor}
        unfinished = set(parts) if failed else reader.unfinished & set(live)
        if unfinished and not failed:
            log_event(log, logging.WARNING, "run_search_incomplete",
                      partitions=format_partitions(sorted(unfinished)), timeout_s=self._config.search_timeout_s,
                      hint="raise pipeline.lookback.search_timeout_s, or lower search_records")
        ended_only = sum(_ENDED << 2 * i for i in range(len(self._lanes)))
        for part, floor in live.items():  # still the assignment it was searched for
            runs = reader.found.get(part, {})
            if part in unfinished:
                # Not read to the floor: a run seen to begin may have ended above what was
                # read. Only what was seen to end is certain.
                runs = {run_id: bits & ended_only for run_id, bits in runs.items() if bits & ended_only}
            self._found[part] = _Found(floor, runs)
        log_event(log, logging.INFO, "run_search_read", partitions=format_partitions(sorted(parts)),
                  records=reader.records, runs=sum(len(r) for r in reader.found.values()),
                  seconds=round(time.monotonic() - began, 3))

    def _live(self, part: Partition, floor: tuple[int, int]) -> bool:
        """Whether ``part`` is still assigned as it was (read from the search's thread)."""
        return not self._closed and self._floors.get(part) is floor

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False)


class _Reader:
    """Runs on the search's thread only. ``routes[i](event)``: whether lane ``i`` takes
    ``event`` (pure: its route's rules)."""

    def __init__(self, kafka: KafkaConfig, parts: dict[Partition, tuple[int, int]], search_records: int,
                 max_bytes: int, *, deadline: float, live: Callable[[Partition, tuple[int, int]], bool],
                 routes: Sequence[Callable[[LineageEvent], bool]]) -> None:
        self._kafka = kafka
        self._parts = parts
        self._search_records = search_records
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._live = live
        self._routes = routes
        #: Per partition: run id -> the lanes' bits (see _BEGAN).
        self.found: dict[Partition, dict[str, int]] = {}
        self.unfinished: set[Partition] = set()
        self.records = 0

    def run(self) -> dict[Partition, dict[str, int]]:
        ranges: dict[str, list[PartitionRange]] = {}
        for (topic, partition), (low, start) in self._parts.items():
            ranges.setdefault(topic, []).append(
                PartitionRange(partition, max(low, start - self._search_records), start))
        consumer = open_consumer(self._kafka, self._kafka.group_id, client_id="lineage-relay-run-search",
                                 overrides={"queued.max.messages.kbytes": _QUEUED_KBYTES})
        try:
            self._read(consumer, ranges)
        finally:
            consumer.close()
        return self.found

    def _any_live(self) -> bool:
        return any(self._live(p, f) for p, f in self._parts.items())

    def _read(self, consumer, ranges: dict[str, list[PartitionRange]]) -> None:  # noqa: ANN001
        found, parts = self.found, self._parts
        max_bytes, routes = self._max_bytes, self._routes
        # Stops when none of its partitions is assigned as it was any more (or the relay
        # closes), records or not.
        reading = read_topics(consumer, ranges, self._deadline, self.unfinished, stop=lambda: not self._any_live())
        try:
            for msg in reading:
                self.records += 1
                part = (msg.topic(), msg.partition())
                if not self._live(part, parts[part]):
                    if not self._any_live():
                        return  # revoked (or closing): nothing left worth reading
                    continue
                value = msg.value()
                if not value or not _may_start_or_end(value):
                    continue
                event = decode_record(value, max_bytes=max_bytes)
                if type(event) is not LineageEvent or event.run_id is None:
                    continue
                if event.event_type == "START":
                    bit = _BEGAN
                elif event.is_terminal:
                    bit = _ENDED
                else:
                    continue
                mask = 0
                for i, route in enumerate(routes):
                    if route(event):
                        mask |= bit << 2 * i
                if mask:
                    runs = found.setdefault(part, {})
                    runs[event.run_id] = runs.get(event.run_id, 0) | mask
        finally:
            reading.close()  # it unassigns the consumer
