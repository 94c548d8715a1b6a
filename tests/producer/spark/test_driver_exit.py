"""How the driver ends, as :class:`producer.spark.driver_exit.DriverExit` sees it, on
Python 3.12+ (``sys.monitoring``), in a child interpreter without Spark: the project's
own interpreter may be 3.11, where the Spark tests (test_exit_status.py) cover the
``sys.exit`` wrapper. Skipped where no Python 3.12+ is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import producer.spark.driver_exit as driver_exit

HARNESS = f"""
import atexit, importlib.util
spec = importlib.util.spec_from_file_location("driver_exit", {str(Path(driver_exit.__file__))!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
watcher = module.DriverExit()
watcher.watch()
atexit.register(lambda: print("FAILURE:", repr(watcher.failure), "MONITORING:", watcher._tool is not None, flush=True))
"""


def newer_python() -> str | None:
    candidates = [shutil.which(f"python3.{minor}") for minor in (13, 12)]
    candidates += sorted(str(p) for p in Path(os.path.expanduser("~/.pyenv/versions")).glob("3.1[2-9]*/bin/python3"))
    for path in candidates:
        if path and subprocess.run([path, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                                   capture_output=True, timeout=30).returncode == 0:
            return path
    return None


PYTHON = newer_python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no Python 3.12+ on this machine")


def ending(tmp_path, body: str) -> tuple[int, str]:
    script = tmp_path / "job.py"
    script.write_text(HARNESS + textwrap.dedent(body))
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return done.returncode, done.stdout.strip()


@pytest.mark.parametrize("body, code, failure", [
    ("raise SystemExit(2)", 2, "SystemExit(2)"),
    ("raise SystemExit('bad input')", 1, "SystemExit('bad input')"),
    ("import sys\nsys.exit(2)", 2, "SystemExit(2)"),
    ("def main():\n    exit(3)\nmain()", 3, "SystemExit(3)"),
    ("raise SystemExit(0)", 0, "None"),
    ("import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass", 0, "None"),   # caught: the job goes on
])
def test_a_script_that_ends_with_a_failing_status_is_a_failure_however_it_exits(tmp_path, body, code, failure):
    returncode, out = ending(tmp_path, body)
    assert returncode == code
    assert out == f"FAILURE: {failure} MONITORING: True"


def test_at_an_interactive_prompt_sys_exit_is_seen_by_the_wrapper(tmp_path):
    """python -i / the pyspark shell: the prompt's statements are no main module's code."""
    prompt = HARNESS.strip() + "\nimport sys\nsys.exit(2)\n"
    done = subprocess.run([PYTHON, "-i", "-q"], input=prompt, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2
    last = done.stdout.replace(">>> ", "").strip().splitlines()[-1]  # the prompt echoes values before it
    assert last == "FAILURE: SystemExit(2) MONITORING: False"
