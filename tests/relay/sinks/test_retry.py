from datetime import datetime, timezone

import pytest

from relay.sinks.retry import Verdict, backoff, classify, retry_after


@pytest.mark.parametrize("status,verdict", [
    (200, Verdict.SUCCESS), (201, Verdict.SUCCESS), (204, Verdict.SUCCESS),
    (None, Verdict.RETRY), (408, Verdict.RETRY), (429, Verdict.RETRY), (500, Verdict.RETRY),
    (502, Verdict.RETRY), (503, Verdict.RETRY),
    (400, Verdict.REJECT), (401, Verdict.REJECT), (404, Verdict.REJECT), (413, Verdict.REJECT),
    (422, Verdict.REJECT),
])
def test_classify(status, verdict):
    assert classify(status) is verdict


def test_retry_after_both_forms():
    now = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert retry_after("2", now) == 2.0
    assert retry_after("Mon, 01 Jan 2024 12:00:30 GMT", now) == 30.0
    assert retry_after("Mon, 01 Jan 2024 11:00:00 GMT", now) == 0.0
    assert retry_after("soon", now) is None
    assert retry_after(None, now) is None
    assert retry_after("999999", now) == 3600.0
    # Digits str.isdigit() takes and float() does not: unparsable, not an error.
    assert retry_after("\u00b2", now) is None and retry_after("\u0663", now) is None


def test_full_jitter_backoff_is_capped_and_grows():
    assert backoff(1, initial_s=0.5, cap_s=10, rand=lambda: 1.0) == 0.5
    assert backoff(3, initial_s=0.5, cap_s=10, rand=lambda: 1.0) == 2.0
    assert backoff(30, initial_s=0.5, cap_s=10, rand=lambda: 1.0) == 10
    assert backoff(5, initial_s=0.5, cap_s=10, rand=lambda: 0.0) == 0.0
