"""``BatchDelivery(before_post=...)``: the check ``dlq redrive`` makes of its lease runs
right before each HTTP request, retries included; what it raises ends the delivery before
the request goes out (real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from relay.events import SourceRef
from relay.ops.delivery import BatchDelivery
from relay.stages.decode import decode_record
from tests.support.relay import relay_config


class Stop(Exception):
    pass


def events(n: int):
    stream = sample_stream(3, seed=5)[:n]
    return [decode_record(v, max_bytes=1 << 20, source=SourceRef("t", 0, i)) for i, (_, v) in enumerate(stream)]


@pytest.mark.parametrize("batch", [None, {"max_events": 2}], ids=["single", "batch"])
def test_a_check_that_raises_stops_the_next_request_and_its_retries(batch, caplog):
    """The first event is answered 503, then delivered on its retry (a request too); the
    check then raises: the next event is not sent, ``run`` raises what the check raised,
    and the stop is no failure: no event failed, no ERROR line (batch collectors included)."""
    caplog.set_level(logging.INFO)
    with RecordingCollector() as a:
        a.fail_next(1, 503)
        extra = {"concurrency": 1, "retry": {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}}
        if batch is not None:
            extra["batch"] = batch
        config = relay_config("127.0.0.1:9", "t", {"a": a.url}, group="g", dlq="d", collector=extra).collectors[0]

        def before_post() -> None:
            if len(a.attempts) >= 2:
                raise Stop("lease lost")

        delivered, failed = [], []
        chains = [[e] for e in events(4)]
        with pytest.raises(Stop, match="lease lost"):
            asyncio.run(BatchDelivery(config, before_post=before_post).run(
                chains, on_delivered=delivered.append, on_failed=failed.append))
        assert len(a.attempts) == 2 and a.count == 1, "two requests went out, the third was stopped"
        assert [e.source.offset for e in delivered] == [0] and failed == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
