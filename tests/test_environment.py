"""The parts the suite needs are present: CI must fail, not skip, without them."""

import shutil
import subprocess

import psutil

from relay.embedded.broker import EmbeddedBroker, tansu_binary


def test_tansu_binary_present_and_starts():
    assert tansu_binary().is_file()
    with EmbeddedBroker() as broker:
        assert broker.running
        assert broker.pid is not None and psutil.Process(broker.pid).cmdline()[0] == str(tansu_binary())
    assert broker.pid is None


def test_java_17_or_newer():
    java = shutil.which("java")
    assert java, "Java 17+ is required for PySpark"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=True, timeout=60).stderr
    major = int(out.split('"')[1].split(".")[0])
    assert major >= 17, out


def test_pyspark_importable():
    import pyspark

    assert int(pyspark.__version__.split(".")[0]) >= 3
