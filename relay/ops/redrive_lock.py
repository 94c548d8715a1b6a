"""One ``dlq redrive`` at a time per dead-letter topic: a lease in ``<dlq_topic>.redrive-lock``.

The lock topic has one partition, kept for ever (``retention.ms``/``retention.bytes`` -1,
``cleanup.policy=delete``); its log orders every record. A redrive *claims* the lease with a
record naming the log end it saw (``after``); the claim counts only when no record came
between that end and the claim (a compare-and-set on the log, checked by reading back: no
state before ``after`` is needed, so a log cut by retention cannot make a claim count). The
holder then writes a *heartbeat* every ``heartbeat_s`` and reads it back; one that finds a
counting claim of another redrive before it means the lease was taken over. It ends with a
*release*. A redrive that finds the lease held (or cannot tell: the claim of the last holder
is no longer in the log) watches the log: a heartbeat means the holder lives, and the
redrive exits 2 naming it (host, pid, since when); ``takeover_s`` of silence (no record at
all) and it claims, after the end it watched, so that any heartbeat written meanwhile makes
its claim not count. A released lease is claimed at once.

Lease times are read on ``CLOCK_BOOTTIME``, which counts suspend. The holder's lease runs
until ``holder_s`` after the *send* of its last record found in place (claim or heartbeat;
reading it back counts against it); once past, it is lost for good, whatever the cause: no
renewal, the process stopped (SIGSTOP) or the machine suspended. ``check()`` raises
:class:`LeaseLost` then, and the redrive calls it right before each record it sends and
before it commits.

Guaranteed, while each redrive's clock runs at the rate of real time and the broker keeps
its log: two redrives never both send (the waiting one claims ``takeover_s`` after the end
it saw, the holder stops ``holder_s`` after sending a record before that end; ``holder_s`` <
``takeover_s``), and the second one to claim refuses. Not guaranteed: a holder paused
between its last check and a send (or with records already handed to Kafka) may still send
those after the lease passed: the HTTP request in flight per collector worker, or for
``--to-topic`` at most :data:`relay.ops.redrive_targets.TOPIC_FLUSH_EVERY` records handed
to the producer; delivery stays at least once, a collector or the input topic may see such a
record twice. A crash without release leaves the lease to expire: the next redrive waits
``takeover_s``. ``dlq list`` and ``--dry-run`` do not take the lease.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from relay.config import KafkaConfig
from relay.kafka_log import with_log
from relay.logs import log_event
from relay.ops import OpsError, kafka_error_text
from relay.ops.kafka_range import UNREACHABLE_HINT, PartitionRange, open_consumer, read, watermarks
from relay.ops.lock_view import LockRecord, LockView
from relay.source.admin import connection_properties, create_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTiming:
    #: How often the holder writes a heartbeat.
    heartbeat_s: float = 2.0
    #: How long the holder keeps sending after the send of its last record found in place.
    holder_s: float = 10.0
    #: How long a silent lease is watched before it is taken over (> holder_s: the margin).
    takeover_s: float = 20.0


#: The production timing; tests put smaller values here.
TIMING = LeaseTiming()
#: Records read back from the end of the lock log before the state is called unknown.
MAX_REPLAY = 1 << 16
_REQUEST_S = 15.0
_RELEASE_S = 2.0


def boot_clock() -> float:
    """Seconds on a clock that counts suspend (Linux), else the monotonic clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def lock_topic(kafka: KafkaConfig) -> str:
    return f"{kafka.dlq_topic}.redrive-lock"


class LeaseLost(OpsError):
    """The lease passed or was taken over: send nothing more, commit nothing."""

    def __init__(self, message: str, taken_by: LockRecord | None = None) -> None:
        super().__init__(message)
        self.taken_by = taken_by


class LockHeld(OpsError):
    """Another redrive holds the lease."""


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RedriveLock:
    """The lease of one dead-letter topic: :meth:`acquire`, :meth:`check` before each send,
    :meth:`release`. ``say`` prints progress for the operator (waiting, taking over)."""

    def __init__(self, kafka: KafkaConfig, *, say: Callable[[str], None] = lambda _: None,
                 timing: LeaseTiming | None = None, clock: Callable[[], float] | None = None) -> None:
        self.kafka = kafka
        self.topic = lock_topic(kafka)
        self.timing = timing or TIMING
        self._clock = clock or boot_clock
        self._say = say
        self.me = LockRecord(op="claim", holder=uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid(),
                             since=_now_iso())
        self._seq = 0
        self._state = threading.Lock()
        self._valid_until: float | None = None
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._view = LockView.unknown()

    # -- the holder's side ------------------------------------------------------------
    @property
    def lost(self) -> LeaseLost | None:
        return self._lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is held now."""
        with self._state:
            self._expire_locked()
            if self._lost is not None:
                raise self._lost

    def _expire_locked(self) -> None:
        if self._lost is None and (self._valid_until is None or self._clock() >= self._valid_until):
            self._lost = LeaseLost(f"the lease on the redrive lock {self.topic} ran out: no heartbeat of this "
                                   f"redrive was confirmed within {self.timing.holder_s:g}s of the last one (the "
                                   f"broker did not answer in time, or this process was stopped or suspended)")

    def _lose(self, err: LeaseLost) -> None:
        with self._state:
            if self._lost is None:
                self._lost = err
        log_event(log, logging.WARNING, "redrive_lease_lost", topic=self.topic, detail=str(err)[:300])

    def _extend(self, sent_at: float) -> None:
        with self._state:
            self._expire_locked()
            if self._lost is None:
                self._valid_until = max(self._valid_until or 0.0, sent_at + self.timing.holder_s)

    # -- acquiring --------------------------------------------------------------------
    def acquire(self) -> None:
        """Claim the lease, waiting out a silent one; :class:`LockHeld` when another
        redrive holds it."""
        self._open()
        view, end = self._replay()
        for _attempt in range(8):
            if not view.free:
                view, end = self._watch(view, end)
            sent_at, view, end = self._claim(view, end)
            if view.holder is not None and view.holder.holder == self.me.holder:
                with self._state:
                    self._valid_until = sent_at + self.timing.holder_s
                self.check()  # reading it back may already have taken the lease's time
                self._view = view
                self._thread = threading.Thread(target=self._renew, name="redrive-lease", daemon=True)
                self._thread.start()
                return
        raise LockHeld(f"the redrive lock {self.topic} keeps changing hands; run again later")

    def _open(self) -> None:
        conn = connection_properties(self.kafka.producer_properties)
        try:
            create_topic(self.kafka.bootstrap_servers, self.topic, 1,
                         {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"},
                         client_properties=conn, replication_factor=self.kafka.topic_replication_factor)
        except KafkaException as err:
            raise OpsError(f"cannot create the redrive lock topic {self.topic}: {kafka_error_text(err)}; create it "
                           f"(1 partition, retention.ms=-1, retention.bytes=-1) or grant the right to") from err
        except concurrent.futures.TimeoutError as err:
            raise OpsError(f"the broker did not answer the creation of {self.topic} within "
                           f"{_REQUEST_S:g}s; {UNREACHABLE_HINT}") from err
        self._consumer = open_consumer(self.kafka, f"{self.kafka.group_id}.dlq-redrive",
                                       client_id="lineage-relay-ops-lock")
        conf: dict[str, Any] = {**self.kafka.producer_properties, "bootstrap.servers": self.kafka.bootstrap_servers,
                                "enable.idempotence": True, "acks": "all", "linger.ms": 0}
        self._producer = Producer(with_log(conf))

    def _end(self) -> tuple[int, int]:
        assert self._consumer is not None
        return watermarks(self._consumer, self.topic, [0])[0]

    def _read(self, start: int, end: int, deadline: float | None = None) -> list[LockRecord]:
        """The records in ``[start, end)``; ``deadline``: on ``time.monotonic()``."""
        assert self._consumer is not None
        return [LockRecord.parse(m.offset(), m.value())
                for m in read(self._consumer, self.topic, [PartitionRange(0, start, end)], deadline=deadline)]

    def _replay(self) -> tuple[LockView, int]:
        """The state at the log end, read from the end back (doubling) until it is known."""
        low, end = self._end()
        window = 256
        while True:
            start = max(low, end - window)
            view = LockView.starting_at(start, from_log_start=start == 0)
            view.apply_all(self._read(start, end))
            if view.known or start == low or window >= MAX_REPLAY:
                return view, end
            window *= 4

    def _watch(self, view: LockView, end: int) -> tuple[LockView, int]:
        """Wait for ``takeover_s`` with no record written, or a released lease; raise
        :class:`LockHeld` on a heartbeat."""
        timing = self.timing
        who = view.describe_holder()
        self._say(f"dlq: the redrive lock {self.topic} is {who}: waiting {timing.takeover_s:g}s for a "
                  f"heartbeat before taking it over")
        silent_since = self._clock()
        changes = 0
        while True:
            if self._clock() - silent_since >= timing.takeover_s:
                self._say(f"dlq: no record in {self.topic} for {timing.takeover_s:g}s: taking the lock over")
                return view, end
            self._stop.wait(min(timing.heartbeat_s / 2, 1.0))
            _low, new_end = self._end()
            if new_end == end:
                continue
            records = self._read(end, new_end)
            end = new_end
            silent_since = self._clock()  # observed after the records it read: they end here
            beat = next((r for r in records if r.op == "heartbeat"), None)
            view.apply_all(records)
            if beat is not None:
                holder = view.holder if view.holder is not None and view.holder.holder == beat.holder else beat
                raise LockHeld(_held_message(self.topic, holder, beat, timing))
            if view.free:
                return view, end
            changes += 1
            if changes > 20:
                raise LockHeld(f"the redrive lock {self.topic} keeps changing; run again later")

    def _claim(self, view: LockView, end: int) -> tuple[float, LockView, int]:
        """Write a claim after ``end`` and read the log back to it: the view then."""
        record = replace(self.me, after=end - 1, at=_now_iso())
        sent_at = self._clock()
        offset = self._produce(record)
        records = self._read(end, offset + 1)
        view.apply_all(records)
        if view.holder is None or view.holder.holder != self.me.holder:
            holder = view.holder
            if holder is not None:
                beat = next((r for r in reversed(records) if r.holder == holder.holder), holder)
                raise LockHeld(_held_message(self.topic, holder, beat, self.timing))
        return sent_at, view, offset + 1

    def _produce(self, record: LockRecord, timeout_s: float = _REQUEST_S) -> int:
        """Write ``record``; its offset once acknowledged."""
        assert self._producer is not None
        got: list[Any] = []
        try:
            self._producer.produce(self.topic, key=self.kafka.dlq_topic.encode(), value=record.dumps(), partition=0,
                                   on_delivery=lambda err, msg: got.append(err if err is not None else msg))
            deadline = time.monotonic() + timeout_s
            while not got and time.monotonic() < deadline:
                self._producer.poll(0.05)
        except KafkaException as err:  # e.g. a producer made fatal by the broker's answer
            raise OpsError(f"writing to {self.topic} failed: {kafka_error_text(err)}") from err
        if not got:
            raise OpsError(f"the broker did not acknowledge a record of {self.topic} within {timeout_s:g}s; "
                           f"{UNREACHABLE_HINT}")
        if isinstance(got[0], KafkaError):
            raise OpsError(f"writing to {self.topic} failed: {got[0].str()}")
        return got[0].offset()

    # -- renewing ---------------------------------------------------------------------
    def _renew(self) -> None:
        """Heartbeats until released or lost; any exception loses the lease."""
        timing = self.timing
        end = self._view.end
        while not self._stop.wait(timing.heartbeat_s):
            try:
                with self._state:
                    self._expire_locked()
                    lost = self._lost
                    left = (self._valid_until or 0.0) - self._clock()
                if lost is not None:
                    self._lose(lost)
                    return
                self._seq += 1
                beat = replace(self.me, op="heartbeat", seq=self._seq, at=_now_iso())
                sent_at = self._clock()
                try:
                    offset = self._produce(beat, timeout_s=max(0.1, left))
                    records = self._read(end, offset + 1, deadline=time.monotonic() + max(0.1, left))
                except OpsError as err:  # not renewed this time; the lease runs out if it lasts
                    log_event(log, logging.WARNING, "redrive_lease_not_renewed", topic=self.topic,
                              detail=str(err)[:300])
                    continue
                self._view.apply_all(records)
                end = offset + 1
                holder = self._view.holder
                if holder is None or holder.holder != self.me.holder:
                    self._lose(LeaseLost(f"the redrive lock {self.topic} was taken over by "
                                         f"{_who(holder)}", taken_by=holder))
                    return
                self._extend(sent_at)
            except Exception as err:  # noqa: BLE001 - whatever it is, the lease cannot be vouched for
                self._lose(LeaseLost(f"renewing the redrive lock {self.topic} failed: {type(err).__name__}: {err}"))
                return

    def release(self) -> None:
        """Stop renewing and, if still held, write a release (a few seconds at most: a
        release not written lets the lease expire)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_RELEASE_S)
        try:
            if self._thread is not None and not self._thread.is_alive() and self._lost is None:
                with self._state:
                    self._expire_locked()
                    held = self._lost is None
                if held:
                    self._produce(replace(self.me, op="release", at=_now_iso()), timeout_s=_RELEASE_S)
        except OpsError as err:
            log_event(log, logging.WARNING, "redrive_lock_not_released", topic=self.topic, detail=str(err)[:300])
        finally:
            if self._producer is not None:
                self._producer.purge()
                self._producer = None
            if self._consumer is not None and (self._thread is None or not self._thread.is_alive()):
                self._consumer.close()
                self._consumer = None


def _who(r: LockRecord | None) -> str:
    return "another redrive" if r is None else f"the redrive of host {r.host}, pid {r.pid} (holding it since {r.since})"


def _held_message(topic: str, holder: LockRecord, beat: LockRecord, timing: LeaseTiming) -> str:
    return (f"another redrive of this dead-letter topic is running: host {holder.host}, pid {holder.pid}, "
            f"holding the redrive lock {topic} since {holder.since} (its last record there was written at "
            f"{beat.at or '?'}); run one redrive at a time: wait for it to end. If that process is gone, "
            f"run again: its lock is taken over after {timing.takeover_s:g}s without a heartbeat")
