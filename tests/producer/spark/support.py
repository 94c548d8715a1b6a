"""Helpers for the PySpark capture tests: a recording sender and a listener-bus drain."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Recorder:
    """Anything with ``emit(dict)`` works as the capture's sender; this one keeps the events
    and can forward them to a real producer as well."""

    def __init__(self, forward: Any = None) -> None:
        self.events: list[dict] = []
        self.config = getattr(forward, "config", None)
        self._forward = forward
        self._lock = threading.Lock()

    def emit(self, event: dict) -> None:
        with self._lock:
            self.events.append(event)
        if self._forward is not None:
            self._forward.emit(event)

    def runs(self) -> dict[str, list[dict]]:
        by_run: dict[str, list[dict]] = {}
        for e in self.events:
            by_run.setdefault(e["run"]["runId"], []).append(e)
        return by_run


def drain(spark: Any, timeout_s: float = 60.0) -> None:
    """Wait until Spark's listener bus has delivered every queued event (so every action's
    lineage callback has run). Raises if that does not happen within ``timeout_s``."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))


def application_start(spark: Any) -> tuple[Any, dict]:
    """The capture ``enable_lineage`` returns for ``spark`` and the application's START event
    as it sends it (through its facet filter); capture is switched off again before returning."""
    from producer.spark import disable_lineage, enable_lineage

    sender = Recorder()
    lineage = enable_lineage(spark, producer=sender)
    try:
        [start] = sender.events
        return lineage, start
    finally:
        disable_lineage(spark)


@contextmanager
def streaming_capture(spark: Any, **options: Any) -> Iterator[tuple[Recorder, Any]]:
    """Capture on ``spark`` (namespace and application ``st``) into a Recorder; off on leaving."""
    from producer.spark import disable_lineage, enable_lineage

    recorder = Recorder()
    lineage = enable_lineage(spark, producer=recorder, namespace="st", app_name="st", **options)
    try:
        yield recorder, lineage
    finally:
        disable_lineage(spark)


def json_files(directory: Path, count: int) -> Path:
    """``count`` one-row JSON files (``id``, ``v``) in a new ``directory``: a stream's source."""
    directory.mkdir(parents=True)
    for i in range(count):
        (directory / f"part-{i}.json").write_text(f'{{"id": {i}, "v": "x{i}"}}\n')
    return directory


def validated_capture(spark: Any, action: Callable[[], Any], **options: Any) -> Recorder:
    """``action()`` run with capture on into a Recorder (``enable_lineage(**options)``), the
    listener bus drained before capture goes off; every event checked against the spec."""
    from producer.spark import disable_lineage, enable_lineage
    from tests.support.spec import validator

    recorder = Recorder()
    enable_lineage(spark, producer=recorder, **options)
    try:
        action()
        drain(spark)
    finally:
        disable_lineage(spark)
    checker = validator()
    for event in recorder.events:
        checker.validate(event)
    return recorder


def completes_by_output(recorder: Recorder) -> dict[str, dict]:
    """Each COMPLETE event with an output, by the last path segment of its first output's name."""
    return {event["outputs"][0]["name"].rsplit("/", 1)[-1]: event for event in recorder.events
            if event["eventType"] == "COMPLETE" and event["outputs"]}
