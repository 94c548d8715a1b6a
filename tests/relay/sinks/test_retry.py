from datetime import datetime, timezone

import pytest

from relay.sinks.retry import EventFailures, Verdict, backoff, classify, count_failure, retry_after


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


def failures(answers: list[tuple[int | None, int]], poison_after: int | None = 3) -> list[bool]:
    """Each ``(status, events the collector accepted so far)`` in turn: the verdicts."""
    seen, verdicts = EventFailures(), []
    for status, accepted in answers:
        seen, failed_event = count_failure(seen, status, accepted, poison_after)
        verdicts.append(failed_event)
    return verdicts


def test_a_500_repeated_while_the_collector_accepts_others_is_the_events_own():
    assert failures([(500, 10), (500, 11), (500, 12)]) == [False, False, True]
    seen = EventFailures()
    for status, accepted in [(500, 10), (503, 10), (500, 11), (None, 12), (500, 13)]:
        seen, _ = count_failure(seen, status, accepted, 3)
    assert seen == EventFailures(attempts=5, strikes=3, accepted_at=13)


def test_an_outage_never_makes_a_failed_event_however_long():
    # Nothing accepted between the 500s: the collector is down, not failing on this event.
    assert failures([(500, 7)] * 50) == [False] * 50
    # An outage that began while other requests were under way: those may still be accepted
    # after this event's first 500; that counts once, never enough.
    assert failures([(500, 7), (500, 9)] + [(500, 9)] * 50) == [False] * 52
    # Outage signals other than a bare 500 never count.
    assert failures([(status, n) for n, status in enumerate([502, 503, 504, 408, 429, None] * 5)]) == [False] * 30


def test_an_outage_between_the_events_500s_neither_counts_nor_resets():
    assert failures([(500, 1), (500, 2), (503, 2), (503, 2), (500, 2), (500, 3)]) == [False] * 5 + [True]


def test_poison_after_none_never_gives_up():
    assert failures([(500, n) for n in range(20)], poison_after=None) == [False] * 20
