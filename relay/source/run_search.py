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
``eventType`` (read from the bytes) is START or a terminal type are decoded, and what is
kept is which runs began there and which of them ended (a run id and a flag each, so at
most ``search_records`` of them). Each collector's held runs found there are then
released (:meth:`relay.lane.CollectorLane.learn_earlier`): their held events follow in
order, or are dropped as ``after_terminal`` when the run had ended; a run held later in
that partition is looked up in what was found. A run not found is held as before.
Found runs are counted in
``lineage_relay_lookback_runs_found_total{collector,result}`` (``open``, ``finished``).

Everything below the committed offset was delivered, dead-lettered or deliberately not
forwarded (held events keep their offsets uncommitted), so a START found there is one
the collector had, as the look-back assumes. A search that fails or runs out of time is
logged (``run_search_failed``, ``run_search_incomplete``); what it found is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from relay.config import KafkaConfig, LookbackConfig
from relay.events import LineageEvent
from relay.logs import log_event
from relay.ops.kafka_range import PartitionRange, open_consumer, read_topics
from relay.source.offsets import Partition, format_partitions
from relay.stages.decode import decode_record

log = logging.getLogger("relay.run_search")

#: What librdkafka fetches ahead for the search (its default is 64 MB a partition).
_QUEUED_KBYTES = "16384"
#: Held runs looked up and not found, remembered so as not to look them up every tick.
_MISSES_KEPT = 100_000
_EVENT_TYPE = b'"eventType"'
_START_OR_END = (b'START"', b'COMPLETE"', b'FAIL"', b'ABORT"')


def _may_start_or_end(value: bytes) -> bool:
    """Whether a record may be a START or a terminal event: worth decoding. Looks at the
    value of each ``"eventType"`` key in the bytes: 1.3 us per 3.5 KB record on a slow
    machine, against 4.9 for finding the four words anywhere (half the records of a
    Spark-like stream name one somewhere, and would then have been parsed too), 13 for a
    regular expression and 17 for parsing alone."""
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


class HoldingLane(Protocol):
    name: str

    def held_runs(self) -> list[tuple[str, float, LineageEvent]]: ...

    def learn_earlier(self, run_id: str, *, finished: bool, now: float) -> None: ...


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
        #: Per partition searched: run id -> whether the run had ended there.
        self._found: dict[Partition, dict[str, bool]] = {}
        self._misses: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task | None = None
        self._closed = False

    def tick(self, now: float) -> None:
        """Release the held runs found so far; start a search for the partitions whose
        runs have been held ``search_after_s`` (one search at a time)."""
        floors = self._floors
        if not floors:
            return
        for p in [p for p in self._found if p not in floors]:
            del self._found[p]  # revoked: a later assignment reads it back afresh
        wanted: dict[Partition, tuple[int, int]] = {}
        after_s = self._search_after_s
        misses = self._misses
        for lane in self._lanes:
            for run_id, since, event in lane.held_runs():
                src = event.source
                if src is None or run_id in misses:
                    continue
                part = (src.topic, src.partition)
                floor = floors.get(part)
                if floor is None:
                    continue
                runs = self._found.get(part)
                if runs is None:
                    if now - since >= after_s:
                        wanted[part] = floor
                    continue
                finished = runs.get(run_id)
                if finished is None:
                    misses[run_id] = None
                    if len(misses) > _MISSES_KEPT:
                        misses.popitem(last=False)
                    continue
                lane.learn_earlier(run_id, finished=finished, now=now)
                self._on_found(lane.name, finished)
        if wanted and self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._search(wanted))

    async def _search(self, parts: dict[Partition, tuple[int, int]]) -> None:
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        reader = _Reader(self._kafka, parts, self._config.search_records, self._max_bytes,
                         deadline=began + self._config.search_timeout_s, live=self._live)
        try:
            found = await loop.run_in_executor(self._executor, reader.run)
        except Exception as err:  # noqa: BLE001 - a background search must not stop the relay
            # (KafkaException, OpsError, or a bug): what it found is used, and the partitions
            # are not searched again in this assignment.
            found = reader.found
            log_event(log, logging.WARNING, "run_search_failed", partitions=format_partitions(sorted(parts)),
                      error=str(err)[:300], hint="runs not found are held until hold_timeout_s")
        finally:
            self._task = None
        if reader.unfinished:
            log_event(log, logging.WARNING, "run_search_incomplete",
                      partitions=format_partitions(sorted(reader.unfinished)), timeout_s=self._config.search_timeout_s,
                      hint="raise pipeline.lookback.search_timeout_s, or lower search_records")
        for part, floor in parts.items():
            if self._floors.get(part) is floor:  # still the assignment it was searched for
                self._found[part] = found.get(part, {})
        self._misses.clear()  # what a search found may be what they missed
        log_event(log, logging.INFO, "run_search_read", partitions=format_partitions(sorted(parts)),
                  records=reader.records, runs=sum(len(r) for r in found.values()),
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
    """Runs on the search's thread only."""

    def __init__(self, kafka: KafkaConfig, parts: dict[Partition, tuple[int, int]], search_records: int,
                 max_bytes: int, *, deadline: float, live: Callable[[Partition, tuple[int, int]], bool]) -> None:
        self._kafka = kafka
        self._parts = parts
        self._search_records = search_records
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._live = live
        self.found: dict[Partition, dict[str, bool]] = {}
        self.unfinished: set[Partition] = set()
        self.records = 0

    def run(self) -> dict[Partition, dict[str, bool]]:
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

    def _read(self, consumer, ranges: dict[str, list[PartitionRange]]) -> None:  # noqa: ANN001
        found, parts = self.found, self._parts
        max_bytes = self._max_bytes
        reading = read_topics(consumer, ranges, self._deadline, self.unfinished)
        try:
            for msg in reading:
                self.records += 1
                part = (msg.topic(), msg.partition())
                if not self._live(part, parts[part]):
                    if not any(self._live(p, f) for p, f in parts.items()):
                        return  # revoked (or closing): nothing left worth reading
                    continue
                value = msg.value()
                if not value or not _may_start_or_end(value):
                    continue
                event = decode_record(value, max_bytes=max_bytes)
                if type(event) is not LineageEvent or event.run_id is None:
                    continue
                runs = found.setdefault(part, {})
                if event.event_type == "START":
                    runs.setdefault(event.run_id, False)
                elif event.is_terminal:
                    runs[event.run_id] = True
        finally:
            reading.close()  # it unassigns the consumer
