"""Taking over the journals dead processes left: which ones, one at a time, never half-made."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from datetime import datetime, timezone

import pytest

from producer import journal as journal_module
from producer import journal_dir
from producer.errors import JournalError
from producer.journal import Journal
from producer.journal_dir import Destination, JournalNames, lock_existing, writer_of
from producer.orphans import adopt_next, adopt_orphans, give_up
from tests.producer.support import open_paths_under

HERE = Destination("lineage", "127.0.0.1:9092,127.0.0.1:9093")


def _orphan(root, destination: Destination | None, n: int = 3, names: JournalNames | None = None) -> Journal:
    """A journal whose owner died (the kernel drops its flock with its fds)."""
    journal = Journal.create(root, max_bytes=1 << 20, segment_bytes=4096, destination=destination, names=names)
    journal.append([(b"k", f"v{i}".encode()) for i in range(n)])
    _die(journal)
    return journal


def _die(journal: Journal) -> None:
    """The process holding ``journal`` dies: its descriptors close, its flock goes with them."""
    journal._reader.close()
    if journal._writer is not None:   # none without a record
        os.close(journal._writer)
    os.close(journal._lock_fd)


def _adopt_next(root):
    return adopt_next(root, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)


def test_only_journals_for_this_topic_and_cluster_are_taken_and_old_ones_without_a_destination(tmp_path):
    other_topic = _orphan(tmp_path, Destination("other", "127.0.0.1:9092"))
    other_cluster = _orphan(tmp_path, Destination("lineage", "127.0.0.1:19092"))
    same_cluster = _orphan(tmp_path, Destination("lineage", "SASL_SSL://127.0.0.1:9093"))
    written_before_destinations = _orphan(tmp_path, None)
    adopted = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    try:
        assert [j.path for j in adopted] == [same_cluster.path, written_before_destinations.path]
        assert (other_topic.path / "LOCK").exists() and (other_cluster.path / "LOCK").exists()
    finally:
        for journal in adopted:
            journal.close()


def test_a_journal_being_made_is_left_alone_and_one_whose_maker_died_is_removed(tmp_path):
    being_made = tmp_path / ".20250101T000000000000-1-abcdef"
    being_made.mkdir()
    (being_made / "DESTINATION").write_text('{"topic": "lineage", "bootstrap_servers": "127.0.0.1:9092"}')
    died_making = tmp_path / ".20250101T000000000001-2-abcdef"
    died_making.mkdir()
    (died_making / "LOCK").touch()
    assert _adopt_next(tmp_path) is None
    assert sorted(being_made.iterdir()) == [being_made / "DESTINATION"], "no LOCK made in a journal being made"
    assert not died_making.exists()


def test_a_made_journal_is_visible_only_with_its_lock_held_and_its_destination(tmp_path):
    journal = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    try:
        assert [p.name for p in tmp_path.iterdir()] == [journal.path.name]
        assert sorted(p.name for p in journal.path.iterdir()) == ["DESTINATION", "LOCK"]
        assert _adopt_next(tmp_path) is None, "a live journal is never taken"
    finally:
        journal.close()


def test_a_journals_lock_is_held_before_its_destination_is_written_and_a_failed_make_leaves_nothing(
        tmp_path, monkeypatch):
    # An older version's adopter creates LOCK in any directory it lists, hidden ones
    # included: the journal's own LOCK is there, held, before anything else is written.
    real = journal_module.write_synced

    def write_destination(path, text):
        assert sorted(p.name for p in path.parent.iterdir()) == ["LOCK"]
        assert lock_existing(path.parent) is None, "LOCK not held yet"
        real(path, text)

    monkeypatch.setattr(journal_module, "write_synced", write_destination)
    Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE).close()

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_module, "write_synced", disk_full)
    with pytest.raises(JournalError):
        Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    assert list(tmp_path.iterdir()) == [], "a half-made journal left behind"


def test_orphans_are_taken_one_at_a_time_holding_only_their_lock_until_read(tmp_path):
    orphans = [_orphan(tmp_path, HERE, n=200) for _ in range(5)]
    paths = [o.path for o in orphans]
    first = _adopt_next(tmp_path)
    assert first is not None and first.path == paths[0] and not first.recovered
    assert open_paths_under(paths) == [str(paths[0] / "LOCK")]
    slices = 1
    while not first.recover_some(max_records=30):   # the caller's scan, a slice at a time
        slices += 1
    assert slices == 7 and first.pending == 200
    assert open_paths_under(paths) == [str(paths[0] / "LOCK")], "the recovery scan's segment is closed"
    first.read()
    assert len(open_paths_under(paths)) == 2   # LOCK and the segment being read
    second = _adopt_next(tmp_path)   # the first is still held: the next one
    assert second is not None and second.path == paths[1]
    first.close()
    second.close()
    assert open_paths_under(paths) == []


def test_a_journal_whose_scan_is_incomplete_stays_on_disk_when_released(tmp_path):
    orphan = _orphan(tmp_path, HERE, n=200)
    journal = _adopt_next(tmp_path)
    assert journal is not None and not journal.recover_some(max_records=30)
    assert journal.pending == 0   # not counted yet
    journal.close()
    assert (orphan.path / "00000001.seg").exists()
    again = _adopt_next(tmp_path)
    assert again is not None and again.recover_some() and again.pending == 200
    again.close()


def test_a_journal_that_cannot_be_opened_is_logged_once_and_left(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.journal")
    broken = _orphan(tmp_path, HERE)
    (broken.path / "00000002.seg").mkdir()   # a segment that is not a file
    bad_destination = _orphan(tmp_path, HERE)
    (bad_destination.path / "DESTINATION").write_text("{not json")
    for _ in range(3):
        # What its caller (producer.replay) does with it: the scan fails, it gives the journal up.
        journal = _adopt_next(tmp_path)
        if journal is not None:
            assert journal.path == broken.path
            with pytest.raises(IsADirectoryError):
                journal.recover_some()
            give_up(journal, IsADirectoryError(21, "Is a directory"))
    failed = [r.getMessage() for r in caplog.records if "event=adopt_failed" in r.getMessage()]
    assert sorted(m.split()[0] for m in failed) == [f"journal={broken.path}", f"journal={bad_destination.path}"]
    assert open_paths_under([broken.path, bad_destination.path]) == []
    assert (broken.path / "00000001.seg").exists(), "left on disk for the next process"


def test_a_dead_processs_journal_for_another_destination_is_logged_once_not_a_live_one(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "producer.journal")
    stranded = _orphan(tmp_path, Destination("other", "127.0.0.1:9092"))
    live = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096,
                          destination=Destination("lineage", "127.0.0.1:19092"))
    try:
        for _ in range(3):
            assert _adopt_next(tmp_path) is None
        adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    finally:
        live.close()
    skipped = [r for r in caplog.records if "event=adopt_skipped" in r.getMessage()]
    assert [r.getMessage() for r in skipped] == [
        f"journal={stranded.path} event=adopt_skipped written_for=other@127.0.0.1:9092 "
        "producer_for=lineage@127.0.0.1:9092,127.0.0.1:9093 fix=run a producer for other@127.0.0.1:9092 "
        "with this journal_dir to send it"]
    assert skipped[0].levelno == logging.WARNING
    fd = lock_existing(stranded.path)
    assert fd is not None, "left unlocked for its adopter"
    os.close(fd)


def test_a_lock_that_cannot_be_taken_leaks_no_descriptor(tmp_path, monkeypatch):
    """flock failing otherwise than "held" (ENOLCK on NFS, EIO): every look closes what it opened."""
    foreign = _orphan(tmp_path, Destination("other", "127.0.0.1:9092"))
    ours = _orphan(tmp_path, HERE)

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(journal_module.fcntl, "flock", flock)
    with pytest.raises(OSError):
        lock_existing(ours.path)
    for _ in range(5):
        assert _adopt_next(tmp_path) is None
        assert adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE) == []
    assert open_paths_under([foreign.path, ours.path]) == []


def test_taken_over_without_their_scans_orphans_are_only_locked_and_one_released_uncounted_stays_whole(tmp_path):
    """A producer's construction (adopt_orphans(recover=False)): nothing is read, empty ones
    (no bytes after their cursor) are removed, not taken, and until a journal's scan is
    complete it is pending as the records counted so far, at least 1."""
    full = _orphan(tmp_path, HERE, n=200)
    empty = _orphan(tmp_path, HERE, n=0)
    before = sorted((p.name, p.read_bytes()) for p in full.path.iterdir())
    adopted = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE, recover=False)
    try:
        assert [j.path for j in adopted] == [full.path]
        assert not empty.path.exists(), "an empty journal was not removed when taken"
        assert open_paths_under([full.path]) == [str(full.path / "LOCK")]
        [taken] = adopted
        assert not taken.recovered and taken.pending_at_least == 1
        assert not taken.recover_some(max_records=30) and taken.pending_at_least == 30
    finally:
        for journal in adopted:
            journal.close()
    assert sorted((p.name, p.read_bytes()) for p in full.path.iterdir()) == before, "released uncounted, changed"
    again = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    try:
        assert [(j.path, j.pending, j.pending_at_least) for j in again] == [(full.path, 200, 200)]
    finally:
        for journal in again:
            journal.close()


def test_a_journal_let_go_is_free_at_once_though_a_fork_child_still_has_its_lock_open(tmp_path):
    # A fork child shares the LOCK's open file (and so its flock) until its fork hook closes
    # its copy; os.dup makes the same sharing without a race. The owner's close() must free
    # the journal for the next run there and then; so must an adopter that lets one go.
    owner = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    owner.append([(b"k", b"v")])
    childs_copy = os.dup(owner._lock_fd)
    try:
        owner.close()
        adopter = _adopt_next(tmp_path)
        assert adopter is not None, "the closed journal is still locked by the other copy of its LOCK"
        assert adopter.recover_some() and adopter.pending == 1
        adopters_child = os.dup(adopter._lock_fd)
        try:
            adopter.close()   # its scan done, one record pending: stays on disk, let go
            again = _adopt_next(tmp_path)
            assert again is not None and again.path == owner.path
            again.close()
        finally:
            os.close(adopters_child)
    finally:
        os.close(childs_copy)


def test_one_writers_journals_are_taken_in_order_never_a_later_one_while_an_earlier_one_is_held(tmp_path):
    """A producer's journals (its own, one a reclaim's wait put aside) share a writer: while
    one is held (another adopter is sending it), nobody takes the later ones; an adopter that
    dies holding some leaves them to the next one, which takes them from the first on."""
    names = JournalNames()
    first, second, third = (_orphan(tmp_path, HERE, n=2, names=names) for _ in range(3))
    other_writer = _orphan(tmp_path, HERE, n=1)
    assert first.path.name < second.path.name < third.path.name
    assert writer_of(first.path.name) == writer_of(third.path.name) != writer_of(other_writer.path.name)
    sending = _adopt_next(tmp_path)
    assert sending is not None and sending.path == first.path
    # Another producer: at its start, and while it runs. Another writer's journal is not held back.
    taken = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE, recover=False)
    assert [j.path for j in taken] == [other_writer.path]
    assert _adopt_next(tmp_path) is None
    for journal, n in ((sending, 2), (taken[0], 1)):
        journal.recover_some()
        journal.commit(journal.read()[1], n)
        journal.close()   # all sent: removed (the next one of its writer may go)
    assert not first.path.exists()
    both = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE, recover=False)
    assert [j.path for j in both] == [second.path, third.path]
    for journal in both:
        _die(journal)   # the adopter dies before sending them
    again = _adopt_next(tmp_path)
    assert again is not None and again.path == second.path
    assert _adopt_next(tmp_path) is None, "the third taken while the second is being sent"
    again.close()   # released unsent (its adopter closed): the next adopter takes it first
    assert [j.path for j in adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)] == [
        second.path, third.path]


def test_a_live_writers_journals_are_left_alone_and_a_given_up_one_holds_nothing_back(tmp_path):
    names = JournalNames()
    live = [Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE, names=names)
            for _ in range(2)]
    try:
        for journal in live:
            journal.append([(b"k", b"v")])
        assert adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE) == []
    finally:
        for journal in live:
            journal.close()   # let go, each holding a record: now the writer's orphans
    dead = JournalNames()
    broken = _orphan(tmp_path, HERE, names=dead)
    (broken.path / "00000002.seg").mkdir()   # a segment that is not a file: cannot be opened
    after = _orphan(tmp_path, HERE, names=dead)
    taken = adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE)
    try:
        assert [j.path for j in taken] == [live[0].path, live[1].path, after.path], \
            "a journal given up held back its writer's next one"
    finally:
        for journal in taken:
            journal.close()


def test_journal_names_sort_in_the_order_a_writer_made_them_though_the_clock_steps_back(monkeypatch):
    names = JournalNames()
    made = [names.next() for _ in range(50)]   # many within one microsecond
    assert made == sorted(made) and len(set(made)) == 50
    assert len({writer_of(name) for name in made}) == 1
    assert writer_of(f".{made[0]}") == writer_of(made[0])

    class SteppedBack(datetime):   # the clock set back (NTP)
        @classmethod
        def now(cls, tz=None):
            return datetime(2001, 1, 1, tzinfo=timezone.utc)

    monkeypatch.setattr(journal_dir, "datetime", SteppedBack)
    assert names.next() > made[-1]
    # Journals named before writers shared a token: each a writer of its own.
    assert writer_of("20250101T000000000000-1-abcdef") != writer_of("20250101T000000000001-1-abcdf0")


def test_a_writer_that_died_making_its_next_journal_does_not_hold_back_its_earlier_one(tmp_path):
    """Killed between making the hidden directory and its LOCK appearing: the hidden journal
    stays (nothing tells it from one being made) but its writer's journal with records is taken."""
    names = JournalNames()
    earlier = _orphan(tmp_path, HERE, n=2, names=names)
    died_making = tmp_path / f".{names.next()}"
    died_making.mkdir()
    (died_making / "LOCK.new").touch()
    taken = _adopt_next(tmp_path)
    assert taken is not None and taken.path == earlier.path
    taken.close()
    assert [j.path for j in adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096,
                                          destination=HERE, recover=False)] == [earlier.path]
    assert died_making.exists()


def test_a_journal_given_up_here_but_sent_by_another_process_still_holds_back_its_writers_next(tmp_path):
    """Given up by this process (a read failed), then adopted by another: while that one sends
    it, this one does not take its writer's next journal (two of one writer sent at once)."""
    names = JournalNames()
    first, second = (_orphan(tmp_path, HERE, names=names) for _ in range(2))
    journal = _adopt_next(tmp_path)
    assert journal is not None and journal.path == first.path
    give_up(journal, OSError(errno.EIO, "Input/output error"))
    elsewhere = os.open(first.path / "LOCK", os.O_RDWR)   # another process's open file, its flock
    try:
        fcntl.flock(elsewhere, fcntl.LOCK_EX)
        assert _adopt_next(tmp_path) is None
        assert adopt_orphans(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE,
                             recover=False) == []
    finally:
        os.close(elsewhere)
    taken = _adopt_next(tmp_path)   # free again: given up here, it holds nothing back
    assert taken is not None and taken.path == second.path
    taken.close()
    assert (first.path / "LOCK").exists(), "given up: left on disk, not taken"


def test_a_journal_whose_removal_was_cut_short_without_its_lock_holds_back_nothing(tmp_path, caplog):
    """A dead writer's journal left without LOCK (its removal cut short after LOCK went: a
    crash, a file that could not be removed) must not hold back, for ever, the writer's next
    journal and its records. Without segments it is removed; with segments (its records were
    all sent: only a journal with nothing pending is removed) it is logged and left."""
    caplog.set_level(logging.WARNING, "producer.journal")
    names = JournalNames()
    cut_short = Journal.create(tmp_path, max_bytes=1 << 20, segment_bytes=4096, destination=HERE, names=names)
    _die(cut_short)
    with_segments = _orphan(tmp_path, HERE, n=1, names=names)
    nxt = _orphan(tmp_path, HERE, n=2, names=names)
    (cut_short.path / "LOCK").unlink()
    (with_segments.path / "LOCK").unlink()
    taken = _adopt_next(tmp_path)
    assert taken is not None and taken.path == nxt.path, taken
    taken.close()
    assert not cut_short.path.exists(), "no LOCK, no segments: what is left of it is removed"
    assert with_segments.path.exists() and not (with_segments.path / "LOCK").exists(), "left as it is"
    assert sum("no_lock" in r.getMessage() for r in caplog.records) == 1, [r.getMessage() for r in caplog.records]


def test_a_directory_under_the_journal_dir_that_is_no_journal_is_never_removed(tmp_path):
    """What else lives in the journal directory (a folder of notes, a tree with a file named
    LOCK deeper down) has no LOCK of its own either: it is not a journal's, and the scan that
    clears journals cut short must leave it as it is."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.txt").write_text("kept")
    deeper = tmp_path / "a" / "b"
    deeper.mkdir(parents=True)
    (deeper / "LOCK").touch()
    empty_of_ours = tmp_path / "20261129T000000000000-1-abcdef"
    empty_of_ours.mkdir()
    (empty_of_ours / "DESTINATION").write_text("x")
    assert _adopt_next(tmp_path) is None
    assert (notes / "README.txt").read_text() == "kept" and (deeper / "LOCK").exists()
    assert not empty_of_ours.exists(), "a journal's own files only, no LOCK, no segments: removed"
