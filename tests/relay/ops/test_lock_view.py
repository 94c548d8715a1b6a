"""The redrive lock's state as read from its log (relay.ops.lock_view): plain records."""

from __future__ import annotations

from dataclasses import replace

from relay.ops.lock_view import LockRecord, LockView


def claim(offset: int, holder: str, after: int) -> LockRecord:
    return LockRecord(op="claim", holder=holder, host="h", pid=1, after=after, offset=offset)


def beat(offset: int, holder: str) -> LockRecord:
    return LockRecord(op="heartbeat", holder=holder, offset=offset)


def release(offset: int, holder: str) -> LockRecord:
    return LockRecord(op="release", holder=holder, offset=offset)


def view_of(records: list[LockRecord], start: int = 0) -> LockView:
    view = LockView.starting_at(start, from_log_start=start == 0)
    view.apply_all(records)
    return view


def test_an_empty_log_is_free_and_a_claim_after_its_end_holds():
    assert view_of([]).free
    view = view_of([claim(0, "a", after=-1)])
    assert view.holder is not None and view.holder.holder == "a" and not view.free


def test_a_claim_that_a_record_came_before_does_not_count():
    """Two claims after the same end: the first counts, the second (a heartbeat or the
    first claim between its end and it) does not."""
    view = view_of([claim(0, "a", after=-1), claim(1, "b", after=-1), beat(2, "a")])
    assert view.holder.holder == "a"
    view = view_of([claim(0, "a", after=-1), beat(1, "a"), claim(2, "b", after=0)])
    assert view.holder.holder == "a"


def test_a_claim_after_the_silent_end_takes_over_and_the_old_holder_is_ignored():
    view = view_of([claim(0, "a", after=-1), beat(1, "a"), claim(2, "b", after=1), beat(3, "a"), release(4, "a")])
    assert view.holder.holder == "b" and not view.free
    view.apply(release(5, "b"))
    assert view.free


def test_a_log_read_from_past_its_start_is_unknown_until_a_claim_it_can_check():
    """Retention cut the log, or only its end was read: a release of a holder whose claim
    is not seen says nothing (it may have been taken over since)."""
    view = view_of([beat(10, "a"), release(11, "a")], start=10)
    assert not view.known and not view.free and view.last_beat.holder == "a"
    # A claim whose end lies before the first offset read cannot be checked either.
    view.apply(claim(12, "b", after=9))
    assert not view.known
    view = view_of([beat(10, "a"), claim(11, "b", after=10)], start=10)
    assert view.known and view.holder.holder == "b"


def test_records_round_trip_and_an_unreadable_one_counts_only_as_a_record():
    record = LockRecord(op="claim", holder="x", host="h", pid=7, since="s", after=3, at="t")
    assert LockRecord.parse(4, record.dumps()) == LockRecord(**{**record.__dict__, "offset": 4})
    junk = LockRecord.parse(5, b"not json")
    assert junk.op == "unknown"
    view = view_of([claim(0, "a", after=-1), replace(junk, offset=1), claim(2, "b", after=0)])
    assert view.holder.holder == "a", "a record between its end and the claim: it does not count"


def test_a_heartbeat_with_no_claim_before_it_is_not_a_free_lease():
    """The lock topic was deleted (or replaced) under a holder: the new log, read from its
    start, shows its heartbeats but no claim. That lease is not free (a claimant watches
    first) until its writer releases, or a claim counts."""
    view = view_of([beat(0, "a"), beat(1, "a")])
    assert view.known and view.holder is None and not view.free
    assert "whose claim is not in its log" in view.describe_holder()
    view.apply(release(2, "a"))
    assert view.free
    # After a release, a late heartbeat of anyone makes it not free either.
    view = view_of([claim(0, "a", after=-1), release(1, "a"), beat(2, "b")])
    assert not view.free
    view.apply(claim(3, "c", after=2))
    assert view.holder.holder == "c" and not view.free


def test_a_second_heartbeat_of_another_redrive_under_a_holder_contests_the_lease():
    """One heartbeat of a redrive taken over is expected (it reads the claim that took it
    then); a second means it believes it still holds the lease."""
    view = view_of([claim(0, "a", after=-1), beat(1, "b"), beat(2, "a")])
    assert view.holder.holder == "a" and view.contested is None
    view.apply(beat(3, "b"))
    assert view.contested is not None and view.contested.holder == "b"
    view.apply(claim(4, "c", after=3))
    assert view.contested is None, "a claim that counts starts afresh"
