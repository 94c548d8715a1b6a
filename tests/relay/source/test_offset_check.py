"""The check of newly assigned partitions' committed offsets (relay.source.offset_check,
through KafkaSource._checked): its decisions, edge cases included (auto.offset.reset's
spellings, nothing committed, a failed check), against a consumer that answers given
offsets. End to end, against a real broker (retention through a proxy that moves the log
start, a recreated topic): see tests/relay/test_relay_offset_reset.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from relay.source import offset_check
from relay.source.kafka import KafkaSource
from relay.source.offset_check import out_of_range

INVALID = -1001  # librdkafka's "no committed offset"


class Answers:
    """What the broker would answer: committed offsets and (low, high) watermarks."""

    def __init__(self, committed: dict[int, int], marks: dict[int, tuple[int, int]], fail_at: int | None = None,
                 on_ask=None):  # noqa: ANN001
        self._committed, self._marks, self._fail_at = committed, marks, fail_at
        self._on_ask = on_ask or (lambda: None)
        self.asked: list[int] = []
        self.asked_starts: list[list[int]] = []

    def committed(self, tps, timeout):  # noqa: ANN001, ANN201
        return [TopicPartition(tp.topic, tp.partition, self._committed[tp.partition]) for tp in tps]

    def get_watermark_offsets(self, tp, timeout):  # noqa: ANN001, ANN201
        self.asked.append(tp.partition)
        self._on_ask()
        if tp.partition == self._fail_at:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
        return self._marks[tp.partition]

    def offsets_for_times(self, tps, timeout):  # noqa: ANN001, ANN201
        """ListOffsets, one request for all: a "timestamp" of OFFSET_BEGINNING asks the start,
        OFFSET_END the end."""
        assert all(tp.offset in (OFFSET_BEGINNING, OFFSET_END) for tp in tps)
        self.asked_starts.append([tp.partition for tp in tps])
        self._on_ask()
        if self._fail_at in [tp.partition for tp in tps]:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
        return [TopicPartition(tp.topic, tp.partition, self._marks[tp.partition][tp.offset == OFFSET_END])
                for tp in tps]


async def _nothing(_parts):  # noqa: ANN001, ANN202
    return {}


def source(resets: list, **properties: str) -> KafkaSource:
    return KafkaSource(bootstrap_servers="127.0.0.1:9", group_id="g", topics=("events",), properties=properties,
                       on_assign=_nothing, on_revoke=_nothing,
                       on_offset_reset=lambda topic, partition: resets.append((topic, partition)))


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition("events", p) for p in partitions]


def test_out_of_range():
    assert out_of_range(INVALID, 5, 10) is None
    assert [out_of_range(c, 5, 10) for c in (4, 5, 10, 11)] == ["before_start", None, None, "beyond_end"]


def test_a_committed_offset_before_the_start_starts_at_the_start_and_says_what_was_lost(caplog):
    resets: list = []
    src = source(resets)
    answers = Answers(committed={0: 5, 1: 40, 2: INVALID}, marks={0: (20, 50), 1: (20, 50), 2: (0, 3)})
    with caplog.at_level(logging.INFO, logger="relay"):
        out = src._checked(answers, tps(0, 1, 2))
    assert [(tp.partition, tp.offset) for tp in out] == [(0, 20), (1, TopicPartition("e", 1).offset),
                                                          (2, TopicPartition("e", 2).offset)]
    assert resets == [("events", 0)] and src.reset_at_assignment == {("events", 0)}
    [record] = [r for r in caplog.records if r.getMessage() == "offset_reset"]
    assert record.levelno == logging.WARNING
    assert {k: record.fields[k] for k in ("partition", "from_offset", "to_offset", "cause", "records_lost")} == \
        {"partition": 0, "from_offset": 5, "to_offset": 20, "cause": "before_start", "records_lost": 15}
    assert "retention.ms" in record.fields["hint"]
    # Nothing committed: nothing to check, but where it starts is asked, afterwards, of all
    # such partitions at once (the lag of a partition assigned while paused is counted from there).
    assert answers.asked == [0, 1] and answers.asked_starts == [[2]]
    assert src._starts == {("events", 0): 20, ("events", 1): 40, ("events", 2): 0}


def test_auto_offset_reset_latest_starts_at_the_end_and_error_is_left_to_librdkafka():
    resets: list = []
    answers = Answers(committed={0: 5}, marks={0: (20, 50)})
    assert [tp.offset for tp in source(resets, **{"auto.offset.reset": "latest"})._checked(answers, tps(0))] == [50]
    latest = source(resets, **{"auto.offset.reset": "latest"})
    latest._checked(Answers(committed={0: INVALID}, marks={0: (20, 50)}), tps(0))
    assert latest._starts == {("events", 0): 50}  # nothing committed: librdkafka starts at the end
    given = tps(0)
    assert source(resets, **{"auto.offset.reset": "error"})._checked(answers, given) is given
    assert resets == [("events", 0)]


def test_partitions_that_hold_their_offsets_are_assigned_as_given():
    resets: list = []
    src = source(resets)
    given = tps(0, 1)
    # Beyond the end per ListOffsets, but no reader to confirm it with a fetch: not reset.
    assert src._checked(Answers(committed={0: 10, 1: 99}, marks={0: (0, 10), 1: (0, 12)}), given) is given
    assert resets == [] and src.reset_at_assignment == frozenset()


def test_a_failed_check_is_logged_and_keeps_what_it_decided(caplog):
    resets: list = []
    src = source(resets)
    answers = Answers(committed={0: 5, 1: 5}, marks={0: (20, 50), 1: (20, 50)}, fail_at=1)
    with caplog.at_level(logging.INFO, logger="relay"):
        out = src._checked(answers, tps(0, 1))
    assert [tp.offset for tp in out] == [20, TopicPartition("e", 1).offset]
    [failed] = [r for r in caplog.records if r.getMessage() == "offset_check_failed"]
    assert failed.fields["partitions"] == "events/0,events/1" and "timed out" in failed.fields["error"].lower()


@pytest.mark.parametrize("policy", ["earliest", "smallest", "beginning"])
def test_every_spelling_of_earliest_starts_at_the_start(policy):
    resets: list = []
    out = source(resets, **{"auto.offset.reset": policy})._checked(Answers({0: 1}, {0: (7, 9)}), tps(0))
    assert [tp.offset for tp in out] == [7]


def test_a_check_out_of_time_leaves_the_rest_unchecked_and_says_which(caplog, monkeypatch):
    monkeypatch.setattr(offset_check, "OFFSET_CHECK_TIMEOUT_S", -1.0)  # its deadline is past already
    resets: list = []
    answers = Answers(committed={0: 5, 1: INVALID, 2: 5}, marks={0: (20, 50), 2: (20, 50)})
    given = tps(0, 1, 2)
    with caplog.at_level(logging.INFO, logger="relay"):
        assert source(resets)._checked(answers, given) is given
    assert resets == [] and answers.asked == []
    [late] = [r for r in caplog.records if r.getMessage() == "offset_check_incomplete"]
    assert late.fields["unchecked"] == "events/0,events/2"


def test_an_uncommitted_partition_the_broker_does_not_answer_for_costs_only_its_lag(caplog):
    """Where a partition with nothing committed starts is asked after the check of the
    committed ones, apart: its failure leaves the committed ones checked."""
    resets: list = []
    src = source(resets)
    answers = Answers(committed={0: INVALID, 1: 5}, marks={0: (0, 50), 1: (100, 200)}, fail_at=0)
    with caplog.at_level(logging.DEBUG, logger="relay"):
        out = src._checked(answers, tps(0, 1))
    assert [tp.offset for tp in out] == [TopicPartition("e", 0).offset, 100]
    assert resets == [("events", 1)] and src._starts == {("events", 1): 100}
    assert not [r for r in caplog.records if r.getMessage() == "offset_check_failed"]
    [unknown] = [r for r in caplog.records if r.getMessage() == "offset_check_starts_unknown"]
    assert unknown.levelno == logging.INFO and unknown.fields["partitions"] == "events/0"


def test_many_uncommitted_partitions_do_not_use_up_the_check_of_the_committed_ones(caplog, monkeypatch):
    """Each broker request takes a second of a 10 s budget: 40 partitions with nothing
    committed are asked in one request, after the one committed partition is checked."""
    now = [0.0]
    monkeypatch.setattr(offset_check, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def slow() -> None:
        now[0] += 1.0
    resets: list = []
    src = source(resets)
    committed = {p: INVALID for p in range(40)} | {40: 5}
    answers = Answers(committed=committed, marks={p: (0, 50) for p in range(40)} | {40: (100, 200)}, on_ask=slow)
    with caplog.at_level(logging.INFO, logger="relay"):
        out = src._checked(answers, tps(*range(41)))
    assert out[40].offset == 100 and resets == [("events", 40)]
    assert not [r for r in caplog.records if r.getMessage() == "offset_check_incomplete"]
    assert answers.asked == [40] and answers.asked_starts == [list(range(40))]
    assert src._starts == {("events", p): 0 for p in range(40)} | {("events", 40): 100}


def test_uncommitted_partitions_are_not_asked_without_time_left(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(offset_check, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def slow() -> None:
        now[0] += 11.0  # past the budget
    resets: list = []
    src = source(resets)
    answers = Answers(committed={0: INVALID, 1: 5}, marks={0: (0, 50), 1: (100, 200)}, on_ask=slow)
    assert [tp.offset for tp in src._checked(answers, tps(0, 1))][1] == 100
    assert answers.asked_starts == [] and src._starts == {("events", 1): 100}
