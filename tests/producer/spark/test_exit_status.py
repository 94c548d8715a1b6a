"""How a driver process ends decides how its application run ends: an exit status that is not
0 is a failure (schedulers read it so), whether the script ends with ``sys.exit(2)``,
``raise SystemExit(2)`` or ``exit("message")``; the exit status itself is never changed.
Seen from outside: a whole driver process per case.

Python 3.11 has no way to see a ``raise SystemExit`` written out short of tracing the job's
every instruction (see :mod:`producer.spark.driver_exit`): there only ``sys.exit`` counts."""

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
""")


def _run(tmp_path: Path, ending: str) -> tuple[int, list]:
    """Run the job with ``ending`` as the last lines of its script."""
    script = tmp_path / "job.py"
    script.write_text(JOB + textwrap.dedent(ending))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("EVENTS ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1][len("EVENTS "):])


@pytest.mark.parametrize("ending, code, result", [
    ("sys.exit(2)", 2, ["FAIL", "SystemExit: 2"]),
    ("sys.exit('bad input')", 1, ["FAIL", "SystemExit: bad input"]),
    ("sys.exit(0)", 0, ["COMPLETE", None]),
    ("sys.exit(None)", 0, ["COMPLETE", None]),
    ("raise SystemExit(0)", 0, ["COMPLETE", None]),
])
def test_a_non_zero_exit_ends_the_application_run_in_fail_and_keeps_its_status(tmp_path, ending, code, result):
    returncode, events = _run(tmp_path, ending)
    assert returncode == code
    assert events == [["START", None], result]


NEEDS_MONITORING = pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.11 cannot see a SystemExit "
                                      "that does not go through sys.exit (no sys.monitoring)")


@NEEDS_MONITORING
@pytest.mark.parametrize("ending, code, result", [
    ("raise SystemExit(2)", 2, ["FAIL", "SystemExit: 2"]),
    ("raise SystemExit('bad input')", 1, ["FAIL", "SystemExit: bad input"]),
    ("""
     def main():
         exit(3)  # site's exit(): raise SystemExit(3), from a function
     main()
     """, 3, ["FAIL", "SystemExit: 3"]),
])
def test_a_system_exit_raised_any_way_ends_the_application_run_in_fail(tmp_path, ending, code, result):
    returncode, events = _run(tmp_path, ending)
    assert returncode == code
    assert events == [["START", None], result]


@NEEDS_MONITORING
def test_a_system_exit_the_job_catches_is_no_failure(tmp_path):
    returncode, events = _run(tmp_path, """
        try:
            sys.exit(2)
        except SystemExit:
            pass  # the job goes on, and ends well
        """)
    assert returncode == 0
    assert events == [["START", None], ["COMPLETE", None]]
