"""One ``dlq redrive`` at a time per dead-letter topic: a lease in ``<dlq_topic>.redrive-lock``.

The lock topic has one partition, kept for ever (``retention.ms``/``retention.bytes`` -1,
``cleanup.policy=delete``: created so when missing, an existing one with another partition
count, policy or retention refused, :mod:`relay.ops.lock_topic`; the lock's clients never
create it); its log orders every record. A redrive *claims* the lease with a record
naming the log end it saw (``after``); the claim counts only when no record came between
that end and the claim (a compare-and-set on the log, checked by reading back: no state
before ``after`` is needed, so a log cut by retention cannot make a claim count; a claim
that counted too late is released at once). The holder then writes a *heartbeat* every
``heartbeat_s`` and reads it back; only one read back as the last record extends the
lease. The lease is lost when the read finds a counting claim of another redrive (taken
over), when the heartbeat lands before the log end the holder knew (the topic was deleted
or replaced: another redrive may have claimed the new log unseen), or when another redrive
wrote two heartbeats meanwhile (both believe they hold it). It ends with a *release*.

A redrive that finds the lease held (or cannot tell: the claim of the last holder is no
longer in the log, or a heartbeat has no claim before it, as in a log deleted under its
holder) watches the log: a heartbeat means the holder lives, and the redrive exits 2 naming
it (host, pid, since when); ``takeover_s`` of silence (no record at all) and it claims,
after the end it watched, so that any heartbeat written meanwhile makes its claim not
count. A released lease is claimed at once.

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
those after the lease passed: the HTTP requests in flight (up to ``concurrency`` per
collector; a batch counts as one, with all its events), or for ``--to-topic`` at most
:data:`relay.ops.redrive_targets.TOPIC_FLUSH_EVERY` records handed to the producer;
delivery stays at least once, a collector or the input topic may see such a record twice.
A lock topic deleted under a holder, re-created and claimed before the holder's next
heartbeat lands in it, lets both send until the holder's next heartbeat or two. A crash
without release leaves the lease to expire: the next redrive waits ``takeover_s``. ``dlq
list`` and ``--dry-run`` do not take the lease.
"""

from __future__ import annotations

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
from relay.ops.lock_topic import ensure_lock_topic
from relay.ops.lock_view import LockRecord, LockView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTiming:
    #: How often the holder writes a heartbeat.
    heartbeat_s: float = 2.0
    #: How long the holder keeps sending after the send of its last record found in place.
    holder_s: float = 10.0
    #: How long a silent lease is watched before it is taken over (> holder_s: the margin).
    takeover_s: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.holder_s < self.takeover_s:
            raise ValueError(f"lease times must keep 0 < heartbeat_s < holder_s < takeover_s, got {self}")


#: The production timing; tests put smaller values here.
TIMING = LeaseTiming()
#: Records read back from the end of the lock log before the state is called unknown.
MAX_REPLAY = 1 << 16
_REQUEST_S = 15.0
_RELEASE_S = 2.0
_NO_AUTO_CREATE = {"allow.auto.create.topics": False}


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
        if not self._stop.is_set():  # released meanwhile: the redrive is over, nothing to tell
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
                if self._clock() >= sent_at + self.timing.holder_s:
                    self._write_release()  # the claim counts: else the next redrive waits it out
                    raise OpsError(f"claiming the redrive lock {self.topic} took over {self.timing.holder_s:g}s "
                                   f"(slow broker?); run again")
                with self._state:
                    self._valid_until = sent_at + self.timing.holder_s
                self._view = view
                self._thread = threading.Thread(target=self._renew, name="redrive-lease", daemon=True)
                self._thread.start()
                return
        raise LockHeld(f"the redrive lock {self.topic} keeps changing hands; run again later")

    def _open(self) -> None:
        ensure_lock_topic(self.kafka, self.topic)
        # Neither client creates the topic: one deleted under its holder must fail the
        # heartbeats (the lease then runs out), not come back empty for another claim.
        self._consumer = open_consumer(self.kafka, f"{self.kafka.group_id}.dlq-redrive",
                                       client_id="lineage-relay-ops-lock", overrides=_NO_AUTO_CREATE)
        conf: dict[str, Any] = {**self.kafka.producer_properties, "bootstrap.servers": self.kafka.bootstrap_servers,
                                "enable.idempotence": True, "acks": "all", "linger.ms": 0, **_NO_AUTO_CREATE}
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
        end = self._view.end
        while not self._stop.wait(self.timing.heartbeat_s):
            try:
                end = self._beat(end)
            except OpsError as err:  # not renewed this time; the lease runs out if it lasts
                if isinstance(err, LeaseLost):
                    self._lose(err)
                    return
                log_event(log, logging.WARNING, "redrive_lease_not_renewed", topic=self.topic,
                          detail=str(err)[:300])
            except Exception as err:  # noqa: BLE001 - whatever it is, the lease cannot be vouched for
                self._lose(LeaseLost(f"renewing the redrive lock {self.topic} failed: {type(err).__name__}: {err}"))
                return

    def _beat(self, end: int) -> int:
        """Write a heartbeat and read the log back from ``end`` to it: the lease is extended
        when the last record read is this heartbeat and no other redrive holds the lease.
        Returns where to read on from; raises :class:`LeaseLost`, or :class:`OpsError`
        when the broker did not answer (not renewed)."""
        with self._state:
            self._expire_locked()
            if self._lost is not None:
                raise self._lost
            left = (self._valid_until or 0.0) - self._clock()
        self._seq += 1
        beat = replace(self.me, op="heartbeat", seq=self._seq, at=_now_iso())
        sent_at = self._clock()
        offset = self._produce(beat, timeout_s=max(0.1, left))
        if offset < end:
            raise LeaseLost(f"the log of the redrive lock {self.topic} went back (a heartbeat landed at offset "
                            f"{offset}, before {end}): the topic was deleted or replaced, so another redrive may "
                            f"have claimed the lock without this one seeing it; {self._keep_the_topic}")
        records = self._read(end, offset + 1, deadline=time.monotonic() + max(0.1, left))
        view = self._view
        view.apply_all(records)
        holder = view.holder
        if holder is None or holder.holder != self.me.holder:
            raise LeaseLost(f"the redrive lock {self.topic} was taken over by {_who(holder)}", taken_by=holder)
        if view.contested:
            raise LeaseLost(f"another redrive writes heartbeats to the redrive lock {self.topic} as if it held it "
                            f"({_who(view.contested)}): the lock's log was deleted or altered; both stop; "
                            f"{self._keep_the_topic}")
        last = records[-1] if records else None
        if last is None or last.offset != offset or last.holder != self.me.holder or last.seq != self._seq:
            log_event(log, logging.WARNING, "redrive_lease_not_renewed", topic=self.topic,
                      detail=f"the record read back at offset {offset} is not this heartbeat")
            return max(end, view.end)
        self._extend(sent_at)
        return offset + 1

    @property
    def _keep_the_topic(self) -> str:
        """The fix, with the advice to run again that ``dlq redrive`` adds (relay.ops.redrive)."""
        return f"do not delete or alter {self.topic} while a redrive runs"

    def release(self) -> None:
        """Stop renewing and, if still held, write a release (a few seconds at most: a
        release not written lets the lease expire). A renewal still busy after that is left
        to end on its own, with the clients it uses."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_RELEASE_S)
        done = self._thread is None or not self._thread.is_alive()
        try:
            if self._thread is not None:
                with self._state:
                    self._expire_locked()
                    held = self._lost is None
                if held:
                    self._write_release()
        finally:
            if done and self._producer is not None:
                self._producer.purge()
                self._producer = None
            if done and self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def _write_release(self) -> None:
        """Write a release, waiting :data:`_RELEASE_S` at most; one not written is logged
        (the lease then expires)."""
        try:
            self._produce(replace(self.me, op="release", at=_now_iso()), timeout_s=_RELEASE_S)
        except OpsError as err:
            log_event(log, logging.WARNING, "redrive_lock_not_released", topic=self.topic, detail=str(err)[:300])


def _who(r: LockRecord | None) -> str:
    return "another redrive" if r is None else f"the redrive of host {r.host}, pid {r.pid} (holding it since {r.since})"


def _held_message(topic: str, holder: LockRecord, beat: LockRecord, timing: LeaseTiming) -> str:
    return (f"another redrive of this dead-letter topic is running: host {holder.host}, pid {holder.pid}, "
            f"holding the redrive lock {topic} since {holder.since} (its last record there was written at "
            f"{beat.at or '?'}); run one redrive at a time: wait for it to end. If that process is gone, "
            f"run again: its lock is taken over after {timing.takeover_s:g}s without a heartbeat")
