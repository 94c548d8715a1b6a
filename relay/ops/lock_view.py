"""The state of a redrive lock (:mod:`relay.ops.redrive_lock`) read from its log: pure.

Records are applied in log order. A *claim* counts when nothing came between the log end
its writer saw (``after``) and the claim itself, and the view read the log from at or
before ``after + 1`` (else it cannot tell, and the claim is ignored); a counting claim
makes its writer the holder, whatever came before. The holder's *release* frees the lease;
records of anyone else (a holder taken over, a claim that did not count) change nothing
but the log end, except heartbeats: one written while no one holds the lease (a redrive
whose claim the log no longer shows: the topic was deleted or replaced under it) makes
the lease not free until its writer releases or a claim counts, and a second one of the
same redrive while another holds it makes the lease *contested* (two redrives each
believe they hold it: the holder gives it up). A view that did not start at the log's
first offset and saw no counting claim is *unknown*: it cannot tell a free lease from a
held one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import orjson


@dataclass(frozen=True)
class LockRecord:
    #: claim, heartbeat, release (unknown: a record this version cannot read).
    op: str
    holder: str
    host: str = "?"
    pid: int = 0
    #: When the holder claimed the lease (UTC, for people: the lease runs on no wall clock).
    since: str = "?"
    #: The log end - 1 its writer saw (claims).
    after: int | None = None
    #: When the record was written (UTC, for people).
    at: str | None = None
    seq: int = 0
    offset: int = -1

    def dumps(self) -> bytes:
        return orjson.dumps({k: v for k, v in asdict(self).items() if k != "offset" and v is not None})

    @classmethod
    def parse(cls, offset: int, value: bytes | None) -> LockRecord:
        try:
            doc = orjson.loads(value or b"")
            return cls(op=str(doc["op"]), holder=str(doc["holder"]), host=str(doc.get("host", "?")),
                       pid=int(doc.get("pid", 0)), since=str(doc.get("since", "?")),
                       after=doc.get("after") if isinstance(doc.get("after"), int) else None,
                       at=doc.get("at"), seq=int(doc.get("seq", 0)), offset=offset)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return cls(op="unknown", holder="", offset=offset)


@dataclass
class LockView:
    #: The first offset this view read from.
    start: int
    #: Whether the state is known (read from the log start, or a counting claim seen).
    known: bool
    holder: LockRecord | None = None
    #: The holder's last heartbeat (or its claim).
    holder_last: LockRecord | None = None
    #: The last heartbeat of anyone (names a holder when the state is unknown).
    last_beat: LockRecord | None = None
    #: A heartbeat written while no one held the lease: its writer may believe it does.
    stray_beat: LockRecord | None = None
    #: Heartbeats of other redrives since the holder's claim, per redrive.
    rival_beats: dict[str, int] = field(default_factory=dict)
    #: A redrive that wrote a second heartbeat while another held the lease.
    contested: LockRecord | None = None
    #: The offset of the last record applied (start - 1: none yet).
    last: int = -1

    @classmethod
    def starting_at(cls, start: int, *, from_log_start: bool) -> LockView:
        return cls(start=start, known=from_log_start, last=start - 1)

    @classmethod
    def unknown(cls) -> LockView:
        return cls(start=0, known=False)

    @property
    def free(self) -> bool:
        return self.known and self.holder is None and self.stray_beat is None

    @property
    def end(self) -> int:
        """Where to read on from."""
        return self.last + 1

    def apply(self, r: LockRecord) -> None:
        if r.op == "claim":
            if r.after is not None and r.after + 1 >= self.start and self.last <= r.after:
                self.holder = self.holder_last = r
                self.known = True
                self.stray_beat = self.contested = None
                self.rival_beats = {}
        elif r.op == "heartbeat":
            self.last_beat = r
            if self.holder is None:
                self.stray_beat = r
            elif r.holder == self.holder.holder:
                self.holder_last = r
            else:  # a holder taken over writes one at most, while it reads the claim that took it
                seen = self.rival_beats[r.holder] = self.rival_beats.get(r.holder, 0) + 1
                if seen > 1:
                    self.contested = r
        elif r.op == "release":
            if self.holder is not None and r.holder == self.holder.holder:
                self.holder = self.holder_last = None
            elif self.holder is None and self.stray_beat is not None and r.holder == self.stray_beat.holder:
                self.stray_beat = None
        self.last = max(self.last, r.offset)

    def apply_all(self, records: list[LockRecord]) -> None:
        for r in records:
            self.apply(r)

    def describe_holder(self) -> str:
        if self.holder is not None:
            last = self.holder_last.at if self.holder_last is not None else None
            return (f"held by host {self.holder.host}, pid {self.holder.pid}, since {self.holder.since} "
                    f"(its last record was written at {last or '?'})")
        beat = self.last_beat
        named = f"; its last heartbeat is from host {beat.host}, pid {beat.pid} at {beat.at}" if beat else ""
        if self.known:  # a heartbeat with no claim before it
            return f"held by a redrive whose claim is not in its log (deleted or replaced?){named}"
        return f"in a state its log no longer shows (the last holder's claim is not in the records read){named}"
