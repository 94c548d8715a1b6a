"""What the relay does as it starts, besides starting its parts: the steps that wait for the
broker, made to give way to a stop, and what the ``relay_started`` log line reports.

A stop (SIGTERM) may come while the broker does not answer: creating the dead-letter topic
waits up to :data:`DLQ_CREATE_TIMEOUT_S`, and checking the run-state topic waits for as long
as the broker does not answer (:meth:`relay.state.changelog.RunStateChangelog.start`).
:func:`until_stopped` ends such a step at once when the stop comes; its blocking broker call
runs on a daemon thread of its own, which is left behind and does not hold up the exit (as a
thread of an executor would: ``asyncio.run()`` and the interpreter join those). The other
steps do not wait for the broker (librdkafka connects on its own threads): making the
dead-letter producer and the consumer, subscribing, starting the decode processes and the
collectors' HTTP sessions; the relay checks for a stop before the consumer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from relay.config import KafkaConfig
from relay.logs import log_event
from relay.loop_threads import call_on_daemon_thread
from relay.source.admin import connection_properties, create_topic
from relay.source.broker_contact import BrokerContact, from_broker

# The relay loop's logger: ``dlq_topic_not_created`` has always been logged there.
log = logging.getLogger("relay.app")

T = TypeVar("T")

#: How long creating the dead-letter topic waits for the broker's answer.
DLQ_CREATE_TIMEOUT_S = 15.0


class StartInterrupted(Exception):
    """A stop was asked for during the start-up step ``step``."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


async def until_stopped(stop: asyncio.Event, step: str, work: Awaitable[T]) -> T:
    """``await work``, unless ``stop`` is set before it is done: then ``work`` is cancelled
    and :class:`StartInterrupted` raised (at once when ``stop`` is already set)."""
    task = asyncio.ensure_future(work)
    if not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled itself: so is the work
            task.cancel()
            raise
        finally:
            stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise StartInterrupted(step)


async def create_dead_letter_topic(kafka: KafkaConfig, broker: BrokerContact, *, max_message_bytes: str) -> None:
    """Create ``kafka.dlq_topic`` when missing, waiting up to :data:`DLQ_CREATE_TIMEOUT_S`;
    a failure is logged ``dlq_topic_not_created`` (it may exist, and the relay may lack the
    rights to create it) and the relay goes on. The broker's answer, a refusal too, is told
    to ``broker``; when no broker ever answered, the log line says so and names
    ``kafka.bootstrap_servers`` (librdkafka's own error then only says "Timed out")."""
    timeout_s = DLQ_CREATE_TIMEOUT_S
    # Only connection settings are relevant to the admin client: take them from the
    # producer properties (the dead-letter producer needs the same ones).
    conn = connection_properties(kafka.producer_properties)
    try:
        await call_on_daemon_thread(
            lambda: create_topic(kafka.bootstrap_servers, kafka.dlq_topic, 1, client_properties=conn,
                                 config={"max.message.bytes": max_message_bytes}, timeout_s=timeout_s,
                                 replication_factor=kafka.topic_replication_factor),
            "dlq-topic")
    except TimeoutError:  # its text is empty
        error = f"TimeoutError: no answer from the broker within {timeout_s:g}s"
    except KafkaException as err:
        if err.args and isinstance(err.args[0], KafkaError) and from_broker(err.args[0]):
            broker.mark_answered()  # a refusal: the rights to create it, a policy
        error = f"{type(err).__name__}: {err}"
    except Exception as err:  # noqa: BLE001 - it may exist and we may lack rights to create it
        error = f"{type(err).__name__}: {err}"
    else:
        broker.mark_answered()
        return
    if broker.answered:
        log_event(log, logging.WARNING, "dlq_topic_not_created", topic=kafka.dlq_topic, error=error)
    else:
        log_event(log, logging.WARNING, "dlq_topic_not_created", topic=kafka.dlq_topic, error=error,
                  bootstrap_servers=kafka.bootstrap_servers,
                  hint="no broker answered: check kafka.bootstrap_servers (host names and ports), that the broker "
                       "runs and that this host can reach it; the relay goes on, and consumes once the broker "
                       "answers")


def component_versions() -> dict[str, str]:
    """The relay's version and those of what a bug report needs: logged in ``relay_started``,
    printed by ``lineage-relay --version``."""
    import platform

    import aiohttp
    import confluent_kafka

    from relay import __version__

    return {"version": __version__, "librdkafka": confluent_kafka.libversion()[0],
            "confluent_kafka": confluent_kafka.__version__, "aiohttp": aiohttp.__version__,
            "python": platform.python_version()}
