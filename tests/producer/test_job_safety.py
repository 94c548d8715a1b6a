"""``lineage_job`` never breaks the function it observes, whatever the configuration."""

from __future__ import annotations

import logging
import os

import pytest

from producer import job
from producer.config import ProducerConfig
from producer.job import lineage_job
from tests.support.spec import validator

RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"


class Recorder:
    """A sender that keeps what it is given (``lineage_job`` accepts anything with ``emit``)."""

    def __init__(self) -> None:
        self.config = ProducerConfig(bootstrap_servers="k:1")
        self.events: list[dict] = []

    def emit(self, event: dict) -> None:
        self.events.append(event)


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    """A process with no lineage configuration at all, and no default producer yet."""
    for var in list(os.environ):
        if var.startswith("OPENLINEAGE"):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(job, "_default", None)


def test_without_configuration_the_function_runs_and_config_is_read_once(no_config, monkeypatch, caplog):
    builds = []
    real = job.LineageProducer

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(job, "LineageProducer", counting)
    caplog.set_level(logging.WARNING, "producer.job")

    @lineage_job()
    def work(x):
        return x * 2

    assert work(2) == 4 and work(3) == 6
    with lineage_job("ctx") as run:
        assert run.run_id
    assert len(builds) == 1
    warnings = [r.getMessage() for r in caplog.records if "lineage_disabled" in r.getMessage()]
    assert len(warnings) == 1 and "bootstrap_servers" in warnings[0] and "fix=" in warnings[0]


def test_an_unwritable_journal_dir_does_not_break_the_function(no_config, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("LINEAGE_RELAY_JOURNAL_DIR", str(blocker / "journal"))

    @lineage_job()
    def work():
        return "done"

    assert work() == "done"
    assert isinstance(job.default_producer(), job.NoLineage)


def test_a_bad_librdkafka_number_does_not_break_the_function(no_config, monkeypatch, caplog):
    """A property the producer reads as a number, set to text: the job runs without lineage
    and the one warning names the property."""
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__PROPERTIES__MESSAGE_MAX_BYTES", "abc")
    caplog.set_level(logging.WARNING, "producer.job")

    @lineage_job()
    def work():
        return "done"

    assert work() == "done"
    assert isinstance(job.default_producer(), job.NoLineage)
    warnings = [r.getMessage() for r in caplog.records if "lineage_disabled" in r.getMessage()]
    assert len(warnings) == 1 and "message.max.bytes must be a whole number of bytes" in warnings[0]


def test_a_malformed_parent_id_is_ignored(monkeypatch, caplog):
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", "not-a-parent-id")
    caplog.set_level(logging.WARNING, "producer.config")
    sender = Recorder()

    @lineage_job(producer=sender)
    def work():
        return "done"

    assert work() == "done" and work() == "done"
    assert [e["eventType"] for e in sender.events] == ["START", "COMPLETE"] * 2
    assert all("parent" not in e["run"]["facets"] for e in sender.events)
    assert sum("OPENLINEAGE_PARENT_ID" in r.getMessage() for r in caplog.records) == 1


def test_a_bad_run_id_or_parent_raises_where_lineage_job_is_constructed():
    """Mistakes in lineage_job's own arguments raise at construction, never at an entry
    (a nested lineage_job under a run with a bad run_id raised into the job)."""
    sender = Recorder()
    with pytest.raises(ValueError, match="run_id must be a UUID"):
        lineage_job("outer", producer=sender, run_id="not-a-uuid")
    for bad in (("ns", "p", "{{ run_id }}"), "ns/p/{{ run_id }}", ("ns", "p"), ("", "p", RUN_ID), 42):
        with pytest.raises(ValueError, match="parent"):
            lineage_job("j", producer=sender, parent=bad)
        with pytest.raises(ValueError, match="root_parent|parent id"):
            lineage_job("j", producer=sender, parent=("ns", "p", RUN_ID), root_parent=bad)
    upper = "{" + RUN_ID.upper() + "}"
    with lineage_job("outer", producer=sender, run_id=upper) as outer:
        with lineage_job("inner", producer=sender):
            pass
    with lineage_job("j", producer=sender, parent=("ns", "p", upper), root_parent=["ns", "r", upper]):
        pass
    assert outer.run_id == RUN_ID
    assert [(e["job"]["name"], e["eventType"]) for e in sender.events] == [
        ("outer", "START"), ("inner", "START"), ("inner", "COMPLETE"), ("outer", "COMPLETE"), ("j", "START"),
        ("j", "COMPLETE")]
    assert sender.events[1]["run"]["facets"]["parent"]["run"]["runId"] == RUN_ID
    assert sender.events[4]["run"]["facets"]["parent"]["root"]["run"]["runId"] == RUN_ID
    for event in sender.events:
        validator().validate(event)


def test_a_parent_facet_that_cannot_be_built_costs_the_facet_not_the_job(caplog):
    sender = Recorder()
    with lineage_job("outer", producer=sender) as outer:
        outer.run_id = "changed-by-the-job"   # what the inner run's parent facet is built from
        with lineage_job("inner", producer=sender) as inner:
            body_ran = True
        outer.run_id = RUN_ID
    assert body_ran and inner.parent is None
    start = next(e for e in sender.events if e["job"]["name"] == "inner")
    assert "parent" not in start["run"]["facets"]
    validator().validate(start)
    assert "event=lineage_parent_failed job=inner" in caplog.text


def test_an_exception_whose_str_raises_still_emits_fail():
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    sender = Recorder()
    with pytest.raises(Unprintable):
        with lineage_job("j", producer=sender):
            raise Unprintable()
    assert [e["eventType"] for e in sender.events] == ["START", "FAIL"]
    error = sender.events[1]["run"]["facets"]["errorMessage"]
    assert error["message"] == "Unprintable: <exception str() failed>"
    assert "raise Unprintable()" in error["stackTrace"]
    validator().validate(sender.events[1])


def test_openlineage_disabled_needs_no_configuration(no_config, monkeypatch, caplog):
    """The OpenLineage clients' switch: no transport, no error, one info line."""
    from producer import disabled
    from producer.disabled import DisabledProducer
    from producer.kafka import LineageProducer

    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    monkeypatch.setattr(disabled, "_disabled_logged", False)
    caplog.set_level(logging.INFO)

    @lineage_job()
    def work():
        return "done"

    assert work() == "done"
    assert isinstance(job.default_producer(), DisabledProducer)
    assert job.default_producer().stats.emitted == 2 and job.default_producer().stats.delivered == 0
    explicit = LineageProducer(bootstrap_servers="127.0.0.1:1")
    assert isinstance(explicit, DisabledProducer) and explicit.stats.mode == "disabled"
    assert caplog.text.count("event=lineage_disabled reason=OPENLINEAGE_DISABLED=true") == 1
    assert "bootstrap_servers" not in caplog.text


def test_a_disabled_producer_has_a_usable_config(no_config, monkeypatch):
    from producer.kafka import DisabledProducer, LineageProducer  # where the README names it

    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert LineageProducer().config.topic == "openlineage"
    assert LineageProducer(topic="mine").config.topic == "mine"
    given = ProducerConfig(bootstrap_servers="k:1", topic="given")
    assert LineageProducer(given).config == given
    assert DisabledProducer().config.close_timeout_s == 10.0


def test_a_disabled_producer_answers_every_public_method(no_config, monkeypatch):
    """settle() (what the openlineage-python transport calls after each emit) raised
    AttributeError on a DisabledProducer: every emit logged flush_after_emit_failed."""
    from producer.kafka import LineageProducer

    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    disabled = LineageProducer(bootstrap_servers="127.0.0.1:1")
    disabled.emit({"eventType": "START"})
    assert disabled.settle(1) == 0 and disabled.flush(1) == 0 and disabled.pending == 0
    disabled.close(1)
    assert disabled.stats.emitted == 1


def test_a_subclass_of_lineage_producer_honours_openlineage_disabled(no_config, monkeypatch, tmp_path):
    from producer.disabled import DisabledProducer
    from producer.kafka import LineageProducer

    class Mine(LineageProducer):
        def emit(self, event: dict) -> None:
            super().emit({**event, "mine": True})

        def team(self) -> str:
            return "data"

    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    mine = Mine(bootstrap_servers="127.0.0.1:1", journal_dir=tmp_path / "journal")
    assert isinstance(mine, Mine) and isinstance(mine, DisabledProducer) and mine.team() == "data"
    mine.emit({"eventType": "START"})
    assert mine.stats.mode == "disabled" and mine.stats.emitted == 1 and mine.flush() == 0
    mine.close()
    assert not (tmp_path / "journal").exists()   # nothing was built
    assert type(Mine()) is type(mine)


def test_a_failure_building_the_default_producer_never_logs_its_text(no_config, monkeypatch, caplog):
    """Only a ConfigError's text (it names keys, never values) is logged; any other error's
    text could quote a configuration value."""
    def failing(*args, **kwargs):
        raise ValueError("sasl.password='hunter2-secret' cannot be used")
    monkeypatch.setattr(job, "LineageProducer", failing)
    caplog.set_level(logging.WARNING, "producer.job")
    with lineage_job("j"):
        pass
    assert "event=lineage_disabled reason=ValueError" in caplog.text and "hunter2" not in caplog.text
