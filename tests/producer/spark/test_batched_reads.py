"""The batched reads' long answers (producer.spark.batched_reads): read in pieces, they come
back exactly as Java holds them, emoji and all; an answer that cannot be parsed costs the
batched route for that action, never its lineage."""

from __future__ import annotations

import re

import pytest

from producer.spark import batched_reads, disable_lineage, enable_lineage, plan_reads
from tests.producer.spark.support import Recorder, drain

E = "\U0001F600"   # two UTF-16 units in Java, one code point in Python


class JavaText:
    """A Java ``CharSequence`` as py4j shows it: indices in UTF-16 units, and a lone
    surrogate (half a pair cut by ``substring``) sent as ``?`` by the JVM's UTF-8 encoder."""

    def __init__(self, text: str) -> None:
        self._units = text.encode("utf-16-le")
        self.calls: list[str] = []

    def length(self) -> int:
        return len(self._units) // 2

    def substring(self, start: int, end: int) -> str:
        self.calls.append("substring")
        text = self._units[2 * start:2 * end].decode("utf-16-le", "surrogatepass")
        return re.sub("[\ud800-\udfff]", "?", text)

    def codePointAt(self, index: int) -> int:  # noqa: N802 - Java's name
        self.calls.append("codePointAt")
        unit = int.from_bytes(self._units[2 * index:2 * index + 2], "little")
        if 0xD800 <= unit < 0xDC00 and 2 * index + 2 < len(self._units):
            low = int.from_bytes(self._units[2 * index + 2:2 * index + 4], "little")
            if 0xDC00 <= low < 0xE000:
                return 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
        return unit


@pytest.mark.parametrize("before", range(batched_reads.PIECE_CHARS - 4, batched_reads.PIECE_CHARS + 2))
def test_a_long_text_is_read_whole_whatever_straddles_a_piece_boundary(before):
    text = "a" * before + E * 3 + "?" + "b" * (batched_reads.PIECE_CHARS - 3) + E + "?" * 5 + E * 2500
    java = JavaText(text)
    assert batched_reads.read_text(java) == text


def test_a_real_question_mark_at_a_piece_end_is_kept_at_the_cost_of_one_call():
    text = "a" * (batched_reads.PIECE_CHARS - 1) + "?" + "b" * 10
    java = JavaText(text)
    assert batched_reads.read_text(java) == text
    assert java.calls == ["substring", "codePointAt", "substring"]
    plain = JavaText("a" * (batched_reads.PIECE_CHARS + 10))
    batched_reads.read_text(plain)
    assert plain.calls == ["substring", "substring"]


def test_fields_read_every_kind_of_field():
    assert batched_reads.fields("3:a" + E + "b-!4:oops0:", count=4) == [
        "a" + E + "b", None, batched_reads.Failed("oops"), ""]


@pytest.mark.parametrize("damaged", [
    "3:a??b-2:xy",      # a character sent as two: the lengths no longer line up
    "3:abc-2:x",        # truncated
    "+3:abc",           # not a length
    " 3:abc",
    "3:abcx",           # text after the last field
])
def test_a_damaged_answer_raises_instead_of_being_half_read(damaged):
    with pytest.raises(ValueError):
        batched_reads.fields(damaged, count=3)


def test_an_answer_with_more_or_fewer_fields_than_asked_raises():
    with pytest.raises(ValueError):
        batched_reads.fields("1:a1:b", count=3)
    with pytest.raises(ValueError):
        batched_reads.fields("1:a1:b1:c1:d", count=3)


def _wide_emoji_sql() -> str:
    # Runs of emoji behind 0, 1 and 2 ASCII characters: some 4000-unit cut of the helper's
    # answer (which holds this text) falls inside a surrogate pair.
    return "SELECT '" + E * 2100 + "' AS a, 'x" + E * 2100 + "' AS b, 'xy" + E * 2100 + "' AS `c" + E + "`"


def _comparable(events: list[dict], app: str) -> list[dict]:
    import json

    text = json.dumps([e for e in events if e["job"]["name"] != app], sort_keys=True)
    text = re.sub(r'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"', '"<uuid>"', text)
    text = re.sub(r'"(eventTime|jobId)": ("[^"]*"|\d+)', r'"\1": null', text)
    return json.loads(text)


def _write_events(spark, df, out: str) -> list[dict]:
    recorder = Recorder()
    enable_lineage(spark, producer=recorder, app_name="emoji")
    try:
        df.write.mode("overwrite").parquet(out)
        drain(spark)
    finally:
        disable_lineage(spark)
    return _comparable(recorder.events, "emoji")


@pytest.mark.spark
def test_a_write_whose_sql_holds_emoji_across_piece_boundaries_has_the_plain_reads_lineage(spark, tmp_path,
                                                                                          monkeypatch):
    sql = _wide_emoji_sql()
    df = spark.sql(sql)
    batched = _write_events(spark, df, str(tmp_path / "out"))
    monkeypatch.setattr(batched_reads, "helper", lambda *_args: None)
    plain = _write_events(spark, df, str(tmp_path / "out"))
    done = [e for e in batched if e["eventType"] == "COMPLETE"]
    assert len(done) == 1
    assert "extractionError" not in done[0]["run"]["facets"]
    assert done[0]["job"]["facets"]["sql"]["query"] == sql
    assert [f["name"] for f in done[0]["outputs"][0]["facets"]["schema"]["fields"]] == ["a", "b", "c" + E]
    assert batched == plain


@pytest.mark.spark
def test_a_damaged_batched_answer_costs_the_batched_route_not_the_lineage(spark, tmp_path, monkeypatch):
    """Were a long answer ever damaged on its way (a character sent as two), the action is read
    call by call: the same events as the plain reads, no extractionError."""
    df = spark.sql(_wide_emoji_sql())
    real = batched_reads.read_text

    def damaging(answer):
        return real(answer).replace(E, "??", 1)
    monkeypatch.setattr(batched_reads, "read_text", damaging)
    damaged = _write_events(spark, df, str(tmp_path / "out"))
    monkeypatch.setattr(batched_reads, "read_text", real)
    monkeypatch.setattr(batched_reads, "helper", lambda *_args: None)
    plain = _write_events(spark, df, str(tmp_path / "out"))
    assert "extractionError" not in [e for e in damaged if e["eventType"] == "COMPLETE"][0]["run"]["facets"]
    assert damaged == plain


@pytest.mark.spark
def test_the_plain_routes_plan_json_with_emoji_across_piece_boundaries_is_exactly_to_json(spark, monkeypatch):
    plan = spark.sql(_wide_emoji_sql())._jdf.queryExecution().analyzed()
    expected = plan.toJSON()
    monkeypatch.setattr(batched_reads, "helper", lambda *_args: None)
    text, length = plan_reads.plan_json(spark.sparkContext._gateway, plan, max_chars=10**8)
    assert batched_reads.PIECE_CHARS < length <= 400_000   # read in pieces
    assert text == expected
