"""Whether the Kafka cluster has answered the relay yet.

An unreachable ``kafka.bootstrap_servers`` (a wrong host or port, a broker that is down, a
network policy) looks, from each client, like a request that times out: the dead-letter
topic "not created", every subscribed topic unknown. :class:`BrokerContact` tells that
apart, so that the relay says what to fix: the broker did not answer (logged
``broker_unreachable``, /readyz's ``reason``), not that a topic is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from confluent_kafka import KafkaError

from relay.logs import log_event

log = logging.getLogger("relay.source")

#: How long the relay waits for the cluster's first answer before it says the broker does
#: not answer (librdkafka retries a refused connection within ~1 s; a name that does not
#: resolve or a dropped packet takes longer to fail, and a broker answers in milliseconds).
SILENT_AFTER_S = 5.0
#: The warning is repeated while the broker stays silent, at doubling intervals up to this.
REPEAT_MAX_S = 300.0


def from_broker(err: KafkaError) -> bool:
    """Whether ``err`` is the broker's answer (a refusal: no such topic, not authorised),
    not librdkafka's own (a time-out, a connection that failed: its codes are negative)."""
    return err.code() > 0


class BrokerContact:
    """Whether any request of the relay to the cluster was answered.

    Any client the relay runs calls :meth:`mark_answered` (from any thread) when the cluster
    answered it: metadata, a group assignment, a topic created or refused. From
    :meth:`start`, ``broker_unreachable`` is logged (WARNING, naming the bootstrap servers)
    once :data:`SILENT_AFTER_S` passed without an answer, then again at doubling
    intervals, and :attr:`unreachable` is True, until the first answer (logged
    ``broker_answered`` when it was reported unreachable). It says nothing of a cluster
    lost after it answered once: librdkafka's own log lines (event ``librdkafka``) do.
    """

    def __init__(self, bootstrap_servers: str, silent_after_s: float | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._silent_after_s = SILENT_AFTER_S if silent_after_s is None else silent_after_s
        self._answered = False
        self._since: float | None = None
        self._warned = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def answered(self) -> bool:
        return self._answered

    @property
    def unreachable(self) -> bool:
        """No answer yet, :data:`SILENT_AFTER_S` after :meth:`start`."""
        return (not self._answered and self._since is not None
                and time.monotonic() - self._since >= self._silent_after_s)

    def start(self) -> None:
        """Start waiting for the first answer (on the event loop)."""
        if self._since is None:
            self._since = time.monotonic()
            self._schedule(self._silent_after_s)

    def mark_answered(self) -> None:
        """The cluster answered a request. Any thread."""
        if self._answered:
            return
        self._answered = True
        if self._warned:
            log_event(log, logging.INFO, "broker_answered", bootstrap_servers=self.bootstrap_servers,
                      waited_s=round(time.monotonic() - (self._since or 0.0), 1))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._check, delay_s)

    def _check(self, delay_s: float) -> None:
        self._timer = None
        if self._answered:
            return
        self._warned = True
        log_event(log, logging.WARNING, "broker_unreachable", bootstrap_servers=self.bootstrap_servers,
                  waited_s=round(time.monotonic() - (self._since or 0.0), 1),
                  hint="no broker of kafka.bootstrap_servers has answered yet: check the host names and ports, "
                       "that the broker runs and that this host can reach it (firewall, network policy, "
                       "security.protocol); nothing is consumed meanwhile and /readyz answers 503")
        self._schedule(min(2 * delay_s, REPEAT_MAX_S))
