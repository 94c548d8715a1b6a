"""How ``run`` ends on an error, once logging is set up: one JSON log line (``config_error``
exit 2, ``relay_failed`` exit 1, with ``error`` and ``exit_code``), never a plain-text line
amid the JSON ones (README: logs are one JSON object per line on stderr). Before logging is
set up (a flag or the file refused), the plain ``lineage-relay: ...`` line is all there is."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

import relay.cli
from relay.cli import main
from relay.errors import ConfigError
from relay.source.kafka import SourceError
from relay.stages.decode_worker import package_env
from relay.state.changelog import StateError

RUN = ["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a=http://127.0.0.1:1", "--event-loop", "asyncio"]
SEVERAL = ConfigError("invalid configuration:\n  collectors.a.token_file: no such file\n  collectors.a.tls.ca_bundle: "
                      "no such file")


def json_lines(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines()]  # every line is JSON, or this raises


@pytest.mark.parametrize(("error", "event", "code"), [
    (ConfigError("http.port: cannot listen there (address already in use); stop it, give another port, or 0"),
     "config_error", 2),
    (SEVERAL, "config_error", 2),
    (StateError("kafka.state_topic: missing; create it"), "config_error", 2),
    (SourceError("fatal error: fenced by another consumer with the same group.instance.id"), "relay_failed", 1),
])
def test_a_failure_after_logging_is_set_up_is_one_json_line(monkeypatch, capsys, error, event, code):
    async def failing(_config):
        raise error

    monkeypatch.setattr(relay.cli, "serve", failing)
    assert main(RUN) == code
    err = capsys.readouterr().err
    lines = json_lines(err)
    assert "lineage-relay: " not in err
    [failed] = [line for line in lines if line["level"] == "error"]
    assert failed["event"] == event and failed["error"] == str(error) and failed["exit_code"] == code


def test_a_configuration_error_found_by_the_supervisor_is_one_json_line(monkeypatch, capsys):
    def check_files(_config):
        raise SEVERAL

    monkeypatch.setattr(relay.cli, "check_files", check_files)
    assert main([*RUN, "--workers", "2"]) == 2
    err = capsys.readouterr().err
    [failed] = [line for line in json_lines(err) if line["level"] == "error"]
    assert failed["event"] == "config_error" and failed["error"] == str(SEVERAL) and failed["exit_code"] == 2
    assert "lineage-relay: " not in err


def test_an_error_before_logging_is_set_up_stays_a_plain_line(capsys):
    assert main(["run", "--bootstrap-servers", "127.0.0.1:1", "--collector", "a"]) == 2
    assert capsys.readouterr().err.startswith("lineage-relay: --collector: expected NAME=URL")


def test_a_port_taken_is_one_json_line_and_exit_2():
    """The reviewer's case, end to end: the endpoint's port is another process's."""
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        done = subprocess.run([sys.executable, "-m", "relay", *RUN, "--http-port", str(busy.getsockname()[1])],
                              capture_output=True, text=True, timeout=60, env=package_env(),
                              stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    [failed] = [line for line in json_lines(done.stderr) if line["level"] == "error"]
    assert failed["event"] == "config_error" and failed["exit_code"] == 2
    assert failed["error"].startswith("http.port: cannot listen there") and "0 for any free one" in failed["error"]
