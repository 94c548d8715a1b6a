"""A stop asked for while the relay starts is taken at once (relay/entrypoint.py): in a
container the relay is PID 1, which the kernel sends no signal it has no handler for.

A test process is not PID 1 (an unhandled SIGTERM kills it, -15), so the tests check what
only the handler does: the process catches SIGTERM within moments of starting, and exits
with the early-stop code where, without the handler, it would have gone on to fail on its
configuration (exit 2, half a second of imports later)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from relay import cli
from relay.entrypoint import EARLY_STOP_EXIT_CODE, install_early_stop, release_early_stop

ROOT = Path(__file__).resolve().parents[2]
PROC = Path("/proc/self/status").exists()


def _console_script() -> list[str]:
    """What pyproject's ``lineage-relay`` script runs, as pip's generated wrapper does."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["lineage-relay"]
    module, func = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.skipif(not PROC, reason="reads the signal mask from /proc (Linux)")
@pytest.mark.parametrize("command", [_console_script(), [sys.executable, "-m", "relay"]],
                         ids=["console-script", "python-m-relay"])
def test_sigterm_during_start_up_exits_at_once(command, tmp_path):
    # A config that is not there: `run` would fail on it with exit 2 once its imports are done.
    config = tmp_path / "absent.yaml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    env.pop("LINEAGE_RELAY_WORKER", None)
    proc = subprocess.Popen([*command, "run", "--config", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)   # ok: poll interval of a wait with a deadline
        assert proc.poll() is None, f"exited {proc.returncode} without ever handling SIGTERM: {proc.stderr.read()!r}"
        assert _catches_sigterm(proc.pid), "no SIGTERM handler 30 s after start"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EARLY_STOP_EXIT_CODE == 0, (proc.returncode, err)
    assert err == b"" and out == b"", "stopped before reading its config: nothing to say"


@pytest.fixture
def handlers():
    """The test process's SIGTERM and SIGINT handlers, put back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield saved
    finally:
        release_early_stop()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_release_puts_the_previous_handlers_back(handlers):
    install_early_stop()
    assert signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]
    with pytest.raises(SystemExit) as stopped:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    assert stopped.value.code == EARLY_STOP_EXIT_CODE
    release_early_stop()
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_an_ignored_signal_stays_ignored(handlers):
    """A supervisor's worker ignores SIGINT from its start (relay/__main__.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_early_stop()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]


def test_a_handler_installed_since_is_kept(handlers):
    def own(*_args):
        pass

    install_early_stop()
    signal.signal(signal.SIGTERM, own)
    release_early_stop()
    assert signal.getsignal(signal.SIGTERM) is own
    assert signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]


def test_commands_other_than_run_get_their_own_stop_behaviour_back(handlers, tmp_path, capsys):
    """`check-config`, `dlq redrive`, ...: a SIGTERM in the middle of them is not a clean stop."""
    config = tmp_path / "relay.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:9092\n  topics: [openlineage]\n"
                      "collectors:\n  - name: marquez\n    url: http://127.0.0.1:5000\n")
    install_early_stop()
    assert cli.main(["check-config", str(config)]) == 0, capsys.readouterr()
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
