"""Whether a collector's batches go to its batch endpoint or its events go alone: pure, no
I/O, no clock (times are the caller's ``now``, in seconds).

A batch answered 404, 405 or 501 (``unsupported``, :mod:`relay.sinks.batch_reply`) may
mean there is no batch endpoint, or only that a proxy, a load balancer or an old instance
answered during a collector's rolling deploy. So :class:`BatchFallback`:

* gives batching up only after ``give_up_after`` batches *in a row*, in the order they were
  sent, were answered ``unsupported``: an accepted batch (a 2xx, or a reply listing failed
  events: results ``ok``, ``partial``, ``unattributed``) sent after them clears them. Other
  answers (``retry``: 408, 429, 5xx, no answer; ``refused``: another 4xx) say nothing
  about the endpoint and neither count nor clear.
* once given up, lets one batch (the probe) go to the batch endpoint ``reprobe_after_s``
  after that; every other event goes alone meanwhile. The probe accepted, batching resumes;
  answered ``unsupported``, the next probe goes ``reprobe_after_s`` after that answer;
  answered anything else, the next batch probes again. ``reprobe_after_s`` None: never.
* counts only answers to batches sent since the last switch (give-up or resume): a 404 to a
  batch sent before a probe succeeded, or a 2xx to one sent before batching was given up,
  is old news and changes nothing (its events are still settled as it says).

What it does not do: decide what becomes of a batch's events (the caller sends the events
of an ``unsupported`` batch alone, whatever the state).
"""

from __future__ import annotations

from typing import Literal

#: Batch reply results (:class:`relay.sinks.batch_reply.BatchReading`) that show a batch
#: endpoint read the batch.
ACCEPTED = frozenset({"ok", "partial", "unattributed"})

#: What an answer changed: batching given up, a probe answered unsupported, batching resumed.
Change = Literal["gave_up", "still_unsupported", "resumed"]


class BatchFallback:
    def __init__(self, give_up_after: int, reprobe_after_s: float | None) -> None:
        assert give_up_after >= 1
        self._give_up_after = give_up_after
        self._reprobe_after_s = reprobe_after_s
        #: True while events go alone (batching given up), probes aside.
        self.single = False
        #: How many times batching was given up (the first is an error, later ones are not news).
        self.gave_up = 0
        self._next = 1
        #: Answers to batches numbered below this were sent before the last switch.
        self._floor = 1
        #: The highest-numbered batch accepted since the last switch.
        self._accepted = 0
        #: Batches answered unsupported, numbered above ``_accepted``: the ones in a row.
        self._misses: list[int] = []
        #: The probe in flight, if any; when the next one may go (None: never).
        self._probe: int | None = None
        self._probe_at: float | None = None

    def sends_alone(self, now: float) -> bool:
        """Whether an event arriving at ``now`` goes alone rather than into a batch: batching
        was given up and no probe is due (or one is in flight)."""
        return self.single and (self._probe is not None or self._probe_at is None or now < self._probe_at)

    def ticket(self, now: float) -> int | None:
        """The number of a batch about to be sent, to hand back to :meth:`answered`; None when
        it is not to be sent (batching given up, no probe due): its events go alone."""
        if self.single and not (self._probe is None and self._probe_at is not None and now >= self._probe_at):
            return None
        number = self._next
        self._next += 1
        if self.single:
            self._probe = number
        return number

    def answered(self, ticket: int, result: str, now: float) -> Change | None:
        """Batch ``ticket`` was answered ``result`` (a BatchReading result) at ``now``; what
        that changed, if anything."""
        if ticket < self._floor:
            return None  # sent before the last switch
        unsupported, accepted = result == "unsupported", result in ACCEPTED
        if ticket == self._probe:
            self._probe = None
            if unsupported:
                self._probe_at = self._later(now)
                return "still_unsupported"
            if accepted:
                self._switch(single=False)
                return "resumed"
            return None  # said nothing of the endpoint: the next batch probes again
        if self.single:
            return None
        if accepted:
            self._accepted = max(self._accepted, ticket)
            self._misses = [t for t in self._misses if t > self._accepted]
        elif unsupported and ticket > self._accepted:
            self._misses.append(ticket)
            if len(self._misses) >= self._give_up_after:
                self._switch(single=True)
                self._probe_at = self._later(now)
                self.gave_up += 1
                return "gave_up"
        return None

    def _later(self, now: float) -> float | None:
        return None if self._reprobe_after_s is None else now + self._reprobe_after_s

    def _switch(self, single: bool) -> None:
        self.single = single
        self._floor = self._next
        self._accepted = 0
        self._misses = []
        self._probe = None
