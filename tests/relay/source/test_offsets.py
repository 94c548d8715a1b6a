from relay.source.offsets import OffsetTracker

P = ("t", 0)


def test_commits_only_the_contiguous_settled_prefix():
    tracker = OffsetTracker()
    tickets = [tracker.track(P, o) for o in range(5)]
    for t in tickets:
        t.acquire()  # one collector each
        t.release()  # dispatch done
    tickets[0].release()
    tickets[2].release()
    tickets[3].release()
    assert tracker.committable() == {P: 1}  # offset 1 still out
    tickets[1].release()
    assert tracker.committable() == {P: 4}
    tracker.mark_committed({P: 4})
    assert tracker.committable() == {}
    tickets[4].release()
    assert tracker.committable() == {P: 5}


def test_a_record_with_two_obligations_settles_after_both():
    tracker = OffsetTracker()
    t = tracker.track(P, 10)
    t.acquire()
    t.acquire()
    t.release()
    t.release()
    assert tracker.committable() == {}
    t.release()
    assert tracker.committable() == {P: 11}


def test_revoke_returns_final_offsets_and_orphans_are_harmless():
    tracker = OffsetTracker()
    a = tracker.track(P, 0)
    b = tracker.track(P, 1)
    b.acquire()
    a.release()
    b.release()
    assert tracker.revoke([P]) == {P: 1}
    b.release()  # delivery finished after the revoke
    assert tracker.committable() == {}
    assert tracker.partitions() == []


def test_partitions_are_independent():
    tracker = OffsetTracker()
    slow = tracker.track(("t", 0), 0)
    slow.acquire()
    slow.release()
    fast = tracker.track(("t", 1), 7)
    fast.release()
    assert tracker.committable() == {("t", 1): 8}


def test_pending_bytes_count_records_until_they_settle_or_are_revoked():
    tracker = OffsetTracker()
    a = tracker.track(P, 0, 100)
    b = tracker.track(P, 1, 20)
    c = tracker.track(("t", 1), 0, 5)
    assert tracker.pending_bytes == 125
    b.acquire()
    b.release()
    assert tracker.pending_bytes == 125  # still held by a collector
    b.release()
    assert tracker.pending_bytes == 105  # settled out of order: counted off at once
    tracker.revoke([P])
    assert tracker.pending_bytes == 5
    a.release()  # an orphan settling later changes nothing
    assert tracker.pending_bytes == 5
    c.release()
    assert tracker.pending_bytes == 0


def test_record_timestamps_oldest_unsettled_is_where_the_next_commit_stops():
    tracker = OffsetTracker()
    p = ("t", 0)
    assert tracker.record_ms(p) == (None, None)
    first, second, third = (tracker.track(p, o, ms=1000 * (o + 1)) for o in (0, 1, 2))
    assert tracker.record_ms(p) == (1000, 3000)
    second.release()  # settled out of order: the oldest unsettled is still the first
    assert tracker.record_ms(p) == (1000, 3000)
    first.release()
    assert tracker.record_ms(p) == (3000, 3000)
    third.release()
    assert tracker.record_ms(p) == (None, 3000)  # all settled: the last one tracked remains
    tracker.track(p, 3, ms=-1)  # no timestamp (librdkafka's -1): unknown, not the epoch
    assert tracker.record_ms(p) == (None, None)
    tracker.revoke([p])
    assert tracker.record_ms(p) == (None, None)


def test_offsets_are_still_owned_until_their_partition_is_revoked_even_when_it_comes_back():
    """Offsets computed now may be committed later (behind a poll, on the consumer's
    thread): only while the tracker still follows the partition it followed then. Once
    revoked, never again, though the partition was assigned back and tracked anew (its
    revocation committed newer offsets than these)."""
    other = ("t", 1)
    tracker = OffsetTracker()
    for partition in (P, other):
        tracker.track(partition, 0).release()
    offsets = tracker.committable()
    still_own = tracker.still_owned(offsets)
    assert still_own(P) and still_own(other)
    tracker.track(P, 1).release()  # more settles: still the same partition's log
    assert still_own(P)
    tracker.revoke([P])
    assert not still_own(P) and still_own(other)
    tracker.track(P, 0)  # assigned back, read again from the commit
    assert not still_own(P)
    assert not still_own(("t", 2))  # never computed: nothing to vouch for


def test_a_partition_assigned_back_is_not_caught_up_until_measured_again():
    tracker = OffsetTracker()
    tracker.track(P, 0)
    tracker.caught_up(P, 1000.0)
    assert tracker.caught_up_ms(P) == 1000.0
    tracker.revoke([P])
    tracker.track(P, 0)  # assigned back
    assert tracker.caught_up_ms(P) is None
