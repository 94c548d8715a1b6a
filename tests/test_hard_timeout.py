"""The suite's hard per-test limit (tests/support/watchdog.py): a hang that pytest-timeout cannot end
(in the teardown that runs after it fired) ends the process with every thread's stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CONFTEST = """
from tests.conftest import (  # noqa: F401
    _HARD_TIMEOUT, pytest_configure, pytest_exception_interact, pytest_runtest_protocol, pytest_unconfigure)
"""

_TESTS = """
import threading
import time

import pytest


@pytest.fixture
def teardown_that_hangs():
    yield
    threading.Event().wait()  # pytest-timeout already fired: nothing interrupts this


def test_hangs_after_its_timeout(teardown_that_hangs):
    time.sleep(30)  # ok: the hung call itself; pytest-timeout (1 s) interrupts it
"""


def _env(**extra: str) -> dict[str, str]:
    """The child pytest's environment: this run's settings of pytest and pytest-timeout left out."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_TIMEOUT", "PYTEST_ADDOPTS")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_a_hang_in_teardown_after_pytest_timeout_fired_ends_the_process_with_its_stack(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_hang.py").write_text(textwrap.dedent(_TESTS))
    env = _env(LINEAGE_RELAY_TEST_HARD_TIMEOUT="5")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--timeout=1", "--rootdir", str(tmp_path), str(tmp_path / "test_hang.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Timeout (0:00:0" in done.stderr, output  # the rest of the 5 s, armed again after the failure
    assert "teardown_that_hangs" in done.stderr, output  # the hung frame is in the dump


def test_the_hard_limit_is_pytest_timeouts_plus_a_grace_unless_the_environment_sets_it(monkeypatch):
    from tests.support.watchdog import ENV, GRACE_S, HardTimeout

    monkeypatch.delenv(ENV, raising=False)
    assert HardTimeout.limit_for(300.0) == 300.0 + GRACE_S
    assert HardTimeout.limit_for(None) is None
    assert HardTimeout.limit_for(0.0) is None
    monkeypatch.setenv(ENV, "42")
    assert HardTimeout.limit_for(300.0) == 42.0
    monkeypatch.setenv(ENV, "0")
    assert HardTimeout.limit_for(300.0) is None
    monkeypatch.setenv(ENV, "soon")
    try:
        HardTimeout.limit_for(300.0)
    except ValueError as err:
        assert ENV in str(err)
    else:
        raise AssertionError("a non-number was taken")


def test_a_thread_left_blocked_cannot_keep_the_process_from_ending(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_leak.py").write_text(textwrap.dedent("""
        import threading

        def test_leaves_a_thread_that_never_ends():
            threading.Thread(target=threading.Event().wait, name="never-ends").start()
        """))
    env = _env(LINEAGE_RELAY_TEST_HARD_TIMEOUT="5")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", str(tmp_path), str(tmp_path / "test_leak.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr  # the exit itself timed out
    assert "Timeout (0:00:05)!" in done.stderr and "threading.py" in done.stderr, done.stderr


def test_a_child_forked_while_the_limit_runs_can_use_faulthandler_and_exit(tmp_path):
    """faulthandler (3.11) has no fork handler: a child forked while the timer ran inherited
    its thread's lock held and hung at its first cancel or arm, or its interpreter's exit."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_fork.py").write_text(textwrap.dedent("""
        import faulthandler
        import os

        from tests.support.children import exit_status, run_in_child


        def test_a_child_arms_and_cancels_a_timer_of_its_own():
            pid = os.fork()
            if pid == 0:
                def child():
                    faulthandler.dump_traceback_later(30)
                    faulthandler.cancel_dump_traceback_later()
                    return 0
                run_in_child(child)
            assert exit_status(pid, 20) == 0
        """))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", str(tmp_path), str(tmp_path / "test_fork.py")],
        cwd=tmp_path, env=_env(LINEAGE_RELAY_TEST_HARD_TIMEOUT="60"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_sigusr2_prints_every_threads_stack_and_the_run_goes_on(tmp_path):
    """What .ci/run sends a suite that outlasts its limit: each pytest process says where it is."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    started = tmp_path / "started"
    (tmp_path / "test_waits.py").write_text(textwrap.dedent(f"""
        import pathlib
        import threading


        def test_waits_a_while_where_ci_finds_it():
            pathlib.Path({str(started)!r}).touch()
            threading.Event().wait(8)
        """))
    with open(tmp_path / "stderr", "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
             "--rootdir", str(tmp_path), str(tmp_path / "test_waits.py")],
            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while not started.exists():
                assert time.monotonic() < deadline and child.poll() is None, "the test never started"
                time.sleep(0.05)  # ok: the poll interval of a wait with a deadline
            child.send_signal(signal.SIGUSR2)
            out, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    dump = (tmp_path / "stderr").read_text()
    assert "test_waits_a_while_where_ci_finds_it" in dump, dump
    assert child.returncode == 0 and b"1 passed" in out, (child.returncode, out, dump)
