from datetime import datetime, timezone

import pytest

from relay.sinks.retry import CollectorRecord, EventFailures, Verdict, backoff, classify, count_failure, retry_after


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


class Collector:
    """A collector's record as requests go out and come back (see CollectorRecord)."""

    def __init__(self) -> None:
        self.sent = self.last_accepted = self.accepted = self.failed = 0

    def send(self) -> int:
        self.sent += 1
        return self.sent

    def accept(self, request: int) -> None:
        self.accepted += 1
        self.last_accepted = max(self.last_accepted, request)

    def fail(self, request: int, status: int | None = 500) -> CollectorRecord:
        self.failed += status == 500
        return CollectorRecord(request, self.last_accepted, self.accepted, self.failed)


def poisoned(collector: Collector, steps: list, poison_after: int | None = 3) -> list[bool]:
    """``steps``: ``("event", status)`` an attempt of the event under test, failed so;
    ``("ok", n)`` n other requests sent and accepted; ``("other500", n)`` n other requests
    answered 500. The verdicts of the event's attempts."""
    seen, verdicts = EventFailures(), []
    for what, arg in steps:
        if what == "event":
            seen, failed_event = count_failure(seen, arg, collector.fail(collector.send(), arg), poison_after)
            verdicts.append(failed_event)
        for _ in range(arg if what != "event" else 0):
            request = collector.send()
            collector.accept(request) if what == "ok" else collector.fail(request)
    return verdicts


def test_a_500_repeated_while_the_collector_accepts_others_is_the_events_own():
    steps = [("event", 500), ("ok", 10), ("event", 500), ("ok", 10), ("event", 500)]
    assert poisoned(Collector(), steps) == [False, False, True]
    # Other outage signals in between neither count nor reset.
    steps = [("event", 500), ("ok", 3), ("event", 503), ("event", None), ("event", 500), ("ok", 3), ("event", 500)]
    assert poisoned(Collector(), steps) == [False] * 4 + [True]


def test_an_outage_never_makes_a_failed_event_however_long():
    # Nothing accepted between the 500s: the collector is down, not failing on this event.
    assert poisoned(Collector(), [("event", 500)] * 50) == [False] * 50
    # An outage that began while other requests were under way: their acceptances arrive
    # after this event's 500s, but they were sent before: they prove nothing.
    collector = Collector()
    early = [collector.send() for _ in range(64)]
    seen, verdicts = EventFailures(), []
    for n in range(50):
        seen, failed_event = count_failure(seen, 500, collector.fail(collector.send()), 3)
        verdicts.append(failed_event)
        collector.accept(early[n])  # one answer to a request sent before the outage
    assert verdicts == [False] * 50 and seen.strikes == 1
    # Outage signals other than a bare 500 never count.
    statuses = [502, 503, 504, 408, 429, None] * 5
    assert poisoned(Collector(), [step for s in statuses for step in (("event", s), ("ok", 1))]) == [False] * 30


def test_a_collector_failing_a_share_of_everything_fails_no_event_in_particular():
    # Half of all requests answered 500: others fail as often as they are accepted.
    steps = [step for _ in range(50) for step in (("event", 500), ("ok", 5), ("other500", 5))]
    assert poisoned(Collector(), steps) == [False] * 50
    # A few other poison events among much accepted traffic still let it count.
    steps = [step for _ in range(3) for step in (("event", 500), ("ok", 40), ("other500", 2))]
    assert poisoned(Collector(), steps) == [False, False, True]


def test_poison_after_none_never_gives_up():
    assert poisoned(Collector(), [("event", 500), ("ok", 3)] * 20, poison_after=None) == [False] * 20


def test_only_2xx_is_success():
    assert classify(299) is Verdict.SUCCESS
    for status in (300, 301, 304, 307, 308, 399):  # a redirect is not followed: the event was not taken
        assert classify(status) is Verdict.REJECT


def test_an_http_date_in_minus_zero_zone_is_read_as_utc():
    now = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert retry_after("Mon, 01 Jan 2024 12:00:30 -0000", now) == 30.0


def test_the_event_is_given_up_at_exactly_poison_after_strikes():
    steps = [("event", 500), ("ok", 10), ("event", 500)]
    assert poisoned(Collector(), steps, poison_after=2) == [False, True]
    assert poisoned(Collector(), steps[:1], poison_after=1) == [True]


def test_the_events_own_500s_before_a_strike_do_not_excuse_others_500s_after_it():
    # Records as count_failure gets them: CollectorRecord(request, last_accepted, accepted, failed).
    seen, _ = count_failure(EventFailures(), 500, CollectorRecord(1, 0, 0, 1), 3)  # strike 1
    seen, _ = count_failure(seen, 500, CollectorRecord(2, 0, 0, 2), 3)  # nothing accepted since: own 500
    seen, _ = count_failure(seen, 500, CollectorRecord(13, 12, 10, 3), 3)  # 10 accepted: strike 2
    assert (seen.strikes, seen.own_failed) == (2, 0)
    # 10 more accepted, but 2 other requests answered 500: more than 0.1 per accepted request.
    seen, failed_event = count_failure(seen, 500, CollectorRecord(26, 23, 20, 6), 3)
    assert seen.strikes == 2 and not failed_event


def test_an_acceptance_of_the_strikes_own_request_number_is_no_proof():
    # Only a request sent after the strike's request, accepted, shows the collector up since.
    seen, _ = count_failure(EventFailures(), 500, CollectorRecord(5, 4, 4, 1), 2)
    seen, failed_event = count_failure(seen, 500, CollectorRecord(6, 5, 5, 2), 2)
    assert seen.strikes == 1 and not failed_event
    seen, failed_event = count_failure(seen, 500, CollectorRecord(8, 7, 6, 3), 2)
    assert seen.strikes == 2 and failed_event
