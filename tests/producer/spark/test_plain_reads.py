"""An action's facts read call by call (producer.spark.plain_reads)."""

from __future__ import annotations

import pytest

from producer.spark import plain_reads

pytestmark = pytest.mark.spark


def test_write_metrics_and_the_start_time_come_from_one_call_each(spark, tmp_path, monkeypatch):
    """Metrics and the analysis phase's start are parsed from one ``mkString`` each; the
    per-item fallback (four round trips per metric) is for a Spark whose text differs,
    and must not be what runs here."""
    import time

    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain

    slow: list[str] = []
    for name in ("_metrics_one_by_one", "_analysis_start_asked"):
        real = getattr(plain_reads, name)
        monkeypatch.setattr(plain_reads, name, lambda *a, _real=real, _name=name: slow.append(_name) or _real(*a))
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="calls", app_name="calls")
    try:
        before = time.time()
        spark.range(1000).selectExpr("id", "id % 7 AS k").write.mode("overwrite").parquet(str(tmp_path / "out"))
        drain(spark)
    finally:
        disable_lineage(spark)
    start, done = [[e for e in recorder.events if e["eventType"] == kind and e["job"]["name"] != "calls"]
                   for kind in ("START", "COMPLETE")]
    assert slow == []
    stats = done[0]["outputs"][0]["outputFacets"]["outputStatistics"]
    assert stats["rowCount"] == 1000 and stats["size"] > 0 and stats["fileCount"] >= 1
    from datetime import datetime

    started = datetime.fromisoformat(start[0]["eventTime"].replace("Z", "+00:00")).timestamp()
    assert before - 1 <= started <= datetime.fromisoformat(done[0]["eventTime"].replace("Z", "+00:00")).timestamp()
