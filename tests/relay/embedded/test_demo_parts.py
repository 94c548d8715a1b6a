"""``lineage-relay demo`` where it cannot run: a part it needs is not installed, another demo
uses the directory, or it timed out. One line saying so (and the fix), no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time


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


def test_a_second_demo_in_the_same_directory_refuses_at_once_and_leaves_the_first_alone(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONUNBUFFERED": "1"}
    code = "import sys; from relay.cli import main; sys.exit(main(['demo', '--no-spark', '--runs', '30']))"
    first = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = []
        while not any(line.startswith("relay     :") for line in lines):  # the first demo is under way
            line = first.stdout.readline()
            assert line, f"the first demo ended early: {lines} {first.stderr.read()}"
            lines.append(line)
        started = time.monotonic()
        second = demo(tmp_path, "--no-spark", "--runs", "3")
        assert time.monotonic() - started < 20, "refused at once, not after a run"
        assert second.returncode == 2, second
        assert "Traceback" not in second.stderr
        output = (tmp_path / "demo-output").resolve()
        assert second.stderr.strip() == (f"lineage-relay demo: another demo (pid {first.pid}) is running in {output}; "
                                         "wait for it to end, or run the demo from another directory")
        assert second.stdout == ""
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, (out, err)
    assert "check: every one of the" in out


def test_a_demo_that_times_out_says_so_in_one_line(tmp_path):
    result = demo(tmp_path, "--no-spark", prelude=(
        "import relay.embedded.demo as d; "
        "d.run_demo = lambda **kw: (_ for _ in ()).throw(TimeoutError("
        "'demo: timed out waiting for the relay to settle every event')); "))
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "lineage-relay demo: timed out waiting for the relay to settle every event"
