"""deploy/Dockerfile and examples/spark/Dockerfile say what deploy/README.md promises,
and the image's HEALTHCHECK command really tells a healthy relay from a stuck one (run
here against the relay's own HTTP endpoint)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import tomllib
from types import SimpleNamespace

import pytest

from relay.metrics import RelayMetrics
from relay.server import start_server
from tests.deploy.deployfiles import (
    DOCKERFILE,
    ROOT,
    SPARK_DEFAULTS,
    SPARK_DOCKERFILE,
    copy_sources,
    dockerignore_patterns,
    dockerignored,
    env_of,
    expand_args,
    parse_dockerfile,
)

ARGS, STAGES = parse_dockerfile(DOCKERFILE)
FINAL = STAGES[-1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|python3?-dev|libc6?-dev|pip3? install"
                         r"|apt-get install)\b")


def test_multi_stage_onto_python_311_slim():
    assert len(STAGES) >= 2
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?(@sha256:[0-9a-f]{64})?", FINAL.base), FINAL.base
    builder = STAGES[0]
    # The virtualenv's interpreter is a symlink into the base image: same base both sides.
    assert builder.base == FINAL.base
    copied = [ins for ins in FINAL.all("COPY") if ins.flags.get("from") == builder.name]
    assert len(copied) == 1, "the final stage takes only the virtualenv from the builder"


def test_final_stage_installs_nothing():
    for ins in FINAL.all("RUN"):
        assert not BUILD_TOOLS.search(ins.value), f"line {ins.line}: {ins.value}"
    assert not copy_sources(FINAL), "no source tree in the final image"


def test_runs_as_uid_10001():
    user = FINAL.last("USER").value
    assert user.split(":")[0] == "10001", "numeric, so Kubernetes' runAsNonRoot can check it"
    assert any("10001" in ins.value and "useradd" in ins.value for ins in FINAL.all("RUN"))


def test_entrypoint_cmd_expose_env():
    assert FINAL.last("ENTRYPOINT").exec_form() == ["lineage-relay"]
    assert FINAL.last("CMD").exec_form() == ["run", "--config", "/etc/lineage-relay/relay.yaml"]
    assert FINAL.last("EXPOSE").value.split() == ["9108"]
    env = env_of(FINAL)
    assert env["PYTHONUNBUFFERED"] == "1"
    # The entrypoint is the console script pyproject declares, installed into the venv on PATH:
    # the thin one that handles SIGTERM before its imports (the relay is PID 1: a signal without
    # a handler would be dropped; tests/relay/test_entrypoint.py).
    assert PYPROJECT["project"]["scripts"]["lineage-relay"] == "relay.entrypoint:main"
    venv = next(ins.value.split()[-1] for ins in FINAL.all("COPY") if "from" in ins.flags)
    assert env["PATH"].split(":")[0] == f"{venv}/bin"


def test_builder_copies_everything_pip_install_reads():
    sources = {s.rstrip("/") for s in copy_sources(STAGES[0])}
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= sources
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.rstrip("*")
        assert any(s == top for s in sources), f"package {pattern} is not copied into the builder"


def _runtime_closure() -> set[str]:
    """The distributions ``pip install lineage-relay`` installs (names, normalised), read
    from the test environment's metadata: pyproject's dependencies and theirs."""
    from importlib import metadata

    from packaging.markers import Marker
    from packaging.requirements import Requirement

    names, todo = set(), [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in names or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        names.add(name)
        for sub in metadata.distribution(req.name).requires or []:
            sub_req = Requirement(sub)
            if sub_req.marker is None or Marker(str(sub_req.marker)).evaluate({"extra": ""}):
                todo.append(sub_req)
    return names


def test_runtime_dependencies_are_installed_at_pinned_versions():
    # pip resolved pyproject's ranges afresh at every build: two builds of one commit could
    # ship different aiohttp, pydantic, confluent-kafka (librdkafka) than the tests ran with.
    from packaging.requirements import Requirement

    builder = STAGES[0]
    copied = {ins.value.split()[-1]: ins.value.split()[-2] for ins in builder.all("COPY")}
    constraints_src = next((src for src in copied.values() if src.endswith("constraints.txt")), None)
    assert constraints_src is not None, "the builder copies the constraints file"
    install = next(ins.value for ins in builder.all("RUN") if " install " in ins.value)
    assert re.search(r"(--constraint|-c)\s+\S*constraints\.txt", install), install
    pins = _exact_pins(ROOT / constraints_src)
    assert _runtime_closure() - set(pins) == set(), "pin every runtime dependency in deploy/constraints.txt"
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        version = pins[re.sub(r"[-_.]+", "-", req.name).lower()]
        assert req.specifier.contains(version), f"{req.name}=={version} is outside pyproject's {req.specifier}"


def test_build_backend_is_pinned():
    """pip built the wheel in an isolated environment with the newest setuptools and wheel
    in pyproject's ranges: two builds of one commit could differ. The builder installs exact
    versions and builds with them."""
    from packaging.requirements import Requirement

    builder = STAGES[0]
    copied = {ins.value.split()[-1]: ins.value.split()[-2] for ins in builder.all("COPY")}
    source = next((src for src in copied.values() if src.endswith("build-requirements.txt")), None)
    assert source is not None, "the builder copies deploy/build-requirements.txt"
    run = next(ins.value for ins in builder.all("RUN") if " wheel " in ins.value)
    assert re.search(r"pip install --no-deps (--requirement|-r) \S*build-requirements\.txt", run), run
    build = re.search(r"pip wheel [^&]*", run).group(0)
    assert "--no-build-isolation" in build, "else pip ignores the installed backend"
    assert "--check-build-dependencies" in build, "pip checks the pins against [build-system]"
    pins = _exact_pins(ROOT / source)
    for dep in PYPROJECT["build-system"]["requires"]:
        req = Requirement(dep)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"pin {req.name} in {source}"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} is outside pyproject's {req.specifier}"


def test_base_image_can_be_pinned_by_digest():
    """Both stages take the base from one build argument, so that
    `--build-arg PYTHON_IMAGE=python:3.11-slim@sha256:...` (deploy/README.md) pins both."""
    digest = "python:3.11-slim@sha256:" + "0" * 64
    raw_bases = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")]
    assert raw_bases == ["${PYTHON_IMAGE}"] * len(STAGES), raw_bases
    assert "PYTHON_IMAGE" in ARGS
    assert "--build-arg PYTHON_IMAGE=python:3.11-slim@sha256:" in (ROOT / "deploy" / "README.md").read_text()
    assert all(expand_args(base, {"PYTHON_IMAGE": digest}) == digest for base in raw_bases)


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, SPARK_DOCKERFILE], ids=["relay", "spark-example"])
def test_copied_files_exist_and_are_not_dockerignored(dockerfile):
    patterns = dockerignore_patterns(ROOT / ".dockerignore")
    for stage in parse_dockerfile(dockerfile)[1]:
        for source in copy_sources(stage):
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: not in the repository"
            assert not dockerignored(source, patterns), f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"


def test_dockerignore_keeps_heavy_and_private_files_out():
    patterns = dockerignore_patterns(ROOT / ".dockerignore")
    for path in (".git/config", ".venv/bin/python", "relay/__pycache__/app.cpython-311.pyc", "tests/conftest.py"):
        assert dockerignored(path, patterns), path
    assert not dockerignored("relay/app.py", patterns)


# -- the HEALTHCHECK, run for real ------------------------------------------------------

def _healthcheck_command() -> list[str]:
    ins = FINAL.last("HEALTHCHECK")
    assert ins is not None
    command = ins.value.split("CMD", 1)[1].strip()
    argv = json.loads(command)
    assert argv[0] == "python" and "urllib" in argv[-1], "slim images have no curl: Python's urllib checks"
    return [sys.executable, *argv[1:]]


def _healthcheck_flags() -> dict[str, str]:
    return FINAL.last("HEALTHCHECK").flags


def test_healthcheck_defaults_to_healthz_on_the_exposed_port():
    url = env_of(FINAL)["HEALTHCHECK_URL"]
    assert url == f"http://127.0.0.1:{FINAL.last('EXPOSE').value.split()[0]}/healthz"
    flags = _healthcheck_flags()
    assert float(flags["timeout"].rstrip("s")) > 4, "longer than urlopen's own timeout"


def _stub_relay(*, started: bool, heartbeat_age_s: float) -> SimpleNamespace:
    """What relay.server reads from a Relay."""
    return SimpleNamespace(started=started, stopping=False, heartbeat=time.monotonic() - heartbeat_age_s,
                           source=SimpleNamespace(paused=False, assignment=set()), lanes=[], metrics=RelayMetrics())


async def _run_healthcheck(url: str) -> int:
    env = {**os.environ, "HEALTHCHECK_URL": url}
    proc = await asyncio.create_subprocess_exec(*_healthcheck_command(), env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await asyncio.wait_for(proc.wait(), timeout=30)


@pytest.mark.parametrize("started, age, healthy", [(True, 0.0, True), (False, 0.0, True), (True, 3600.0, False)],
                         ids=["running", "starting", "stuck"])
async def test_healthcheck_passes_only_while_the_event_loop_turns(started, age, healthy):
    runner, port = await start_server(_stub_relay(started=started, heartbeat_age_s=age), "127.0.0.1", 0)
    try:
        code = await _run_healthcheck(f"http://127.0.0.1:{port}/healthz")
    finally:
        await runner.cleanup()
    assert (code == 0) is healthy


async def test_healthcheck_fails_when_nothing_listens():
    runner, port = await start_server(_stub_relay(started=True, heartbeat_age_s=0), "127.0.0.1", 0)
    await runner.cleanup()
    assert await _run_healthcheck(f"http://127.0.0.1:{port}/healthz") != 0


# -- the Spark example image ------------------------------------------------------------

def test_spark_example_image():
    _, stages = parse_dockerfile(SPARK_DOCKERFILE)
    (stage,) = stages
    assert stage.base.startswith("python:3.11")
    runs = " ".join(ins.value for ins in stage.all("RUN"))
    assert re.search(r"openjdk-(17|21)-jre-headless", runs), "PySpark needs a JRE"
    assert re.search(r"pip install \"?/src\[spark\]", runs)
    env = env_of(stage)
    copies = {ins.value.split()[0]: ins.value.split()[-1] for ins in stage.all("COPY")}
    conf_dest = copies[str(SPARK_DEFAULTS.relative_to(ROOT))]
    assert conf_dest == f"{env['SPARK_CONF_DIR']}/spark-defaults.conf", "spark-submit reads SPARK_CONF_DIR"
    cmd = stage.last("CMD").exec_form()
    assert cmd[0] == "spark-submit" and cmd[-1] == copies["examples/spark/lineage_example.py"]
    assert stage.last("USER").value.split(":")[0].isdigit() and stage.last("USER").value != "0"


def _exact_pins(path) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalised name (each must be exact)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[re.sub(r"[-_.]+", "-", req.name).lower()] = spec.version
    return pins
