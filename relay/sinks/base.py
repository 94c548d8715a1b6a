"""The contract between the pipeline and a collector.

A collector takes one event's JSON body and either delivers it, possibly after retries,
or gives up with an :class:`Undeliverable` that names why (the pipeline dead-letters it).
It never drops an event silently and never raises anything else except cancellation.

A collector may also offer ``deliver_soon(body, done, token) -> Any``: the same delivery
without a coroutine per event. It queues ``body`` and later calls ``done(token, verdict)``
exactly once, on the event loop and never from inside ``deliver_soon`` itself, with what
``deliver`` would have returned; when the collector is closed first, it never calls it.
It may return a handle whose ``cancel()`` stops that delivery (no more retries, no
verdict): the pipeline stops deliveries of partitions that moved to another member.
The pipeline then uses it instead of ``deliver`` (see :class:`~relay.sinks.batch.BatchCollector`).

A collector that sends HTTP requests may offer ``check_before_requests(check)``, called
before ``start()``: ``check()`` then runs right before each request is written (each
attempt, each batch; once a connection is ready, so a wait for one counts before it). When
it raises :class:`DeliveryStopped` the request is not sent and the events it carried get no
verdict: ``deliver`` raises it, ``deliver_soon`` never calls ``done``. Nothing is logged as
an error. The running relay sets no check (a request then costs nothing more); ``dlq
redrive`` does, to stop once its lease is lost (:mod:`relay.ops.redrive_lock`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from relay.errors import RelayError


@dataclass(frozen=True, slots=True)
class Undeliverable:
    #: "collector_rejected" | "retries_exhausted" | "collector_failed_event" | "relay_error",
    #: or a kind's own (``connector_not_enabled``, ``collector_skipped``).
    reason: str
    detail: str
    status: int | None = None


class DeliveryStopped(RelayError):
    """Raised by the check of ``check_before_requests``: send nothing more. Not a failure of
    the event or of the collector: the caller that set the check knows why (``__cause__``)."""


def relay_error(err: Exception) -> Undeliverable:
    """What an exception raised while delivering an event makes of it (a bug in the relay
    or in a plugged-in collector kind, which broke the contract above): a dead letter that
    says so."""
    return Undeliverable("relay_error", f"the relay failed while delivering it: {type(err).__name__}: {err}"[:1000])


class Collector(Protocol):
    name: str

    async def start(self) -> None: ...

    async def deliver(self, body: bytes) -> Undeliverable | None:
        """None when the collector acknowledged the event."""

    async def close(self) -> None: ...
