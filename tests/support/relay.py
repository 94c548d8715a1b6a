"""Run a real relay for a test: in-process on its own thread and event loop
(:class:`RelayThread`), or as a separate ``lineage-relay run`` process
(:class:`RelayProcess`) for kill -9 and SIGTERM tests.

``LINEAGE_RELAY_TEST_EVENT_LOOP`` (``auto``, ``uvloop`` or ``asyncio``), when set, is the
``event_loop`` of every relay these start (a ``--event-loop`` a test gives itself stays)
and of those the tests that start ``python -m relay run`` themselves start with
:func:`suite_loop_args` (those that only check its argument errors do not: no loop runs),
and, naming uvloop, the loop of the async tests too (tests/conftest.py): the suite under
either loop, e.g. ``LINEAGE_RELAY_TEST_EVENT_LOOP=asyncio ./dev test tests/relay``. Unset:
each relay's own setting (``auto`` unless given: uvloop where installed), and the async
tests on asyncio's loop. Async tests marked :data:`ON_EACH_LOOP` run once on each loop
whatever it says."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from relay import event_loop
from relay.config import RelayConfig, build_config
from relay.embedded import runner
from relay.embedded.broker import FAST_GROUP_PROPERTIES, free_port


def _suite_loop() -> str | None:
    value = os.environ.get("LINEAGE_RELAY_TEST_EVENT_LOOP")
    if not value:
        return None
    if value not in event_loop.EVENT_LOOPS:
        raise RuntimeError(f"LINEAGE_RELAY_TEST_EVENT_LOOP={value!r}: must be auto, uvloop or asyncio; fix: set it "
                           "to one of those, or unset it (each relay's own setting)")
    try:
        return event_loop.check_setting(value)
    except ValueError as err:  # uvloop, not importable; the message names the config key
        raise RuntimeError(f"LINEAGE_RELAY_TEST_EVENT_LOOP=uvloop, which cannot be imported here ({err}); fix: "
                           "pip install uvloop, or set it to asyncio or auto") from None


#: The suite's event loop for every relay started here (see the module docstring); None: unset.
TEST_EVENT_LOOP = _suite_loop()


#: The loops :data:`ON_EACH_LOOP` names, by name (tests/conftest.py's loop factory hook).
EACH_LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
if importlib.util.find_spec("uvloop") is not None:
    EACH_LOOP_FACTORIES["uvloop"] = event_loop.loop_factory("uvloop")
#: Runs an async test once on each loop, whatever ``LINEAGE_RELAY_TEST_EVENT_LOOP`` says:
#: for the code whose behaviour the loop can change (TLS, timers).
ON_EACH_LOOP = pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])


def suite_loop_args() -> list[str]:
    """``--event-loop <LINEAGE_RELAY_TEST_EVENT_LOOP>`` when it is set, for a test that starts
    ``python -m relay run`` itself; else nothing."""
    return ["--event-loop", TEST_EVENT_LOOP] if TEST_EVENT_LOOP is not None else []


class RelayThread(runner.RelayThread):
    """:class:`relay.embedded.runner.RelayThread`, on ``LINEAGE_RELAY_TEST_EVENT_LOOP`` when set."""

    def __init__(self, config: RelayConfig) -> None:
        if TEST_EVENT_LOOP is not None:
            config = config.model_copy(update={"event_loop": TEST_EVENT_LOOP})
        super().__init__(config)


def relay_config(bootstrap: str, topic: str, collectors: dict[str, str], *, group: str, dlq: str,
                 **overrides: Any) -> RelayConfig:
    pipeline = overrides.pop("pipeline", {})
    collector_extra = overrides.pop("collector", {})
    data = {
        "kafka": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": group, "dlq_topic": dlq,
                  "consumer_properties": dict(FAST_GROUP_PROPERTIES), "commit_interval_s": 0.5},
        "collectors": [{"name": n, "url": u, "retry": {"initial_backoff_s": 0.05, "max_backoff_s": 1.0},
                        **collector_extra} for n, u in collectors.items()],
        "pipeline": pipeline,
        "http": {"port": None},
        "drain_timeout_s": 10,
        **overrides,
    }
    return build_config(data)


class RelayProcess:
    """``lineage-relay run`` as a child process with its own /metrics port; ``own_group``:
    in a process group of its own, as a terminal runs a command (see :meth:`interrupt`)."""

    def __init__(self, args: list[str], *, log_path: Path, own_group: bool = False,
                 stdin: bytes | None = None) -> None:
        self.http_port = free_port()
        self.stdin = stdin   # written to its standard input, then closed (``--config /dev/stdin``)
        self.args = [sys.executable, "-m", "relay", "run", *args, "--http-port", str(self.http_port)]
        if TEST_EVENT_LOOP is not None and "--event-loop" not in args:
            self.args += ["--event-loop", TEST_EVENT_LOOP]
        self.log_path = log_path
        self.own_group = own_group
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        log = open(self.log_path, "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, env=env, start_new_session=self.own_group,
                                     stdin=subprocess.DEVNULL if self.stdin is None else subprocess.PIPE)
        if self.stdin is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(self.stdin)
            self.proc.stdin.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"relay exited early: {self.log_path.read_text()[-2000:]}"
            try:
                if requests.get(f"http://127.0.0.1:{self.http_port}/readyz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)  # ok: poll interval of a readiness wait with a deadline
        raise AssertionError("relay process never became ready")

    def metrics_text(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5).text

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def interrupt(self, timeout_s: float) -> int:
        """Ctrl-C: SIGINT to the whole process group (``own_group``), as a terminal sends it."""
        assert self.proc is not None and self.own_group
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.own_group:  # its decode processes too
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            self.proc.wait(10)


def eventually(predicate, timeout_s: float) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)  # ok: poll interval of a wait with a deadline
    return bool(predicate())
