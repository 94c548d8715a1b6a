"""``lineage-relay demo`` where a part it needs is not installed: one line naming the part
and the install command, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys


def demo(tmp_path, *args: str, prelude: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    code = f"import sys; {prelude}from relay.cli import main; sys.exit(main(['demo', *sys.argv[1:]]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, **(env or {}), "PYTHONPATH": os.getcwd()})


def test_without_pyspark_the_spark_demo_names_the_extra_and_the_no_spark_way(tmp_path):
    result = demo(tmp_path, prelude="sys.modules['pyspark'] = None; ")  # as if not installed
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "pip install 'lineage-relay[spark]'" in result.stderr and "demo --no-spark" in result.stderr
    assert not (tmp_path / "demo-output").exists(), "nothing is started before the check"


def test_without_the_broker_binary_the_demo_says_so_in_one_line(tmp_path):
    missing = tmp_path / "no-tansu"
    result = demo(tmp_path, "--no-spark", env={"LINEAGE_RELAY_TANSU_BIN": str(missing)})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == f"lineage-relay demo: no executable Tansu broker at {missing}"
