"""The supervisor's own decisions (relay/workers.py), with plain processes for workers: a
start-up that fails or is stopped part-way, and the exit code of a stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import aiohttp
import pytest

from relay.config import build_config
from relay.worker_link import WorkerLink
from relay.workers import Supervisor, Worker
from tests.support.waiting import until

CONFIG = build_config({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "drain_timeout_s": 1,
                       "collectors": [{"name": "a", "url": "http://127.0.0.1:1"}]})


async def no_endpoint(_app):
    return None


def kill_all(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.proc is not None and worker.proc.returncode is None:
            try:
                os.kill(worker.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fake_start(plan: dict[int, str], started: list[int], on_start=None):
    """Worker.start replaced: ``plan[index]`` a shell command to run, or ``raise``."""
    async def start(self: Worker, _argv: list[str]) -> None:
        started.append(self.index)
        if plan[self.index] == "raise":
            raise RuntimeError(f"worker {self.index} cannot start")
        self.proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", plan[self.index])
        if on_start is not None:
            await on_start(self)
    return start


def test_a_failed_start_stops_the_workers_already_started(monkeypatch):
    started: list[int] = []
    monkeypatch.setattr(Worker, "start", fake_start({0: "exec sleep 60", 1: "raise", 2: "exec sleep 60"}, started))
    supervisor = Supervisor(CONFIG, [], 3)
    try:
        with pytest.raises(RuntimeError, match="worker 1 cannot start"):
            asyncio.run(supervisor.run(no_endpoint))
        first = supervisor.workers[0].proc
        assert started == [0, 1]
        assert first is not None and first.returncode == -signal.SIGTERM  # signalled, and reaped
    finally:
        kill_all(supervisor.workers)


def test_a_stop_during_start_up_starts_no_more_workers_and_is_clean(monkeypatch):
    started: list[int] = []
    supervisor = Supervisor(CONFIG, [], 3)

    async def stop_now(_worker: Worker) -> None:
        supervisor.request_stop()

    monkeypatch.setattr(Worker, "start", fake_start({i: "exec sleep 60" for i in range(3)}, started, stop_now))
    try:
        code = asyncio.run(supervisor.run(no_endpoint))
        assert started == [0]
        assert supervisor.workers[0].proc.returncode == -signal.SIGTERM  # killed by the stop's SIGTERM: clean
        assert code == 0 and supervisor.failed is None
    finally:
        kill_all(supervisor.workers)


def test_workers_that_exit_at_once_exit_the_supervisor_2_when_one_exited_2(monkeypatch):
    async def exited(worker: Worker) -> None:
        await worker.proc.wait()  # so that both have exited when the supervisor looks

    for order in ({0: "exit 1", 1: "exit 2"}, {0: "exit 2", 1: "exit 1"}):
        monkeypatch.setattr(Worker, "start", fake_start(order, [], exited))
        supervisor = Supervisor(CONFIG, [], 2)
        assert asyncio.run(supervisor.run(no_endpoint)) == 2
        assert supervisor.failed is not None and supervisor.failed[1] == 2


def test_a_worker_killed_by_a_signal_without_a_name_is_logged_with_its_number(monkeypatch, caplog):
    """Real-time signals 35-63 (but SIGRTMIN/SIGRTMAX) have no ``signal.Signals`` member: the
    supervisor raised ValueError instead of logging ``worker_exited``."""
    caplog.set_level(logging.ERROR, "relay.workers")
    monkeypatch.setattr(Worker, "start", fake_start({0: "kill -40 $$", 1: "exec sleep 60"}, []))
    supervisor = Supervisor(CONFIG, [], 2)
    try:
        assert asyncio.run(supervisor.run(no_endpoint)) == 1
    finally:
        kill_all(supervisor.workers)
    [exited] = [r for r in caplog.records if r.getMessage() == "worker_exited"]
    assert exited.fields["worker"] == 0 and exited.fields["signal"] == "SIG40"
    assert supervisor.workers[1].proc.returncode == -signal.SIGTERM   # the other one stopped


def test_a_worker_started_as_a_worker_imports_this_relay_package(monkeypatch, tmp_path):
    seen: dict[str, str] = {}

    async def exec_(*args, env, **_kw):
        seen.update(env)
        raise OSError("not started")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", exec_)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError):
        asyncio.run(Worker(0).start(["run"]))
    root = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["relay"].__file__)))
    assert seen["PYTHONPATH"].split(os.pathsep) == [root, str(tmp_path)]
    assert seen["LINEAGE_RELAY_WORKER"].startswith("0,")


def test_a_worker_that_exits_2_while_stopped_after_another_failed_makes_it_2(monkeypatch, tmp_path):
    # Worker 0 fails (1) alone; worker 1 exits 2 only once the supervisor stops it: still 2.
    ready = tmp_path / "trapped"

    async def trapped(worker: Worker) -> None:
        if worker.index == 1:  # its TERM trap is in place before any stop
            await until(ready.exists, "worker 1's TERM trap")

    plan = {0: "exit 1", 1: f"trap 'exit 2' TERM; touch {ready}; while :; do sleep 0.05; done"}
    monkeypatch.setattr(Worker, "start", fake_start(plan, [], trapped))
    supervisor = Supervisor(CONFIG, [], 2)
    try:
        assert asyncio.run(supervisor.run(no_endpoint)) == 2
        assert supervisor.failed is not None and supervisor.failed[0].index == 0 and supervisor.failed[1] == 1
        assert supervisor.workers[1].proc.returncode == 2
    finally:
        kill_all(supervisor.workers)


def test_a_probe_on_a_closed_session_is_no_answer():
    class Running:
        returncode = None

    async def probe():
        worker = Worker(0)
        worker.proc, worker.port = Running(), 1
        session = aiohttp.ClientSession()
        await session.close()
        return await worker.get(session, "/healthz")

    assert asyncio.run(probe()) is None


def test_the_endpoint_closes_before_the_session(monkeypatch):
    order: list[str] = []

    class Runner:
        async def cleanup(self):
            order.append("endpoint" if not supervisor._session.closed else "endpoint after the session")

    async def bind(_app):
        return Runner()

    monkeypatch.setattr(Worker, "start", fake_start({0: "exit 0"}, []))
    supervisor = Supervisor(CONFIG, [], 1)
    try:
        asyncio.run(supervisor.run(bind))
    finally:
        kill_all(supervisor.workers)
    assert order == ["endpoint"]


def test_reporting_the_port_to_a_supervisor_already_gone_is_no_crash():
    """A supervisor killed before it read a worker's port: the write used to raise
    BrokenPipeError out of the worker's start-up (``relay_failed``, a traceback, exit 1)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    assert WorkerLink(0, write_end, -1).report_port(8080) is False
    read_end, write_end = os.pipe()
    try:
        assert WorkerLink(0, write_end, -1).report_port(8080) is True
        assert os.read(read_end, 16) == b"8080\n"
        assert os.read(read_end, 16) == b"", "the write end is still open (a descriptor held for the worker's life)"
    finally:
        os.close(read_end)
    for fd in (write_end,):   # closed by report_port either way
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_config_named_by_a_descriptor_path_is_read_once_even_over_a_regular_file(tmp_path):
    """``--config /dev/stdin < relay.yaml``: /dev/stdin is a regular file then, but workers'
    stdin is /dev/null: the supervisor must read it for them."""
    from relay.worker_link import read_once

    config = tmp_path / "relay.yaml"
    config.write_text("kafka: {bootstrap_servers: 'h:9092'}\n")
    assert read_once(str(config)) is None   # a regular file: each worker reads it again
    fd = os.open(config, os.O_RDONLY)
    try:
        assert read_once(f"/proc/self/fd/{fd}") == config.read_bytes()
        assert read_once(f"/dev/fd/{fd}") == config.read_bytes()
    finally:
        os.close(fd)
