"""The demo's check of what the collector received against what was sent (plain data)."""

from __future__ import annotations

from relay.embedded.delivery_check import check_delivery


def ev(run: str, event_type: str, at: int) -> dict:
    return {"eventType": event_type, "eventTime": f"2026-01-01T00:00:{at:02d}Z", "run": {"runId": run},
            "job": {"namespace": "ns", "name": "job"}}


RUN = [ev("r1", "START", 1), ev("r1", "RUNNING", 2), ev("r1", "COMPLETE", 3)]


def test_everything_received_once_is_ok_and_exact_duplicates_sent_count_once():
    report = check_delivery(RUN + [RUN[1]], RUN)
    assert report.ok and report.unique_sent == 3 and report.missing == 0 and report.problems() == []


def test_a_missing_event_is_a_problem_unless_the_relay_named_a_reason():
    report = check_delivery(RUN, RUN[:1] + RUN[2:])
    assert not report.ok and report.problems() == [
        "1 of 3 unique events sent never reached the collector (1 missing, 0 of them accounted for as dropped or "
        "dead-lettered)"]
    assert check_delivery(RUN, RUN[:1] + RUN[2:], not_forwarded=1).ok


def test_a_run_must_arrive_start_first_with_exactly_one_terminal():
    late_start = check_delivery(RUN, [RUN[2], RUN[0], RUN[1]])
    assert late_start.start_not_first == ("r1",) and not late_start.ok
    twice = check_delivery(RUN, RUN + [RUN[2]])
    assert twice.terminal_count_wrong == (("r1", 2),)
    assert twice.problems() == ["1 runs without exactly one terminal event: run …r1 (2 arrived)"]
    never = check_delivery(RUN, [])
    assert never.start_not_first == ("r1",) and never.terminal_count_wrong == (("r1", 0),)


def test_a_start_or_terminal_the_relay_did_not_forward_for_a_named_reason_is_excused_and_said():
    """A START or terminal dropped or dead-lettered (counted by the relay) never arrives:
    its run is excused, and said to be; one that arrived out of order, or twice, is not."""
    no_start = check_delivery(RUN, RUN[1:], not_forwarded=1)
    assert no_start.ok and no_start.excused == ("r1",)
    assert no_start.notes() == ["1 runs without their START or terminal event, accounted for as dropped or "
                                "dead-lettered: run …r1"]
    no_terminal = check_delivery(RUN, RUN[:2], not_forwarded=1)
    assert no_terminal.ok and no_terminal.excused == ("r1",)
    # Not accounted for: still a problem.
    assert not check_delivery(RUN, RUN[1:]).ok and check_delivery(RUN, RUN[1:]).start_not_first == ("r1",)
    # Arrived, but out of order or twice: never excused.
    late = check_delivery(RUN + [ev("r2", "START", 4)], [RUN[1], RUN[0], RUN[2]], not_forwarded=1)
    assert late.start_not_first == ("r1",) and not late.ok
    twice = check_delivery(RUN, RUN + [RUN[2]], not_forwarded=1)
    assert twice.terminal_count_wrong == (("r1", 2),) and not twice.ok
    assert check_delivery(RUN, RUN).notes() == []


def test_a_run_without_its_start_whose_terminal_arrived_twice_is_not_excused():
    """A missing START would be excused, but its terminal event arrived twice: a problem, and
    the run is listed as one, never as excused too."""
    report = check_delivery(RUN, RUN[1:] + [RUN[2]], not_forwarded=1)
    assert not report.ok and report.excused == () and report.notes() == []
    assert report.terminal_count_wrong == (("r1", 2),) and report.start_not_first == ("r1",)


def test_the_success_line_names_the_excused_runs_instead_of_claiming_every_run_whole():
    whole = check_delivery(RUN, RUN)
    assert whole.verdict() == ("every one of the 3 unique events sent reached the collector; every run's START "
                               "came first and exactly one terminal event arrived")
    no_start = check_delivery(RUN + [ev("r2", "START", 4), ev("r2", "COMPLETE", 5)],
                              RUN[1:] + [ev("r2", "START", 4), ev("r2", "COMPLETE", 5)], not_forwarded=1)
    assert no_start.verdict() == (
        "every one of the 5 unique events sent reached the collector or was accounted for (1 dropped or "
        "dead-lettered); every run's START came first and exactly one terminal event arrived, except 1 runs "
        "whose START or terminal event was dropped or dead-lettered: run …r1")
