"""Shared fixtures: one real Kafka-protocol broker and one PySpark session per test run.

Required parts (the broker binary, Java, PySpark) are never skipped: a missing one makes
the fixture raise, so every test that needs it errors and the run fails.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from relay import event_loop  # noqa: E402
from tests.support.kafka import KafkaHandle, start_kafka  # noqa: E402
from tests.support.relay import EACH_LOOP_FACTORIES, TEST_EVENT_LOOP  # noqa: E402
from tests.support.watchdog import HardTimeout  # noqa: E402

_HARD_TIMEOUT = pytest.StashKey[HardTimeout]()


@pytest.fixture(autouse=True)
def _root_logger_restored():
    """The CLI's ``setup_logging`` (tests run ``lineage-relay ...`` in-process) makes the root
    logger write to the ``sys.stderr`` of the moment, a capture that pytest closes when the
    test ends: every later record of the worker's run then failed to print ("Logging error",
    "I/O operation on closed file") and was lost to the tests after it. Each test gets the
    root logger back as it found it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture(scope="session")
def kafka() -> KafkaHandle:
    handle, close = start_kafka()
    try:
        yield handle
    finally:
        close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] SparkSession for the whole run (starting one costs ~10 s)."""
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")

    session = (
        SparkSession.builder.master("local[2]")
        .appName("lineage-relay-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """The shared PySpark session is one per process: under pytest-xdist (``./dev test``) every
    test that uses it goes to one worker (``--dist loadgroup``), so a run starts one session."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` pytest-xdist groups tests by a suffix it writes into their
    node ids; where it cannot (pytest 9.2 with xdist 3.8), every worker would start a Spark
    session of its own: say so rather than run that way."""
    if not session.config.getoption("loadgroup", default=False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") is not None:
            if not item.nodeid.endswith("@spark"):
                raise pytest.UsageError(
                    f"pytest-xdist did not group {item.nodeid} (pytest {pytest.__version__}): every worker would "
                    "start a Spark session of its own; install the test extra's pytest (pip install -e '.[test]')")
            return


_SUITE_ON_UVLOOP = TEST_EVENT_LOOP is not None and event_loop.resolve(TEST_EVENT_LOOP) == "uvloop"


def pytest_asyncio_loop_factories(config, item):
    """The loops an async test runs on (pytest-asyncio >= 1.4). Marked ``ON_EACH_LOOP`` (tests/support/relay.py):
    asyncio's and uvloop's (uvloop's skipped where it is not installed). Otherwise one:
    uvloop when ``LINEAGE_RELAY_TEST_EVENT_LOOP`` names it (see tests/support/relay.py), as
    the relays the suite starts then run on, else asyncio's. (Never None: pytest-asyncio
    refuses a hook that answers None.)"""
    marker = item.get_closest_marker("asyncio")
    if marker is not None and marker.kwargs.get("loop_factories"):
        return EACH_LOOP_FACTORIES
    if _SUITE_ON_UVLOOP:
        return {"uvloop": EACH_LOOP_FACTORIES["uvloop"]}
    return {"asyncio": EACH_LOOP_FACTORIES["asyncio"]}


@pytest.fixture
def tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_configure(config):
    if float(config.getini("faulthandler_timeout") or 0) > 0:
        # pytest's faulthandler plugin would replace the hard limit's timer with one that
        # dumps and lets the hang go on (faulthandler has one timer).
        raise pytest.UsageError("faulthandler_timeout replaces the suite's hard per-test limit "
                                "(tests/support/watchdog.py): set LINEAGE_RELAY_TEST_HARD_TIMEOUT=<seconds> instead")
    watchdog = HardTimeout.from_real_stderr()
    watchdog.guard_forks()
    watchdog.dump_on(signal.SIGUSR2)
    config.stash[_HARD_TIMEOUT] = watchdog


def pytest_unconfigure(config):
    """The process's exit (atexit handlers, threads joined) gets the same hard limit: a
    thread a test left blocked must not keep the worker, or the run, from ending."""
    watchdog = config.stash.get(_HARD_TIMEOUT, None)
    if watchdog is not None:
        watchdog.arm_for_exit()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's setup, call and teardown (the session fixtures' teardown with the last) run
    under a hard limit past pytest-timeout's (tests/support/watchdog.py): a hang after
    pytest-timeout fired ends the worker with every thread's stack instead of the CI run."""
    watchdog = item.config.stash[_HARD_TIMEOUT]
    debugging = item.config.getvalue("usepdb") or _debugger_attached()
    limit = None if debugging else HardTimeout.limit_for(_pytest_timeout(item))
    if limit is not None:
        watchdog.arm(limit)
    try:
        return (yield)
    finally:
        if limit is not None:
            watchdog.disarm()


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin cancelled the timer
def pytest_exception_interact(node, call, report):
    watchdog = node.config.stash.get(_HARD_TIMEOUT, None)
    if watchdog is not None and not node.config.getvalue("usepdb"):
        watchdog.rearm()


def pytest_enter_pdb(config, pdb):
    """A breakpoint: the rest of the test is a person's, without a limit."""
    watchdog = config.stash.get(_HARD_TIMEOUT, None)
    if watchdog is not None:
        watchdog.disarm()


def _debugger_attached() -> bool:
    """As pytest-timeout judges it (it times nothing then): an IDE's debugger or a trace function."""
    try:
        from pytest_timeout import is_debugging
    except ImportError:
        return sys.gettrace() is not None
    return bool(is_debugging())


def _pytest_timeout(item) -> float | None:
    """The test's pytest-timeout, as that plugin reads it: marker, then ``--timeout``, then
    ``PYTEST_TIMEOUT``, then the ini."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        value = marker.args[0] if marker.args else marker.kwargs["timeout"]
    else:
        value = item.config.getoption("timeout", None)
        if value is None:
            value = os.environ.get("PYTEST_TIMEOUT") or None
        if value is None:
            try:
                value = item.config.getini("timeout")
            except ValueError:  # pytest-timeout not loaded (-p no:timeout)
                return None
    return float(value) if value not in (None, "") else None
