"""Deduper: duplicates within the TTL are dropped, memory stays bounded."""

from __future__ import annotations

import math
import uuid

import orjson
import pytest

from relay.events import LineageEvent
from relay.stages.decode import decode_record
from relay.stages.dedupe import Deduper


def event(
    run_number: int, event_type: str = "START", *, reverse_keys: bool = False
) -> LineageEvent:
    doc = {
        "eventTime": "2024-05-01T10:15:30.000Z",
        "eventType": event_type,
        "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.20.0/client/python",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": str(uuid.UUID(int=run_number))},
        "job": {"namespace": "airflow", "name": "dag.task"},
    }
    if reverse_keys:
        doc = dict(reversed(list(doc.items())))
    result = decode_record(orjson.dumps(doc), max_bytes=1 << 20)
    assert isinstance(result, LineageEvent), result
    return result


def test_second_copy_within_ttl_is_a_duplicate():
    dedupe = Deduper(ttl_s=60, max_entries=100)
    first, retry = event(1), event(1, reverse_keys=True)
    assert dedupe.check_and_remember(first.digest, now=1000.0) is False
    assert dedupe.check_and_remember(retry.digest, now=1030.0) is True
    assert len(dedupe) == 1


def test_different_events_are_not_duplicates():
    dedupe = Deduper(ttl_s=60, max_entries=100)
    assert dedupe.check_and_remember(event(1, "START").digest, 0.0) is False
    assert dedupe.check_and_remember(event(1, "COMPLETE").digest, 0.0) is False
    assert dedupe.check_and_remember(event(2, "START").digest, 0.0) is False
    assert len(dedupe) == 3


def test_copy_after_ttl_is_let_through_and_starts_a_new_ttl():
    dedupe = Deduper(ttl_s=60, max_entries=100)
    digest = event(1).digest
    assert dedupe.check_and_remember(digest, 0.0) is False
    assert dedupe.check_and_remember(digest, 59.999) is True
    assert dedupe.check_and_remember(digest, 60.0) is False  # age == ttl: expired
    assert dedupe.check_and_remember(digest, 100.0) is True
    assert dedupe.check_and_remember(digest, 120.0) is False


def test_duplicates_do_not_extend_the_ttl():
    dedupe = Deduper(ttl_s=10, max_entries=100)
    digest = event(1).digest
    dedupe.check_and_remember(digest, 0.0)
    for now in (3.0, 6.0, 9.0):
        assert dedupe.check_and_remember(digest, now) is True
    assert dedupe.check_and_remember(digest, 10.5) is False


def test_forget_lets_a_redelivery_through():
    dedupe = Deduper(ttl_s=60, max_entries=100)
    digest = event(1).digest
    dedupe.check_and_remember(digest, 0.0)
    dedupe.forget(digest)
    assert len(dedupe) == 0
    assert dedupe.check_and_remember(digest, 1.0) is False
    assert dedupe.check_and_remember(digest, 2.0) is True
    dedupe.forget(b"\x00" * 16)  # unknown digests are ignored
    assert len(dedupe) == 1


def test_full_deduper_evicts_the_oldest_digest():
    dedupe = Deduper(ttl_s=3600, max_entries=2)
    a, b, c = (event(n).digest for n in (1, 2, 3))
    for now, digest in enumerate((a, b, c)):
        assert dedupe.check_and_remember(digest, float(now)) is False
    assert len(dedupe) == 2
    assert dedupe.check_and_remember(c, 10.0) is True
    assert dedupe.check_and_remember(b, 10.0) is True
    assert dedupe.check_and_remember(a, 10.0) is False  # a was evicted


def test_expired_digests_are_purged_without_a_lookup_of_them():
    dedupe = Deduper(ttl_s=5, max_entries=1000)
    for n in range(100):
        dedupe.check_and_remember(event(n).digest, float(n) / 100)
    assert len(dedupe) == 100
    dedupe.check_and_remember(event(1000).digest, 100.0)
    assert len(dedupe) == 1


def test_memory_stays_bounded_under_many_distinct_events():
    dedupe = Deduper(ttl_s=3600, max_entries=500)
    for n in range(20_000):
        dedupe.check_and_remember(n.to_bytes(16, "big"), n * 0.001)
        assert len(dedupe) <= 500
    assert len(dedupe) == 500


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"ttl_s": 0, "max_entries": 10}, "ttl_s"),
        ({"ttl_s": -1.0, "max_entries": 10}, "ttl_s"),
        ({"ttl_s": math.nan, "max_entries": 10}, "ttl_s"),
        ({"ttl_s": math.inf, "max_entries": 10}, "ttl_s"),
        ({"ttl_s": True, "max_entries": 10}, "ttl_s"),
        ({"ttl_s": 60, "max_entries": 0}, "max_entries"),
        ({"ttl_s": 60, "max_entries": 1.5}, "max_entries"),
        ({"ttl_s": 60, "max_entries": True}, "max_entries"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Deduper(**kwargs)


def at(topic: str, partition: int) -> object:
    return type("Where", (), {"topic": topic, "partition": partition})()


def test_a_digest_read_back_below_a_commit_dedupes_only_its_own_partition():
    dedupe = Deduper(ttl_s=60, max_entries=100)
    digest = event(1).digest
    dedupe.remember_settled(digest, 0.0, "ol", 1)
    assert dedupe.check_and_remember(digest, 1.0, at("ol", 1)) is True
    assert dedupe.check_and_remember(digest, 1.0, None) is False  # nowhere known: not proof
    # Forwarded from there on: an ordinary digest, a duplicate wherever it comes from.
    assert dedupe.check_and_remember(digest, 2.0, at("ol", 0)) is True
    assert dedupe.check_and_remember(digest, 2.0, at("other", 1)) is True
    # Another topic's partition of the same number is another partition.
    dedupe.forget(digest)
    dedupe.remember_settled(digest, 3.0, "ol", 1)
    assert dedupe.check_and_remember(digest, 4.0, at("other", 1)) is False
    # Read back from two partitions: copies from either are duplicates.
    dedupe.forget(digest)
    dedupe.remember_settled(digest, 4.5, "ol", 1)
    dedupe.remember_settled(digest, 4.5, "ol", 3)
    assert dedupe.check_and_remember(digest, 4.6, at("ol", 3)) is True
    assert dedupe.check_and_remember(digest, 4.6, at("ol", 1)) is True
    assert dedupe.check_and_remember(digest, 4.7, at("ol", 9)) is False  # then ordinary
    # A digest already forwarded stays ordinary when a look-back reads a copy back.
    dedupe.remember_settled(digest, 5.0, "ol", 2)
    assert dedupe.check_and_remember(digest, 6.0, at("ol", 7)) is True


def test_read_back_digests_expire_and_leave_with_their_entry():
    dedupe = Deduper(ttl_s=10, max_entries=2)
    a, b, c = (event(n).digest for n in (1, 2, 3))
    dedupe.remember_settled(a, 0.0, "ol", 0)
    assert dedupe.check_and_remember(a, 10.0, at("ol", 0)) is False  # expired: forwarded, ordinary now
    assert dedupe.check_and_remember(a, 11.0, at("ol", 5)) is True
    dedupe.remember_settled(b, 12.0, "ol", 0)
    dedupe.remember_settled(c, 12.0, "ol", 0)  # evicts a
    assert len(dedupe) == 2 and len(dedupe._where) == 2
    assert dedupe.check_and_remember(a, 13.0, at("ol", 5)) is False  # evicts b, with its scope
    assert len(dedupe) == 2 and set(dedupe._where) == {c}


def test_a_digest_read_back_after_its_ttl_lapsed_still_dedupes_its_partition():
    dedupe = Deduper(ttl_s=100, max_entries=10)
    digest = event(1).digest
    assert dedupe.check_and_remember(digest, 0.0, at("ol", 0)) is False
    dedupe.remember_settled(digest, 150.0, "ol", 0)  # its first sighting expired, not purged yet
    assert dedupe.check_and_remember(digest, 151.0, at("ol", 0)) is True
    assert dedupe.check_and_remember(digest, 151.0, at("ol", 1)) is False  # another partition's copy


def test_a_digest_remembered_again_is_the_youngest_when_the_deduper_is_full():
    a, b, c = (event(n).digest for n in (1, 2, 3))
    # Read back for one partition, then forwarded from another: an ordinary digest, seen now.
    dedupe = Deduper(ttl_s=100, max_entries=2)
    dedupe.remember_settled(a, 0.0, "ol", 0)
    dedupe.check_and_remember(b, 1.0, at("ol", 0))
    assert dedupe.check_and_remember(a, 2.0, at("ol", 1)) is False
    dedupe.check_and_remember(c, 3.0, at("ol", 0))  # full: evicts b, the oldest
    assert dedupe.check_and_remember(a, 4.0, at("ol", 1)) is True
    # Expired, then read back: remembered as read back now.
    dedupe = Deduper(ttl_s=100, max_entries=2)
    dedupe.check_and_remember(a, 0.0, at("ol", 0))
    dedupe.check_and_remember(b, 50.0, at("ol", 0))
    dedupe.remember_settled(a, 120.0, "ol", 0)
    dedupe.check_and_remember(c, 121.0, at("ol", 0))  # full: evicts b, the oldest
    assert dedupe.check_and_remember(a, 122.0, at("ol", 0)) is True
