"""RunStateChangelog against a real broker: closing it while writes are still being flushed."""

from __future__ import annotations

import threading
import time

import pytest

from relay.state.changelog import OK, RunStateChangelog

pytestmark = pytest.mark.kafka


async def test_close_while_flushing_leaves_the_poll_thread_to_end_cleanly(kafka, monkeypatch):
    topic = kafka.new_topic("changelog-in", partitions=2)
    changelog = RunStateChangelog(bootstrap_servers=kafka.bootstrap_servers, topic=topic + ".state",
                                  input_topic=topic, create=True, producer_properties={}, consumer_properties={})
    await changelog.start()
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))

    class SlowFlush:
        """The real producer, whose last flush takes a while (a slow broker): the poll
        thread goes round several times meanwhile."""

        def __init__(self, producer) -> None:  # noqa: ANN001
            self._producer = producer

        def flush(self, timeout_s: float) -> int:
            time.sleep(0.35)  # ok: the slow flush this test is about, not a wait for a condition
            return self._producer.flush(timeout_s)

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self._producer, name)

    changelog._host.producer = SlowFlush(changelog._host.producer)
    answers: list[str] = []
    for i in range(20):
        changelog.write(i % 2, f"run-{i}".encode(), b"{}", answers.append)
    thread = changelog._host._thread
    await changelog.close()
    assert thread is not None and not thread.is_alive()
    assert failures == []
    assert await changelog.wait_acked(5) and answers == [OK] * 20
