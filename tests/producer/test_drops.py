"""Every dropped event is counted and logged with its reason (rate-limited), no broker needed."""

from __future__ import annotations

import logging

from producer import LineageProducer, events
from producer.sender import _should_log


def test_an_emit_after_close_is_counted_and_logged(tmp_path, caplog):
    producer = LineageProducer(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path)
    producer.close(0)
    caplog.set_level(logging.ERROR, "producer.kafka")
    producer.emit(events.run_event("START", run_id=events.new_run_id(), job_namespace="ns", job_name="j"))
    assert producer.stats.dropped == {"closed": 1}
    assert any("event=dropped reason=closed" in r.getMessage() for r in caplog.records)


def test_drop_logging_is_rate_limited_also_for_many_at_once():
    assert [c for c in range(1, 2001) if _should_log(c)] == [*range(1, 11), 1000, 2000]
    # lost_in_fatal_producer drops many at once: logged when the run reaches the first ten
    # or crosses a thousand, whatever its size.
    assert _should_log(500, 500) and _should_log(1005, 10) and _should_log(4000, 3000)
    assert not _should_log(990, 5) and not _should_log(1500, 400)
