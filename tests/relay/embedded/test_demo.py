"""``lineage-relay demo`` (run in-process, ``--no-spark``): it says the relay worked only
when the collector received what was sent; a broken run ends with what is missing and 1."""

from __future__ import annotations

import logging
import signal
import time

import pytest

import relay.embedded.demo as demo
from relay.embedded.broker import EmbeddedBroker
from relay.embedded.collector import RecordingCollector


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield tmp_path
    root.handlers[:], root.level = handlers, level


def test_a_healthy_demo_checks_every_sent_event_arrived(in_tmp, capsys):
    assert demo.run_demo(runs=12, spark=False) == 0
    out = capsys.readouterr().out
    assert "check: every one of the" in out and "unique events sent reached the collector" in out
    assert "every run's START came first and exactly one terminal event" in out


def test_a_demo_whose_broker_dies_with_deliveries_queued_fails_and_names_what_is_missing(in_tmp, monkeypatch,
                                                                                           capsys):
    brokers: list[EmbeddedBroker] = []

    class Broker(EmbeddedBroker):
        def start(self, *args, **kwargs):
            brokers.append(self)
            return super().start(*args, **kwargs)

    class SlowCollector(RecordingCollector):
        """Slow enough that most deliveries are still queued when the broker dies, and failing
        from then on: what the relay held is never delivered (else a relay that had consumed
        everything could deliver it all during its drain, and nothing would be missing)."""

        def __init__(self, **kwargs):
            super().__init__(latency_s=0.3, **kwargs)

        async def _handle_one(self, request):
            answer = await super()._handle_one(request)
            if self.count == 10 and brokers[0].running:
                brokers[0]._proc.send_signal(signal.SIGKILL)
                self.set_outage(503)
            return answer

    monkeypatch.setattr(demo, "EmbeddedBroker", Broker)
    monkeypatch.setattr(demo, "RecordingCollector", SlowCollector)
    started = time.monotonic()
    assert demo.run_demo(runs=40, spark=False) == 1
    assert time.monotonic() - started < 60
    captured = capsys.readouterr()
    assert "lineage-relay demo: FAILED" in captured.err
    assert "the embedded broker stopped during the demo" in captured.err
    assert "unique events sent never reached the collector" in captured.err
    assert "run …" in captured.err  # a few of the runs named
    assert "check: every one of the" not in captured.out


def test_relay_warnings_print_with_their_fields(in_tmp, monkeypatch, capsys):
    def warn_and_send(*args):
        logging.getLogger("relay.app").warning("partitions_lost", extra={"fields": {"partitions": ["openlineage[0]"],
                                                                                     "events": 3}})
        return 0

    monkeypatch.setattr(demo, "_synthetic", warn_and_send)
    demo.run_demo(runs=1, spark=False)
    err = capsys.readouterr().err
    assert 'warning partitions_lost partitions=["openlineage[0]"] events=3' in err


def test_a_failed_demo_leaves_no_page_or_events_file_of_an_earlier_run(in_tmp, monkeypatch):
    out = in_tmp / "demo-output"
    out.mkdir()
    for name in ("lineage.html", "received.jsonl"):
        (out / name).write_text("from an earlier demo")

    def fail(*args):
        raise RuntimeError("the sample stream could not be sent")

    monkeypatch.setattr(demo, "_synthetic", fail)
    with pytest.raises(RuntimeError):
        demo.run_demo(runs=1, spark=False)
    assert not (out / "lineage.html").exists() and not (out / "received.jsonl").exists()
