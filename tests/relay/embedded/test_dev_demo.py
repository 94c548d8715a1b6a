"""``./dev demo`` checks what the demo needs before it starts: the PySpark job needs Java 17
or later (the one PySpark runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH), and
``--no-spark`` needs no Java at all (the broker is a native binary).

The script runs for real, with a PATH of only the tools it uses (no apt-get: nothing is
installed), fake ``java`` binaries, and a fake, already bootstrapped venv whose
``lineage-relay`` reports that it was started."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[3] / "dev"
TOOLS = ("bash", "dirname", "sed", "head", "id")


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_java(home: Path, version: str) -> Path:
    """A ``java`` whose ``-version`` prints what OpenJDK prints, on stderr."""
    return executable(home / "bin" / "java", f'#!/bin/sh\necho \'openjdk version "{version}" 2023-01-17\' >&2\n')


def dev_demo(tmp_path: Path, *args: str, java: str | None = None, java_home: str | None = None):
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in TOOLS:
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool))
    path = [str(tools)]
    if java is not None:
        path.insert(0, str(fake_java(tmp_path / "path-java", java).parent))
    venv = tmp_path / "venv"
    executable(venv / "bin" / "python", "#!/bin/sh\nexit 0\n")
    executable(venv / "bin" / "lineage-relay", '#!/bin/sh\necho "started: $*"\n')
    stamp = venv / ".installed"
    stamp.touch()
    later = time.time() + 3600  # newer than pyproject.toml: no install
    os.utime(stamp, (later, later))
    env = {"PATH": os.pathsep.join(path), "LINEAGE_RELAY_VENV": str(venv), "HOME": str(tmp_path)}
    if java_home is not None:
        env["JAVA_HOME"] = java_home
    return subprocess.run([str(DEV), "demo", *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("version,found", [("11.0.2", "Java 11"), ("1.8.0_392", "Java 8"), (None, "no java on PATH")])
def test_the_spark_demo_refuses_a_java_older_than_17_with_the_fix(tmp_path, version, found):
    done = dev_demo(tmp_path, java=version)
    assert done.returncode == 1, done
    assert "started" not in done.stdout
    assert f"PySpark needs Java 17 or later; found {found}" in done.stderr
    assert "fix: install a JRE/JDK 17+" in done.stderr and "--no-spark' needs no Java" in done.stderr


@pytest.mark.parametrize("version", ["17.0.15", "21", "25-ea"])
def test_the_spark_demo_starts_with_java_17_or_later(tmp_path, version):
    done = dev_demo(tmp_path, "--runs", "3", java=version)
    assert done.returncode == 0, done
    assert done.stdout == "started: demo --runs 3\n"


def test_java_home_is_the_java_pyspark_runs(tmp_path):
    home = fake_java(tmp_path / "jdk21", "21.0.1").parents[1]
    assert dev_demo(tmp_path, java="11.0.2", java_home=str(home)).returncode == 0
    old = fake_java(tmp_path / "jdk11", "11.0.2").parents[1]
    done = dev_demo(tmp_path, java="21.0.1", java_home=str(old))
    assert done.returncode == 1 and f"found Java 11 at {old}/bin/java" in done.stderr, done


@pytest.mark.parametrize("version", [None, "11.0.2"])
def test_the_demo_without_spark_needs_no_java(tmp_path, version):
    done = dev_demo(tmp_path, "--no-spark", java=version)
    assert done.returncode == 0, done
    assert done.stdout == "started: demo --no-spark\n"
