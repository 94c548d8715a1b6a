"""relay.logs: every line is one JSON object, of bounded size, with the process's context."""

import json
import logging
import sys

from relay import logs
from relay.logs import EXCEPTION_CAP, FIELD_CAP, JsonFormatter


def record(fields=None, exc_info=None, msg="something_happened"):
    rec = logging.LogRecord("relay.test", logging.WARNING, __file__, 1, msg, None, exc_info)
    rec.fields = fields or {}
    return rec


def line_of(rec) -> dict:
    text = JsonFormatter().format(rec)
    assert "\n" not in text
    return json.loads(text)


def test_an_ordinary_line_is_left_whole():
    out = line_of(record({"source": "t/0/1", "names": ["a", "b"], "n": 3}))
    assert out["event"] == "something_happened" and out["names"] == ["a", "b"] and out["n"] == 3
    assert "truncated" not in out


def test_a_huge_field_is_cut_with_a_marker_and_named():
    out = line_of(record({"huge": "x" * 3_000_000, "list": [f"name{i}" for i in range(100_000)], "small": "s"}))
    assert out["truncated"] == ["huge", "list"] and out["small"] == "s"
    assert out["huge"].startswith("x" * 1000) and "bytes cut]" in out["huge"]
    assert len(out["huge"]) < FIELD_CAP + 100
    assert out["list"].startswith('["name0","name1"') and len(out["list"]) < FIELD_CAP + 100
    assert len(json.dumps(out)) < 3 * FIELD_CAP


def test_multibyte_text_is_cut_on_a_character_boundary():
    out = line_of(record({"text": "é" * 20_000}))
    assert set(out["text"].split(" ...[")[0]) == {"é"} and len(out["text"].encode()) < FIELD_CAP + 100


def test_a_deep_traceback_keeps_its_start_and_its_end():
    def chain(n):  # each cause's traceback is printed: a long chain, no repeated frames collapsed
        if n == 0:
            raise KeyError("the first cause")
        try:
            chain(n - 1)
        except LookupError as err:
            raise (ValueError if n == 300 else IndexError)(f"cause {n}" if n < 300 else "the innermost error") \
                from err

    try:
        chain(300)
    except ValueError:
        exc_info = sys.exc_info()
    out = line_of(record(exc_info=exc_info))
    assert out["truncated"] == ["exception"]
    assert out["exception"].startswith("Traceback (most recent call last):") and "the first cause" in out["exception"]
    assert out["exception"].rstrip().endswith("ValueError: the innermost error")
    assert EXCEPTION_CAP - 100 < len(out["exception"]) < EXCEPTION_CAP + 100


def test_an_ordinary_traceback_is_whole():
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        out = line_of(record(exc_info=sys.exc_info()))
    assert "truncated" not in out and out["exception"].endswith("RuntimeError: a bug")


def test_a_string_orjson_refuses_still_makes_a_json_line():
    out = line_of(record({"name": "bad \udc80 surrogate"}))
    assert out["name"] == "bad \udc80 surrogate"


def test_the_log_context_goes_to_a_child_through_the_environment(monkeypatch):
    monkeypatch.setattr(logs, "_context", {})
    assert logs.context_env() == {}
    logs.set_log_context(worker=3)
    env = logs.context_env()
    monkeypatch.setattr(logs, "_context", {})
    monkeypatch.setenv(logs.LOG_CONTEXT_ENV, env[logs.LOG_CONTEXT_ENV])
    logs.inherit_log_context()
    assert line_of(record())["worker"] == 3
    monkeypatch.setattr(logs, "_context", {})
    monkeypatch.setenv(logs.LOG_CONTEXT_ENV, "not json")
    logs.inherit_log_context()  # left out, never raises
    assert "worker" not in line_of(record())


def test_the_text_line_quotes_control_characters_so_a_terminal_does_not_run_them():
    """Event fields come from producers: ESC, BEL, backspace and C1 controls (CSI) are
    written escaped, never raw; a plain word stays bare."""
    fields = {"job": "etl\x1b]0;owned\x07\x1b[2K\x1b[1Afake", "detail": "x\x08\x08ok", "c1": "a\x9b2Jb",
              "del": "a\x7fb", "nested": {"k": "v\x9bw"}, "plain": "spark-prod", "accent": "café"}
    line = logs.TextFormatter().format(record(fields))
    assert line.isprintable()
    words = dict(w.split("=", 1) for w in line.split(" ")[2:])
    assert json.loads(words["job"]) == fields["job"] and json.loads(words["c1"]) == "a\x9b2Jb"
    assert json.loads(words["detail"]) == "x\x08\x08ok" and json.loads(words["del"]) == "a\x7fb"
    assert json.loads(words["nested"]) == {"k": "v\x9bw"}
    assert words["plain"] == "spark-prod" and words["accent"] == "café"
