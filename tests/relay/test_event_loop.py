"""``event_loop: auto | uvloop | asyncio``: validated with the configuration (``check-config``
too), taken from the file, ``${VAR}`` or ``--event-loop``, and the loop ``run`` and the
supervisor then run on. uvloop missing is simulated by ``sys.modules['uvloop'] = None`` in
a child interpreter (an import of it then fails, as when it is not installed)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
import subprocess
import sys

import pytest

from relay.cli import _add_relay_flags, config_from_args, main
from relay.config import build_config
from relay.errors import ConfigError
from relay.event_loop import loop_name
from relay.stages.decode_worker import package_env

BASE = {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "collectors": [{"name": "a", "url": "http://127.0.0.1:1"}]}
FILE = "kafka: {bootstrap_servers: '127.0.0.1:1'}\ncollectors: [{name: a, url: 'http://127.0.0.1:1'}]\n"
RUN = ["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1"]
#: For the tests that run on uvloop in this interpreter (uvloop has no Windows build).
needs_uvloop = pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
#: A child interpreter where ``import uvloop`` fails, as where it is not installed.
NO_UVLOOP = "import sys\nsys.modules['uvloop'] = None\n"


def run_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _add_relay_flags(parser)
    return parser.parse_args(["--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1", *extra])


def child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          env=package_env())


@pytest.mark.parametrize("value", ["auto", pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_each_setting_is_accepted(value):
    assert build_config({**BASE, "event_loop": value}).event_loop == value


def test_the_default_is_auto():
    assert build_config(BASE).event_loop == "auto"


@pytest.mark.parametrize("value", ["trio", "UVLOOP", "", 1, True, None])
def test_an_unknown_value_is_refused_naming_the_key_and_the_fix(value):
    with pytest.raises(ConfigError) as err:
        build_config({**BASE, "event_loop": value})
    assert "event_loop: must be auto (uvloop when installed, else asyncio), uvloop or asyncio; fix:" in str(err.value)


@needs_uvloop
def test_the_flag_overrides_the_file_and_the_file_reads_variables(tmp_path, monkeypatch):
    path = tmp_path / "relay.yaml"
    path.write_text(FILE + "event_loop: ${RELAY_LOOP:-auto}\n")
    assert config_from_args(run_args("--config", str(path))).event_loop == "auto"
    monkeypatch.setenv("RELAY_LOOP", "asyncio")
    assert config_from_args(run_args("--config", str(path))).event_loop == "asyncio"
    assert config_from_args(run_args("--config", str(path), "--event-loop", "uvloop")).event_loop == "uvloop"


def test_run_refuses_an_unknown_flag_value(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*RUN, "--event-loop", "trio"])
    assert exit_.value.code == 2
    assert "--event-loop: invalid choice" in capsys.readouterr().err


@pytest.fixture
def loops_run(monkeypatch):
    """What ``run`` ran on: the kind of the running loop in ``serve`` and ``supervise`` (both
    replaced: no broker here)."""
    seen: list[tuple[str, str]] = []

    async def serve(config, worker=None):
        seen.append(("serve", loop_name()))

    async def supervise(config, argv, count):
        seen.append(("supervise", loop_name()))
        return 0

    monkeypatch.setattr("relay.cli.serve", serve)
    monkeypatch.setattr("relay.workers.supervise", supervise)
    return seen


@pytest.mark.parametrize("setting, expected", [pytest.param("uvloop", "uvloop", marks=needs_uvloop),
                                               ("asyncio", "asyncio"),
                                               pytest.param("auto", "uvloop", marks=needs_uvloop)])
def test_run_and_the_supervisor_run_on_the_loop_set(loops_run, setting, expected):
    assert main([*RUN, "--event-loop", setting]) == 0
    assert main([*RUN, "--event-loop", setting, "--workers", "2"]) == 0
    assert loops_run == [("serve", expected), ("supervise", expected)]


@needs_uvloop
def test_run_without_the_setting_runs_on_uvloop_where_installed(loops_run):
    assert main(RUN) == 0
    assert loops_run == [("serve", "uvloop")]
    assert asyncio.get_event_loop_policy().__class__.__module__.startswith("asyncio")  # no global policy set


def test_uvloop_set_but_not_installed_fails_check_config_and_run_naming_the_key_and_the_fix(tmp_path):
    path = tmp_path / "relay.yaml"
    path.write_text(FILE + "event_loop: uvloop\n")
    check = child(NO_UVLOOP + "from relay.cli import main\nsys.exit(main(['check-config', sys.argv[1]]))\n", str(path))
    run = child(NO_UVLOOP + "from relay.cli import main\nsys.exit(main(sys.argv[1:]))\n", *RUN,
                "--event-loop", "uvloop")
    for done in (check, run):
        assert done.returncode == 2, done.stderr
        assert "event_loop: is uvloop, which cannot be imported here" in done.stderr
        assert "fix: pip install uvloop (it has no Windows build: asyncio there), or set event_loop: asyncio" \
            in done.stderr
    assert "Traceback" not in check.stderr + run.stderr


def test_auto_without_uvloop_runs_on_asyncio(tmp_path):
    code = NO_UVLOOP + (
        "import relay.cli\nfrom relay.event_loop import loop_name\n"
        "async def serve(config, worker=None):\n    print('loop', loop_name())\n"
        "relay.cli.serve = serve\n"
        "sys.exit(relay.cli.main(sys.argv[1:]))\n")
    done = child(code, *RUN)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["loop", "asyncio"]
    path = tmp_path / "relay.yaml"
    path.write_text(FILE)
    check = child(NO_UVLOOP + "from relay.cli import main\nsys.exit(main(['check-config', sys.argv[1]]))\n", str(path))
    assert check.returncode == 0, check.stderr


#: ``run`` with the relay and the supervisor's workers replaced (no broker here), then what
#: SIGTERM and SIGINT do in the process once the relay's loop is closed, then a SIGTERM.
SIGNALS_AFTER_RUN = """import os, signal, sys
import relay.app, relay.process, relay.workers
from relay.cli import main

class Relay:
    def __init__(self, config): pass
    def request_stop(self): pass
    async def run(self): pass

async def supervisor_run(self, bind):
    return 0

relay.app.Relay = Relay
relay.process.tune_process = lambda: None
relay.workers.Supervisor.run = supervisor_run
assert main(sys.argv[1:]) == 0
print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGINT) is signal.default_int_handler,
      flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("still running", flush=True)
"""


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["run", "supervisor"])
@pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_sigterm_and_sigint_act_as_before_once_the_relay_has_stopped(loop, workers):
    done = child(SIGNALS_AFTER_RUN, *RUN, "--event-loop", loop, *workers)
    assert done.stdout.split() == ["True", "True"], done.stderr
    assert done.returncode == -signal.SIGTERM, done.stderr
