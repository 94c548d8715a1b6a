"""How a driver process ends decides how its application run ends: ``sys.exit(n)`` with a
non-zero status is a failure (schedulers read it so), ``sys.exit(0)`` a success; the exit
status itself is never changed. Seen from outside: a whole driver process per case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[3]

JOB = textwrap.dedent("""
    import atexit, json, sys
    from pyspark.sql import SparkSession
    from producer.spark import enable_lineage
    from tests.producer.spark.support import Recorder

    recorder = Recorder()
    # registered first, so it runs after the capture's own exit handler
    atexit.register(lambda: print("EVENTS " + json.dumps(
        [[e["eventType"], e["run"]["facets"].get("errorMessage", {}).get("message")]
         for e in recorder.events if e["job"]["name"] == "exit_job"]), flush=True))
    spark = (SparkSession.builder.master("local[1]").appName("exit_job").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")
    enable_lineage(spark, producer=recorder)
    spark.range(3).count()
    sys.exit(eval(sys.argv[1]))
""")


def _run(tmp_path: Path, status: str) -> tuple[int, list]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.run([sys.executable, str(script), status], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("EVENTS ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1][len("EVENTS "):])


@pytest.mark.parametrize("status, code, ending", [
    ("2", 2, ["FAIL", "SystemExit: 2"]),
    ("'bad input'", 1, ["FAIL", "SystemExit: bad input"]),
    ("0", 0, ["COMPLETE", None]),
    ("None", 0, ["COMPLETE", None]),
])
def test_a_non_zero_exit_ends_the_application_run_in_fail_and_keeps_its_status(tmp_path, status, code, ending):
    returncode, events = _run(tmp_path, status)
    assert returncode == code
    assert events == [["START", None], ending]
