"""Start-up against a broker that does not answer: a stop (SIGTERM) ends the start within
``drain_timeout_s`` + ``CLOSE_MARGIN_S``, exit 0; a relay keeping run state waits for the
broker as a passthrough one does (not ready meanwhile, one JSON warning per check) instead
of dying with a traceback; what the broker's answer shows wrong still fails at once. And
the ``relay_started`` line names the versions ``lineage-relay --version`` prints."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from producer.librdkafka_log import line_kind
from relay.app import CLOSE_MARGIN_S
from relay.embedded.broker import free_port
from relay.state.changelog import StateError
from tests.relay.test_relay_readiness import readyz, served
from tests.support.hanging_proxy import HangingProxy
from tests.support.relay import RelayThread, eventually, relay_config, suite_loop_args

pytestmark = pytest.mark.kafka

DRAIN_S = 1.0
#: The process's own hand-overs on the way out (the relay's steps are bounded by the deadline).
SLACK_S = 1.5


def records(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == event]


def unreachable_config(tmp_path: Path, mode: str, *, create_dlq_topic: bool) -> Path:
    """A relay configuration whose broker is a loopback port nobody listens on."""
    path = tmp_path / "relay.yaml"
    path.write_text(f"kafka:\n  bootstrap_servers: 127.0.0.1:{free_port()}\n  topics: [events]\n  group_id: g\n"
                    f"  create_dlq_topic: {str(create_dlq_topic).lower()}\n"
                    f"collectors:\n  - name: c\n    url: http://127.0.0.1:9\n    mode: {mode}\n"
                    f"drain_timeout_s: {DRAIN_S:g}\n")
    return path


@pytest.mark.parametrize(("mode", "create_dlq_topic"), [("passthrough", True), ("consolidated", False)],
                         ids=["creating_the_dlq_topic", "checking_the_run_state_topic"])
def test_sigterm_while_the_broker_does_not_answer_at_start_up_exits_0_within_the_bound(
        tmp_path, mode, create_dlq_topic):
    """Creating the dead-letter topic waits up to 15 s for the broker, checking the run-state
    topic 10 s per look: a SIGTERM then was only seen after that (14 s measured with
    drain_timeout_s 3 and 1; the consolidated relay then died with a traceback, exit 1),
    past the grace period that allows drain_timeout_s + 5 s."""
    port = free_port()
    log_path = tmp_path / "relay.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "relay", "run", "--config",
                                 str(unreachable_config(tmp_path, mode, create_dlq_topic=create_dlq_topic)),
                                 "--http-port", str(port), *suite_loop_args()],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        def starting() -> bool:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
            except requests.RequestException:
                return False
            assert answer.json().get("reason") == "starting", answer.text
            return True
        assert eventually(starting, 30), "the relay never served /readyz"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(DRAIN_S + CLOSE_MARGIN_S + SLACK_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {DRAIN_S + CLOSE_MARGIN_S + SLACK_S:g} s after SIGTERM")
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = log_path.read_text().splitlines()
    events = [json.loads(line)["event"] for line in lines]  # one JSON object per line, no traceback
    assert code == 0, lines[-5:]
    assert took < DRAIN_S + CLOSE_MARGIN_S
    assert "relay_start_interrupted" in events and events[-1] == "relay_stopped", events


def test_a_relay_keeping_run_state_waits_for_the_broker_not_ready_then_starts_once_it_answers(
        kafka, caplog, monkeypatch):
    """The broker is not there when a consolidated relay starts: it died after ~26 s with a
    multi-line traceback (``Failed to get metadata``). It now checks again, one warning per
    look, not ready meanwhile (the broker named as the reason), and starts once the broker
    answers."""
    monkeypatch.setattr("relay.source.broker_contact.SILENT_AFTER_S", 0.1)
    monkeypatch.setattr("relay.state.changelog._METADATA_TIMEOUT_S", 0.5)
    monkeypatch.setattr("relay.state.changelog._UNREACHABLE_BACKOFF_S", (0.1, 0.2))
    topic, group = kafka.new_topic("late-broker", partitions=2), kafka.new_group()
    broker_port = int(kafka.bootstrap_servers.rsplit(":", 1)[1])
    port = free_port()  # the broker's address for the relay: nobody listens there yet
    bootstrap = f"127.0.0.1:{port}"
    config = relay_config(bootstrap, topic, {"c": "http://127.0.0.1:9/unused"}, group=group, dlq="unused",
                          collector={"mode": "consolidated"},
                          kafka={"bootstrap_servers": bootstrap, "topics": [topic], "group_id": group,
                                 "create_dlq_topic": False, "consumer_properties": kafka.consumer_properties()})
    proxy = HangingProxy(broker_port, port)  # forwards to the broker once started
    with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
        try:
            with served(relay) as base:
                assert eventually(lambda: len(records(caplog, "run_state_topic_unreachable")) >= 2, 20)
                warning = records(caplog, "run_state_topic_unreachable")[0]
                assert warning.levelno == logging.WARNING
                assert warning.fields["topic"] == config.kafka.run_state_topic
                assert "Failed to get metadata" in warning.fields["error"], warning.fields
                status, body = readyz(base)
                assert (status, body["reason"]) == (503, "broker_unreachable"), body
                proxy.start()  # the broker answers from now on
                assert eventually(lambda: readyz(base)[0] == 200, 30), readyz(base)
            assert records(caplog, "run_state_topic_ready") and records(caplog, "relay_started")
            assert records(caplog, "broker_unreachable") and records(caplog, "broker_answered")
        finally:
            relay.stop(timeout_s=DRAIN_S + CLOSE_MARGIN_S + SLACK_S + 10)
            if proxy._server is not None:
                proxy.stop()


def test_a_stop_while_the_run_state_topic_is_checked_again_ends_the_start_at_once(kafka, caplog, monkeypatch):
    """The check blocks on the broker (10 s a look in production); the stop does not wait for
    it: the relay returns while the check is still blocked, left behind on a daemon thread.
    Here the second look blocks until the test lets it go, so a stop that waited for it
    would never return (no timing involved)."""
    from relay.state import changelog

    monkeypatch.setattr("relay.state.changelog._METADATA_TIMEOUT_S", 3.0)
    monkeypatch.setattr("relay.state.changelog._UNREACHABLE_BACKOFF_S", (0.05, 0.1))
    blocked, release = threading.Event(), threading.Event()
    looks = []
    real_topics = changelog._topics

    def topics(admin):
        looks.append(threading.current_thread())
        if len(looks) >= 2:  # a check after the first: waits until the test is done
            blocked.set()
            release.wait(120)
        return real_topics(admin)
    monkeypatch.setattr("relay.state.changelog._topics", topics)
    bootstrap = f"127.0.0.1:{free_port()}"
    config = relay_config(bootstrap, "events", {"c": "http://127.0.0.1:9/unused"}, group="g", dlq="unused",
                          collector={"mode": "consolidated"}, drain_timeout_s=DRAIN_S,
                          kafka={"bootstrap_servers": bootstrap, "topics": ["events"], "group_id": "g",
                                 "create_dlq_topic": False})
    with caplog.at_level(logging.INFO, logger="relay"):
        relay = RelayThread(config).start()
        try:
            assert eventually(blocked.is_set, 15)
            assert records(caplog, "run_state_topic_unreachable")
            checking = looks[-1]
            assert checking.name.startswith("run-state-topic-") and checking.name != "run-state-topic-1"
        finally:
            try:
                relay.stop(timeout_s=DRAIN_S + CLOSE_MARGIN_S + SLACK_S + 10)
                assert checking.is_alive() and not release.is_set(), "the stop waited for the broker"
            finally:
                release.set()
    assert [r.fields["step"] for r in records(caplog, "relay_start_interrupted")] == ["run_state_topic"]
    assert records(caplog, "relay_stopped") and not records(caplog, "relay_started")


def _start_until_the_dlq_topic_is_given_up(caplog, bootstrap: str, within_s: float) -> None:
    """A relay against ``bootstrap`` (nothing listens there), run until it logs
    ``dlq_topic_not_created``, then stopped."""
    config = relay_config(bootstrap, "events", {"c": "http://127.0.0.1:9/unused"}, group="g", dlq="the-dlq",
                          drain_timeout_s=DRAIN_S)
    with caplog.at_level(logging.INFO, logger="relay"):
        relay = RelayThread(config).start()
        try:
            assert eventually(lambda: records(caplog, "dlq_topic_not_created"), within_s)
        finally:
            relay.stop(timeout_s=DRAIN_S + CLOSE_MARGIN_S + SLACK_S)


def test_a_dlq_topic_not_created_for_want_of_an_answer_says_so(caplog, monkeypatch):
    """The warning's error was empty when the creation timed out (a TimeoutError prints as
    ""): it names the exception and what timed out."""
    monkeypatch.setattr("relay.startup.DLQ_CREATE_TIMEOUT_S", 0.5)
    _start_until_the_dlq_topic_is_given_up(caplog, f"127.0.0.1:{free_port()}", 10)
    [warning] = records(caplog, "dlq_topic_not_created")
    assert warning.fields["topic"] == "the-dlq"
    # Which gives up first, librdkafka's request or the wait for its answer, varies.
    assert re.fullmatch(r"TimeoutError: no answer from the broker within 0.5s|KafkaException: .*Timed out.*",
                        warning.fields["error"]), warning.fields


async def test_a_dlq_topic_creation_timing_out_is_logged_with_the_wait(caplog, monkeypatch):
    """The wait for the broker's answer running out (concurrent.futures' TimeoutError, whose
    text is empty: the creation at 15 s with an unreachable broker) is named as such, and,
    no broker having answered, so is the address to check."""
    from relay.source.broker_contact import BrokerContact
    from relay.startup import DLQ_CREATE_TIMEOUT_S, create_dead_letter_topic

    def no_answer(*_args: object, **_kwargs: object) -> None:
        raise TimeoutError()
    monkeypatch.setattr("relay.startup.create_topic", no_answer)
    config = relay_config("127.0.0.1:9", "events", {"c": "http://127.0.0.1:9/unused"}, group="g", dlq="the-dlq")
    with caplog.at_level(logging.INFO, logger="relay"):
        await create_dead_letter_topic(config.kafka, BrokerContact("127.0.0.1:9"), max_message_bytes="1000")
    [warning] = records(caplog, "dlq_topic_not_created")
    assert warning.fields.pop("hint").startswith("no broker answered: check kafka.bootstrap_servers")
    assert warning.fields == {"topic": "the-dlq", "bootstrap_servers": "127.0.0.1:9",
                              "error": f"TimeoutError: no answer from the broker within {DLQ_CREATE_TIMEOUT_S:g}s"}


def test_an_unreachable_broker_is_named_early_at_start_up(caplog, monkeypatch):
    """Against an unreachable broker the relay logged nothing of its own for 15 s, then
    ``dlq_topic_not_created`` with librdkafka's "Failed while waiting for controller: Local:
    Timed out", no hint that the bootstrap servers cannot be reached. It now warns
    ``broker_unreachable`` (naming them) within the first seconds, and the dead-letter
    warning says that no broker answered."""
    monkeypatch.setattr("relay.source.broker_contact.SILENT_AFTER_S", 0.5)
    monkeypatch.setattr("relay.startup.DLQ_CREATE_TIMEOUT_S", 3.0)
    bootstrap = f"127.0.0.1:{free_port()}"
    _start_until_the_dlq_topic_is_given_up(caplog, bootstrap, 20)
    unreachable = records(caplog, "broker_unreachable")
    [not_created] = records(caplog, "dlq_topic_not_created")
    assert unreachable and unreachable[0].levelno == logging.WARNING
    assert caplog.records.index(unreachable[0]) < caplog.records.index(not_created)  # before the 15 s wait ends
    assert unreachable[0].fields["bootstrap_servers"] == bootstrap
    assert "kafka.bootstrap_servers" in unreachable[0].fields["hint"]
    assert not_created.fields["bootstrap_servers"] == bootstrap
    assert "no broker answered" in not_created.fields["hint"], not_created.fields
    # librdkafka's connection failures (one at every attempt, hundreds in these seconds)
    # do not bury those warnings: one line per client and kind within REPEAT_EVERY_S.
    lines = [(r.fields["client"], *line_kind(r.fields["facility"], r.fields["message"]))
             for r in records(caplog, "librdkafka")]
    assert lines and len(lines) == len(set(lines)), lines


@pytest.mark.parametrize("problem", ["state_topic_missing", "partition_counts_differ"])
def test_what_the_brokers_answer_shows_wrong_still_fails_at_once_naming_the_key(kafka, caplog, problem):
    """Only "no answer" is waited for: a state topic missing (and not to be created) or
    partitioned unlike the input topic is a configuration error, raised at once."""
    topic, group = kafka.new_topic("state-check", partitions=2), kafka.new_group()
    state_topic = kafka.new_topic("state", partitions=1) if problem == "partition_counts_differ" else f"{group}.state"
    config = relay_config(kafka.bootstrap_servers, topic, {"c": "http://127.0.0.1:9/unused"}, group=group,
                          dlq="unused", collector={"mode": "consolidated"},
                          kafka={"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic], "group_id": group,
                                 "create_dlq_topic": False, "state_topic": state_topic,
                                 "create_state_topic": problem != "state_topic_missing"})
    began = time.monotonic()
    relay = RelayThread(config).start()
    assert relay._thread is not None
    relay._thread.join(15)
    with pytest.raises(StateError, match="kafka.state_topic") as failed:
        relay.stop(timeout_s=1)
    assert time.monotonic() - began < 15
    assert ("create_state_topic" if problem == "state_topic_missing" else "has 1 partitions") in str(failed.value)
    assert not records(caplog, "run_state_topic_unreachable")
    # What the start had started is closed: its dead-letter producer's poll thread was left
    # running (in an application embedding the relay, for good).
    dlq_poll = relay.relay.dead_letters._host._thread
    assert dlq_poll is not None and not dlq_poll.is_alive()


def test_relay_started_names_the_versions_lineage_relay_version_prints(kafka, caplog):
    """The README promises relay, librdkafka, confluent-kafka, aiohttp and Python versions in
    the relay_started log line, as --version prints them; it had the first two."""
    import platform

    import aiohttp
    import confluent_kafka

    from relay import __version__
    from relay.cli import version_line

    topic, group = kafka.new_topic("versions"), kafka.new_group()
    config = relay_config(kafka.bootstrap_servers, topic, {"c": "http://127.0.0.1:9/unused"}, group=group,
                          dlq="unused", kafka={"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic],
                                               "group_id": group, "create_dlq_topic": False})
    with caplog.at_level(logging.INFO, logger="relay"), RelayThread(config) as relay:
        assert eventually(lambda: relay.relay is not None and relay.relay.started, 30)
    [started] = records(caplog, "relay_started")
    versions = {key: started.fields.get(key) for key in ("version", "librdkafka", "confluent_kafka", "aiohttp",
                                                          "python")}
    assert versions == {"version": __version__, "librdkafka": confluent_kafka.libversion()[0],
                        "confluent_kafka": confluent_kafka.__version__, "aiohttp": aiohttp.__version__,
                        "python": platform.python_version()}
    assert version_line() == (f"lineage-relay {__version__} (librdkafka {versions['librdkafka']}, confluent-kafka "
                              f"{versions['confluent_kafka']}, aiohttp {versions['aiohttp']}, "
                              f"Python {versions['python']})")


def test_an_unexpected_error_is_one_json_line_with_its_traceback_and_exit_1(tmp_path):
    """A bug (here: start() raising) must not end the process with a raw traceback: the
    logs stay one JSON object per line, and the status tells a supervisor to restart it."""
    prelude = ("import relay.app\n"
               "async def broken(self):\n"
               "    raise RuntimeError('a bug in start')\n"
               "relay.app.Relay.start = broken\n")
    code = prelude + ("import sys\nfrom relay.cli import main\n"
                      "sys.exit(main(['run', '--bootstrap-servers', '127.0.0.1:1', '--collector', "
                      "'m=http://127.0.0.1:1', '--http-port', '0']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    [failed] = [line for line in lines if line["event"] == "relay_failed"]
    assert failed["error"] == "RuntimeError: a bug in start"
    assert "Traceback" in failed["exception"] and "a bug in start" in failed["exception"]
