"""``lineage-relay dlq redrive`` re-sends only what it is told to: ``--reason``,
``--offsets`` or ``--all``. Without one it refuses (a bare command re-sent the whole
dead-letter topic); ``--dry-run`` alone previews every pending record."""

from __future__ import annotations

import re

import orjson
import pytest
import yaml

from relay.cli import main as cli
from relay.embedded.collector import RecordingCollector
from relay.embedded.sample import sample_stream
from tests.support.dead_letters import write_dead_letters
from tests.support.kafka import committed_offsets
from tests.support.relay import relay_config

pytestmark = pytest.mark.kafka


def summary_value(out: str, name: str) -> int:
    match = re.search(rf"^\s+{re.escape(name)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no {name!r} in summary:\n{out}"
    return int(match.group(1))


@pytest.fixture
def pending(kafka, tmp_path):
    """Three dead letters collector ``a`` refused, a config file, and ``a`` (fixed)."""
    dlq = kafka.new_topic("dlq")
    stream = sample_stream(1, seed=91)[:3]
    write_dead_letters(kafka.bootstrap_servers, dlq, stream, reason="collector_rejected", collector="a")
    with RecordingCollector() as a:
        config = relay_config(kafka.bootstrap_servers, "ol", {"a": a.url}, group=kafka.new_group(), dlq=dlq)
        path = tmp_path / "relay.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
        yield str(path), config, a, stream


def redrive(capsys, path: str, *args: str) -> tuple[int, str, str]:
    code = cli(["dlq", "redrive", "--config", path, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def nothing_committed(kafka, config) -> bool:
    group = f"{config.kafka.group_id}.dlq-redrive"
    return committed_offsets(kafka.bootstrap_servers, config.kafka.dlq_topic, group, 1)[0] < 0


def test_redrive_without_a_selector_refuses_naming_the_flags_and_sends_nothing(kafka, pending, capsys):
    path, config, a, _ = pending
    code, out, err = redrive(capsys, path)
    assert code == 2, out + err
    assert "lineage-relay dlq redrive: choose the records to re-drive: --reason R, --offsets P:O,... or --all" \
        in err, err
    assert "--dry-run previews" in err, err
    assert a.count == 0 and nothing_committed(kafka, config)
    assert "records scanned" not in out, "the topic was not even read"


@pytest.mark.parametrize("other", [("--reason", "collector_rejected"), ("--offsets", "0:1")])
def test_all_with_a_selector_is_refused(kafka, pending, capsys, other):
    path, config, a, _ = pending
    code, out, err = redrive(capsys, path, "--all", *other)
    assert code == 2, out + err
    assert "--all re-drives every pending record: it excludes --reason and --offsets" in err, err
    assert a.count == 0 and nothing_committed(kafka, config)


@pytest.mark.parametrize("reason", ["", "  "])
def test_an_empty_reason_is_refused_not_taken_for_every_record(kafka, pending, capsys, reason):
    path, config, a, _ = pending
    code, out, err = redrive(capsys, path, "--reason", reason)
    assert code == 2, out + err
    assert "--reason is empty: name a reason, as `dlq list` shows them" in err, err
    assert a.count == 0 and nothing_committed(kafka, config)


def test_dry_run_alone_previews_every_pending_record(kafka, pending, capsys):
    path, config, a, stream = pending
    code, out, err = redrive(capsys, path, "--dry-run")
    assert code == 0, out + err
    assert summary_value(out, "would re-drive") == len(stream) and summary_value(out, "not selected") == 0
    assert a.count == 0 and nothing_committed(kafka, config)


def test_all_redrives_every_pending_record(kafka, pending, capsys):
    path, config, a, stream = pending
    code, out, err = redrive(capsys, path, "--all")
    assert code == 0, out + err
    assert summary_value(out, "re-driven") == len(stream) and summary_value(out, "not selected") == 0
    assert sorted(map(orjson.dumps, a.events())) == sorted(orjson.dumps(orjson.loads(v)) for _, v in stream)
    group = f"{config.kafka.group_id}.dlq-redrive"
    assert committed_offsets(kafka.bootstrap_servers, config.kafka.dlq_topic, group, 1) == {0: len(stream)}
