import json
import re
import subprocess
import sys

import pytest

from relay.cli import config_from_args, main
from relay.config import build_config, load_config
from relay.errors import ConfigError
from tests.support.relay import suite_loop_args

MINIMAL = """
kafka:
  bootstrap_servers: 127.0.0.1:9092
collectors:
  - name: marquez
    url: http://marquez:5000
    token: ${MARQUEZ_TOKEN}
"""


def write(tmp_path, text):
    p = tmp_path / "relay.yaml"
    p.write_text(text)
    return p


def test_env_interpolation_keeps_secrets_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("MARQUEZ_TOKEN", "s3cr3t-token")
    cfg = load_config(write(tmp_path, MINIMAL))
    c = cfg.collectors[0]
    assert c.token.get_secret_value() == "s3cr3t-token"
    assert "s3cr3t-token" not in repr(cfg) and "s3cr3t-token" not in str(cfg.model_dump())
    assert c.target == "http://marquez:5000/api/v1/lineage"


def test_missing_env_var_names_it(tmp_path, monkeypatch):
    monkeypatch.delenv("MARQUEZ_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"collectors\.marquez\.token: environment variable MARQUEZ_TOKEN is not set"):
        load_config(write(tmp_path, MINIMAL))


TOKEN_FROM = """
kafka:
  bootstrap_servers: 127.0.0.1:9092
collectors:
  - name: marquez
    url: http://marquez:5000
    token: '%s'
"""


def token_of(tmp_path, template):
    return load_config(write(tmp_path, TOKEN_FROM % template)).collectors[0].token.get_secret_value()


@pytest.mark.parametrize("env,template,expected", [
    # Compose and Kubernetes leave a variable empty as often as unset: ":-" covers both, as in the shell.
    ("", "${MARQUEZ_TOKEN:-fallback}", "fallback"),
    (None, "${MARQUEZ_TOKEN:-fallback}", "fallback"),
    ("t0k", "${MARQUEZ_TOKEN:-fallback}", "t0k"),
    # "-" alone: only an unset variable takes the default.
    ("", "t${MARQUEZ_TOKEN-fallback}", "t"),  # (an empty token alone is refused)
    (None, "${MARQUEZ_TOKEN-fallback}", "fallback"),
    ("t0k", "Bearer ${MARQUEZ_TOKEN-x}!", "Bearer t0k!"),
    # "$${" is a literal "${"; a "$" not before "{" is kept; what a variable holds is taken as it is.
    (None, "pa$$${word}$", "pa$${word}$"),
    (None, "$${MARQUEZ_TOKEN}", "${MARQUEZ_TOKEN}"),
    ("a${b}$${c", "${MARQUEZ_TOKEN}", "a${b}$${c"),
], ids=["empty:-", "unset:-", "set:-", "empty-", "unset-", "set-", "escape", "escaped-ref", "value-kept"])
def test_env_defaults_follow_the_shell_and_dollar_dollar_brace_is_a_literal(tmp_path, monkeypatch, env, template,
                                                                               expected):
    if env is None:
        monkeypatch.delenv("MARQUEZ_TOKEN", raising=False)
    else:
        monkeypatch.setenv("MARQUEZ_TOKEN", env)
    assert token_of(tmp_path, template) == expected


@pytest.mark.parametrize("template", [
    "${MARQUEZ_TOKEN:-${FALLBACK_TOKEN}}",  # nested default: used to give "${FALLBACK_TOKEN}" + "}"
    "${MARQUEZ_TOKEN:?set the token}",      # the shell's "required" form
    "hunter2${MARQUEZ_TOKEN",               # unclosed
    "hunter2${MARQUEZ.TOKEN}",              # not a variable name
    "${}",
])
def test_a_dollar_brace_that_is_no_reference_is_refused_naming_the_key_not_the_value(tmp_path, monkeypatch,
                                                                                     template):
    monkeypatch.delenv("MARQUEZ_TOKEN", raising=False)
    monkeypatch.setenv("FALLBACK_TOKEN", "s3cr3t")
    with pytest.raises(ConfigError) as err:
        token_of(tmp_path, template)
    message = str(err.value)
    assert "\n  collectors.marquez.token: a ${ that is not" in message and "$${ for a literal ${" in message
    assert "hunter2" not in message and "s3cr3t" not in message


@pytest.mark.parametrize("servers", ["", "  ", ",", " , "])
def test_bootstrap_servers_must_name_a_broker(servers):
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers: must list at least one broker"):
        build_config({"kafka": {"bootstrap_servers": servers}, "collectors": [{"name": "m", "url": "http://a"}]})


def test_topics_from_one_comma_separated_string_are_several_and_bad_names_are_refused():
    """topics: ${TOPICS} with TOPICS=a,b was one topic named 'a,b', which Kafka refuses
    only once the relay subscribes; a name Kafka cannot take fails at start-up, with the key."""
    base = {"kafka": {"bootstrap_servers": "k:9092"}, "collectors": [{"name": "m", "url": "http://a"}]}
    config = build_config({**base, "kafka": {**base["kafka"], "topics": "ol.spark, ol.airflow"}})
    assert config.kafka.topics == ("ol.spark", "ol.airflow")
    for key, value in (("topics", ["ol", "a b"]), ("topics", []), ("dlq_topic", "dead letters"),
                       ("state_topic", "x" * 250), ("topics", "ol,")):
        with pytest.raises(ConfigError, match=rf"kafka\.{key}"):
            build_config({**base, "kafka": {**base["kafka"], key: value}})


def test_bootstrap_servers_from_an_empty_variable_is_refused_at_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "")
    path = write(tmp_path, "kafka: {bootstrap_servers: '${KAFKA_BOOTSTRAP}'}\n"
                           "collectors: [{name: m, url: 'http://m:5000'}]\n")
    assert main(["check-config", str(path)]) == 2


@pytest.mark.parametrize("key,yaml_text", [
    ("kafka.commit_interval_s", "kafka: {bootstrap_servers: k:9092, commit_interval_s: .inf}"),
    ("pipeline.dedupe.ttl_s", "kafka: {bootstrap_servers: k:9092}\npipeline: {dedupe: {ttl_s: .inf}}"),
    ("drain_timeout_s", "kafka: {bootstrap_servers: k:9092}\ndrain_timeout_s: .nan"),
    ("pipeline.ordering.hold_timeout_s", "kafka: {bootstrap_servers: k:9092}\n"
                                         "pipeline: {ordering: {hold_timeout_s: .inf}, lookback: {search_records: 0}}"),
    ("collectors.m.timeout_s", "kafka: {bootstrap_servers: k:9092}\n"
                               "collectors: [{name: m, url: 'http://m:5000', timeout_s: .inf}]"),
])
def test_an_infinite_or_nan_number_is_refused_naming_the_key(tmp_path, key, yaml_text):
    if "collectors" not in yaml_text:
        yaml_text += "\ncollectors: [{name: m, url: 'http://m:5000'}]"
    with pytest.raises(ConfigError, match=re.escape(key) + r": Input should be a finite number; fix: write a finite"):
        load_config(write(tmp_path, yaml_text + "\n"))


@pytest.mark.parametrize("patch,message", [
    ({"kafka": {"bootstrap_servers": "x", "topicz": "a"}}, r"kafka\.topicz: unknown key; did you mean topics\? "
                                                            r"fix: rename it, or remove it"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "marquez:5000"}]},
     r"collectors\.m\.url: must be an http:// or https:// base URL"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a", "concurrency": 0}]},
     r"collectors\.m\.concurrency"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": []}, r"at least one collector"),
    ({"collectors": [{"name": "m", "url": "http://a"}]}, r"kafka: Field required; fix: add it"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"},
                                                          {"name": "m", "url": "http://b"}]}, r"repeated: m"),
    ({"kafka": {"bootstrap_servers": "x", "dlq_topic": "openlineage"},
      "collectors": [{"name": "m", "url": "http://a"}]}, r"kafka\.dlq_topic"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"ordering": {"on_hold_timeout": "explode"}}}, r"pipeline\.ordering\.on_hold_timeout"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"decode_processes": 0}}, r"pipeline\.decode_processes"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"decode_priority": "fast"}}, r"pipeline\.decode_priority"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"ordering": {"hold_timeout_s": 5}, "lookback": {"search_after_s": 5}}},
     r"lookback\.search_after_s \(5\) must be below ordering\.hold_timeout_s \(5\).*search_records: 0"),
])
def test_bad_config_names_the_key(patch, message):
    with pytest.raises(ConfigError, match=message):
        build_config(patch)


def test_check_config_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MARQUEZ_TOKEN", "t")
    good = write(tmp_path, MINIMAL)
    assert main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("url:", "ur1:"))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "collectors.marquez.ur1: unknown key; did you mean url? fix: rename it" in err
    # What `run` would refuse when it builds the collector, check-config refuses too.
    monkeypatch.setenv("MARQUEZ_TOKEN", "first-line\nsecond-line")
    assert main(["check-config", str(good)]) == 2
    err = capsys.readouterr().err
    assert "collectors.marquez.token" in err and "line break" in err and "first-line" not in err


def test_cli_flags_build_the_same_config_without_a_file():
    import argparse

    from relay.cli import _add_relay_flags

    p = argparse.ArgumentParser()
    _add_relay_flags(p)
    args = p.parse_args(["--bootstrap-servers", "127.0.0.1:9092", "--topic", "openlineage", "--group-id", "g",
                         "--collector", "marquez=http://127.0.0.1:5000", "--collector", "backup=http://127.0.0.1:5001",
                         "--dlq-topic", "openlineage.dlq", "--http-port", "9108",
                         "--consumer-property", "session.timeout.ms=6000"])
    cfg = config_from_args(args)
    assert [c.name for c in cfg.collectors] == ["marquez", "backup"]
    assert cfg.kafka.consumer_properties == {"session.timeout.ms": "6000"}
    assert cfg.kafka.topics == ("openlineage",) and cfg.http.port == 9108


def test_a_topic_flag_may_list_several_topics_separated_by_commas_as_the_file_may():
    import argparse

    from relay.cli import _add_relay_flags

    p = argparse.ArgumentParser()
    _add_relay_flags(p)
    args = p.parse_args(["--bootstrap-servers", "127.0.0.1:9092", "--topic", "a, b", "--topic", "c",
                         "--collector", "m=http://127.0.0.1:5000"])
    assert config_from_args(args).kafka.topics == ("a", "b", "c")


def test_console_script_reports_bad_flag_and_exits_nonzero():
    out = subprocess.run([sys.executable, "-m", "relay", "run", "--bootstrap-servers", "x",
                          "--collector", "marquez"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--collector: expected NAME=URL, e.g. --collector marquez=http://127.0.0.1:5000 (no =)" in out.stderr


def test_run_without_any_configuration_says_what_it_needs():
    out = subprocess.run([sys.executable, "-m", "relay", "run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--config relay.yaml" in out.stderr and "--bootstrap-servers" in out.stderr and "--collector" in out.stderr


def _collector(**extra):
    return {"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a", **extra}]}


def test_delivery_mode_and_its_knobs():
    cfg = build_config(_collector(mode="consolidated", consolidation={"settle_s": 5,
                                                                      "missing_start": {"policy": "forward"}}))
    c = cfg.collectors[0]
    assert c.mode == "consolidated" and c.consolidation.settle_s == 5
    assert c.consolidation.missing_start.policy == "forward" and c.consolidation.missing_start.timeout_s == 30
    assert cfg.keeps_run_state and cfg.kafka.run_state_topic == "lineage-relay.run-state"
    assert not build_config(_collector()).keeps_run_state


@pytest.mark.parametrize("extra,message", [
    ({"mode": "batch"}, r"collectors\.m\.mode: Input should be 'passthrough', 'consolidated' or 'coalesce'"),
    ({"consolidation": {"settle_s": 1}}, r"consolidation: only used with mode consolidated or coalesce; set mode"),
    ({"mode": "coalesce", "consolidation": {"setle_s": 1}},
     r"collectors\.m\.consolidation\.setle_s: unknown key; did you mean settle_s\? fix: rename it"),
    ({"mode": "coalesce", "consolidation": {"missing_start": {"policy": "wait"}}},
     r"collectors\.m\.consolidation\.missing_start\.policy"),
    ({"mode": "consolidated", "consolidation": {"max_open_runs": 0}}, r"consolidation\.max_open_runs"),
])
def test_bad_delivery_mode_settings_name_the_key(extra, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_collector(**extra))


def test_batch_fallback_knobs_and_their_defaults():
    batch = build_config(_collector(batch={"unsupported_after": 5, "reprobe_after_s": None})).collectors[0].batch
    assert batch.unsupported_after == 5 and batch.reprobe_after_s is None
    batch = build_config(_collector(batch={})).collectors[0].batch
    assert batch.unsupported_after == 3 and batch.reprobe_after_s == 600


@pytest.mark.parametrize("batch,message", [
    ({"unsupported_after": 0}, r"collectors\.m\.batch\.unsupported_after: must be at least 1 .*set batch: null"),
    ({"reprobe_after_s": 0}, r"collectors\.m\.batch\.reprobe_after_s: must be above 0 .*or null to never"),
    ({"reprobe_after_s": -5}, r"collectors\.m\.batch\.reprobe_after_s: must be above 0"),
    ({"reprobe_after_s": float("inf")}, r"collectors\.m\.batch\.reprobe_after_s: .*fix: write a finite number"),
    ({"reprobe_after_s": True}, r"collectors\.m\.batch\.reprobe_after_s: is true or false .*fix: write a number"),
])
def test_bad_batch_fallback_settings_name_the_key_and_the_fix(batch, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_collector(batch=batch))


def test_a_held_mode_needs_exactly_one_input_topic():
    data = _collector(mode="consolidated")
    data["kafka"]["topics"] = ["a", "b"]
    with pytest.raises(ConfigError, match=r"kafka\.topics: collectors m keep run state.*one topic; fix: set mode: "
                                          r"passthrough on those collectors .*or consume one topic"):
        build_config(data)


def test_two_topics_with_atlan_say_its_mode_is_a_default_and_the_fix():
    """type: atlan holds runs without the file saying mode: the refusal says where it comes from."""
    refused = _refused({"kafka": {"bootstrap_servers": "k:9092", "topics": ["a", "b"]},
                        "collectors": [{"name": "atlan", "type": "atlan", "tenant": "acme", "connector": "spark",
                                        "token": "${ATLAN_TOKEN}"}]})
    assert re.search(r"kafka\.topics: collectors atlan keep run state .*\(type: atlan defaults to mode: "
                     r"consolidated\); fix: set mode: passthrough on those collectors .*or consume one topic", refused)


def test_collector_mode_flag():
    import argparse

    from relay.cli import _add_relay_flags

    p = argparse.ArgumentParser()
    _add_relay_flags(p)
    base = ["--bootstrap-servers", "127.0.0.1:9092", "--collector", "marquez=http://127.0.0.1:5000"]
    cfg = config_from_args(p.parse_args([*base, "--collector-mode", "marquez=coalesce"]))
    assert cfg.collectors[0].mode == "coalesce"
    with pytest.raises(ConfigError, match=r"--collector-mode backup=consolidated: no collector named 'backup'"):
        config_from_args(p.parse_args([*base, "--collector-mode", "backup=consolidated"]))
    with pytest.raises(ConfigError, match=r"collectors\.marquez\.mode"):
        config_from_args(p.parse_args([*base, "--collector-mode", "marquez=bulk"]))


@pytest.mark.kafka
def test_a_held_mode_with_a_missing_input_topic_fails_at_start_up_naming_it(kafka, tmp_path):
    """Held runs are partitioned like the input topic, so it must exist first: one line
    that names the key and the fix, exit 2, no traceback."""
    config = tmp_path / "relay.yaml"
    config.write_text(f"kafka:\n  bootstrap_servers: {kafka.bootstrap_servers}\n  topics: [never-created-topic]\n"
                      f"  group_id: {kafka.new_group()}\n"
                      "collectors:\n  - name: c\n    url: http://127.0.0.1:9\n    mode: consolidated\n")
    out = subprocess.run([sys.executable, "-m", "relay", "run", "--config", str(config), "--http-port", "0",
                          *suite_loop_args()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    # found once logging is set up: one JSON line (README: logs are one JSON object per line)
    [failed] = [line for line in map(json.loads, out.stderr.splitlines()) if line["level"] == "error"]
    assert failed["event"] == "config_error" and failed["exit_code"] == 2 and "exception" not in failed
    assert "kafka.topics" in failed["error"] and "never-created-topic" in failed["error"] \
        and "create it" in failed["error"]


def test_decode_priority_auto_is_idle_only_when_every_collector_posts_each_event():
    from relay.metrics import RelayMetrics
    from relay.process import decode_priority
    from relay.sinks.kinds import build_collector

    def collectors(*specs):
        config = build_config({"kafka": {"bootstrap_servers": "x"}, "collectors": list(specs)})
        return [build_collector(c, RelayMetrics().for_collector(c.name)) for c in config.collectors]

    per_event = collectors({"name": "m", "type": "marquez", "url": "http://a"}, {"name": "h", "url": "http://b"})
    with_batch = collectors({"name": "m", "url": "http://a"},
                            {"name": "b", "url": "http://b", "batch": {"max_events": 100}})
    assert decode_priority("auto", per_event) == "idle"
    assert decode_priority("auto", with_batch) == "low"
    assert decode_priority("low", per_event) == "low"
    assert decode_priority("idle", with_batch) == "idle"


def test_version_names_the_relay_and_what_a_bug_report_needs(capsys):
    import confluent_kafka

    from relay import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"lineage-relay {__version__} (")
    assert f"librdkafka {confluent_kafka.libversion()[0]}" in out and "Python 3." in out


def _kafka(**kafka: object) -> dict:
    return {"kafka": {"bootstrap_servers": "x", **kafka}, "collectors": [{"name": "m", "url": "http://a"}]}


@pytest.mark.parametrize(("kafka", "message"), [
    ({"consumer_properties": {"fetch.wait.maxx.ms": 100}},
     r'kafka\.consumer_properties: fetch\.wait\.maxx\.ms: No such configuration property: "fetch\.wait\.maxx\.ms"; '
     r"fix: check it against librdkafka's CONFIGURATION\.md"),
    ({"consumer_properties": {"auto.offset.reset": "earlest"}},
     r'kafka\.consumer_properties: auto\.offset\.reset: Invalid value "<value>"'),
    ({"producer_properties": {"acks": "most"}}, r"kafka\.producer_properties: acks: the relay writes dead letters .*"
                                                r"fix: remove it \(the relay sets all\), or set it to all"),
    # A producer property among the consumer's (named as written, not by librdkafka's alias).
    ({"consumer_properties": {"session.timeout.ms": 6000, "linger.ms": 5}},
     r"kafka\.consumer_properties: linger\.ms: a producer property, which the consumer ignores; "
     r"fix: move it to producer_properties"),
    ({"producer_properties": {"fetch.wait.max.ms": 10}},
     r"kafka\.producer_properties: fetch\.wait\.max\.ms: a consumer property, which the producer ignores"),
    # KIP-848: librdkafka takes it, then refuses the relay's own session.timeout.ms at start-up.
    ({"consumer_properties": {"group.protocol": "consumer"}},
     r"kafka\.consumer_properties: group\.protocol: only classic is supported .*; fix: remove it"),
])
def test_librdkafka_properties_are_checked_when_the_config_is_read(kafka, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_kafka(**kafka))


def test_good_librdkafka_properties_pass_and_files_are_left_to_start_up():
    config = build_config(_kafka(
        consumer_properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u",
                             "sasl.password": "p", "session.timeout.ms": 6000, "message.max.bytes": 20_000_000,
                             # mounted where the relay runs, not where its config is checked
                             "ssl.ca.location": "/var/run/secrets/kafka/ca.pem"},
        producer_properties={"linger.ms": 20, "enable.idempotence": True}))
    assert config.kafka.consumer_properties["ssl.ca.location"] == "/var/run/secrets/kafka/ca.pem"
    assert config.kafka.producer_properties["enable.idempotence"] == "true"


def test_a_refused_secret_is_named_not_repeated():
    # An inline private key librdkafka cannot read: the message names the key only.
    pem = "-----BEGIN PRIVATE KEY-----\nbm90YWtleQ==\n-----END PRIVATE KEY-----\n"
    with pytest.raises(ConfigError) as refused:
        build_config(_kafka(consumer_properties={"security.protocol": "SSL", "ssl.key.pem": pem}))
    assert "kafka.consumer_properties: ssl.key.pem: librdkafka refused the value of ssl.key.pem" in str(refused.value)
    assert "bm90YWtleQ" not in str(refused.value)


def test_a_bad_boolean_is_named():
    with pytest.raises(ConfigError, match=r'kafka\.consumer_properties: enable\.partition\.eof: Expected bool value'):
        build_config(_kafka(consumer_properties={"enable.partition.eof": "maybe"}))


def test_a_held_run_is_searched_for_before_its_hold_times_out():
    def after(ordering: dict, lookback: dict) -> float:
        return build_config({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
                             "pipeline": {"ordering": ordering, "lookback": lookback}}).pipeline.search_after_s
    assert after({}, {}) == 5.0
    assert after({"hold_timeout_s": 2}, {}) == 1.0  # a short hold: searched at half of it
    assert after({"hold_timeout_s": 2}, {"search_after_s": 0.5}) == 0.5
    assert after({"hold_timeout_s": 2}, {"search_after_s": 3, "search_records": 0}) == 3  # no search: no conflict


def test_numbers_with_a_leading_zero_or_a_colon_stay_as_written(tmp_path):
    """YAML 1.1 reads 0755 as octal (493) and 12:30 as base 60 (750): a property, a numeric
    password or an id with a leading zero reached librdkafka changed. Read as YAML 1.2 does."""
    config = load_config(write(tmp_path, "kafka:\n  bootstrap_servers: k:9092\n  consumer_properties:\n"
                                         "    client.id: 0755\n    client.rack: 12:30\n    fetch.wait.max.ms: 50\n"
                                         "  commit_interval_s: 0.5\n"
                                         "collectors: [{name: m, url: 'http://m:5000', timeout_s: 7}]\n"))
    props = config.kafka.consumer_properties
    assert (props["client.id"], props["client.rack"], props["fetch.wait.max.ms"]) == ("0755", "12:30", "50")
    assert config.kafka.commit_interval_s == 0.5 and config.collectors[0].timeout_s == 7


# -- refused at start-up what only failed at run (each names the key and the fix, never a value) --


def _argparser():
    import argparse

    from relay.cli import _add_relay_flags

    p = argparse.ArgumentParser()
    _add_relay_flags(p)
    return p


def _refused(data: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        build_config(data)
    return str(refused.value)


@pytest.mark.parametrize("group_id", ["", "  "])
def test_an_empty_group_id_is_refused_not_left_to_abort_librdkafka(tmp_path, monkeypatch, capsys, group_id):
    """librdkafka aborted the process (an assertion, exit 134) on an empty group.id."""
    message = _refused(_kafka(group_id=group_id))
    assert "kafka.group_id: must not be empty" in message and "${NAME:-lineage-relay}" in message
    monkeypatch.setenv("GROUP_ID", group_id)
    path = write(tmp_path, "kafka: {bootstrap_servers: 'k:9092', group_id: '${GROUP_ID}'}\n"
                           "collectors: [{name: m, url: 'http://m:5000'}]\n")
    assert main(["check-config", str(path)]) == 2
    assert "kafka.group_id: must not be empty" in capsys.readouterr().err


def test_an_empty_inline_token_is_refused_like_an_empty_token_env(tmp_path, monkeypatch, capsys):
    """token: ${ATLAN_TOKEN} with the variable empty passed 'needs credentials': every event got 401."""
    monkeypatch.setenv("ATLAN_TOKEN", "")
    path = write(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n"
                           "collectors: [{name: a, type: atlan, tenant: acme, connector: spark, "
                           "token: '${ATLAN_TOKEN}'}]\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "collectors.a.token: is empty" in err and "set the variable, or remove token" in err
    assert "token" in _refused(_collector(token="   "))  # blanks only: as empty


def test_a_collector_name_repeated_in_flags_is_refused():
    p = _argparser()
    args = p.parse_args(["--bootstrap-servers", "k:9092", "--collector", "m=http://a:5000",
                         "--collector", "m=http://b:5000"])
    with pytest.raises(ConfigError, match=r"--collector: names must be unique, repeated: m; give each"):
        config_from_args(args)


@pytest.mark.parametrize("collector,message", [
    ({"type": "marquez", "url": "http://h:5000/api/v1/lineage"},
     r"collectors\.m: url: its path ends with the endpoint /api/v1/lineage, which the relay appends.*"
     r"fix: remove the endpoint /api/v1/lineage from url"),
    ({"url": "http://h:5000/proxy/api/v1/lineage/"}, r"url: its path ends with the endpoint /api/v1/lineage"),
    ({"type": "datahub", "url": "http://gms:8080/openapi/openlineage/api/v1/lineage"},
     r"url: its path ends with the endpoint /openapi/openlineage/api/v1/lineage"),
    ({"url": "http://h:5000/?tenant=hunter2"}, r"collectors\.m\.url: has a query string .*give the base URL alone"),
    ({"url": "http://h:5000/#hunter2"}, r"collectors\.m\.url: has a fragment"),
    ({"url": "http://user:hunter2@h:5000"}, r"collectors\.m\.url: holds credentials .*give them as token"),
    ({"url": "http://h:99999"}, r"collectors\.m\.url: has a port that is not a number from 1 to 65535"),
    ({"url": "http://h:0"}, r"collectors\.m\.url: has a port that is not"),
    ({"url": "http://h:hunter2"}, r"collectors\.m\.url: has a port that is not"),
    ({"url": "http://h:5000\nhunter2"}, r"collectors\.m\.url: holds a space, a line break or a control character"),
])
def test_a_collector_url_must_be_a_base_url(collector, message):
    refused = _refused({"kafka": {"bootstrap_servers": "k:9092"}, "collectors": [{"name": "m", **collector}]})
    assert re.search(message, refused), refused
    assert "hunter2" not in refused


@pytest.mark.parametrize("collector,message", [
    # An Azure Function's key as code= passed, then batches went to ...?code=KEY/batch and the
    # batch fallback's log lines printed the key.
    ({"endpoint": "/api/lineage?code=hunter2", "batch": {}},
     r"collectors\.m\.endpoint: holds a query string \(\?\.\.\.\) or a fragment \(#\.\.\.\): the relay appends "
     r"/batch to it.*fix: give the path alone, and send the collector's key in headers"),
    ({"endpoint": "/api/lineage?code=hunter2"}, r"collectors\.m\.endpoint: holds a query string"),
    ({"endpoint": "/api/lineage#hunter2"}, r"collectors\.m\.endpoint: holds a query string \(\?\.\.\.\) or a fragment"),
    ({"endpoint": "/api/v1/lineage\n"}, r"collectors\.m\.endpoint: holds a space, a line break or a control "
                                        r"character .*write the path alone, such as /api/v1/lineage"),
    ({"endpoint": "/api/ v1"}, r"collectors\.m\.endpoint: holds a space"),
    ({"endpoint": "api/v1/lineage"}, r"collectors\.m\.endpoint: must start with '/'"),
    ({"batch": {"endpoint": "/api/lineage/batch?code=hunter2"}},
     r"collectors\.m\.batch\.endpoint: holds a query string \(\?\.\.\.\) or a fragment \(#\.\.\.\): "
     r"a key in it would be written wherever the URL is logged"),
    ({"batch": {"endpoint": "/b\n"}}, r"collectors\.m\.batch\.endpoint: holds a space, a line break"),
    ({"batch": {"endpoint": "b"}}, r"collectors\.m\.batch\.endpoint: must start with '/'"),
    # A connector is one path segment: a final newline (read from a file) is not.
    ({"type": "atlan", "url": None, "tenant": "acme", "connector": "spark\n", "token": "t"},
     r"collectors\.m: connector: must be one path segment"),
])
def test_an_endpoint_is_a_path_alone(collector, message):
    data = {"name": "m", "url": "http://h:5000", **collector}
    refused = _refused({"kafka": {"bootstrap_servers": "k:9092"},
                        "collectors": [{k: v for k, v in data.items() if v is not None}]})
    assert re.search(message, refused), refused
    assert "hunter2" not in refused


def test_a_base_url_keeps_a_path_prefix():
    """A reverse proxy's prefix stays: only a path that already ends with the endpoint is refused."""
    for url, target in (("http://h/marquez", "http://h/marquez/api/v1/lineage"),
                        ("http://h:5000/", "http://h:5000/api/v1/lineage"),
                        ("https://h/api/v1", "https://h/api/v1/api/v1/lineage")):
        assert build_config(_collector(url=url)).collectors[0].target == target
    assert build_config(_collector(url="http://h/lineage", endpoint="/api/v1/lineage")).collectors[0].target \
        == "http://h/lineage/api/v1/lineage"


@pytest.mark.parametrize("extra,message", [
    ({"headers": {"X-Api-Key": "hunter2\n"}},
     r"collectors\.m\.headers: X-Api-Key: the value holds a line break or a control character.*set the value alone"),
    ({"headers": {"X-Api-Key": "hun\x00ter2"}}, r"collectors\.m\.headers: X-Api-Key: the value holds"),
    ({"headers": {"X Api Key": "hunter2"}}, r"collectors\.m\.headers: a header name holds a space"),
    ({"headers": {"": "hunter2"}}, r"collectors\.m\.headers: a header name"),
    ({"headers": {"x-api-key": "hunter2", "X-API-KEY": "hunter2"}}, r"collectors\.m\.headers: x-api-key: given more"),
    ({"auth_header": ""}, r"collectors\.m\.auth_header: must be an HTTP header name"),
    ({"auth_header": "X-Token\n"}, r"collectors\.m\.auth_header: must be an HTTP header name"),
    # The relay's own headers: the token in content-type went beside the relay's Content-Type.
    ({"token": "hunter2", "auth_header": "content-type"},
     r"collectors\.m\.auth_header: content-type: the relay sets this header itself .*twice.*fix: send the token in"),
    ({"token": "hunter2", "auth_header": "User-Agent"}, r"collectors\.m\.auth_header: User-Agent: the relay sets"),
    ({"token": "hunter2", "auth_header": "Content-Length"}, r"collectors\.m\.auth_header: Content-Length: the relay"),
    ({"token": "hunter2", "auth_header": "Accept-Encoding"}, r"collectors\.m\.auth_header: Accept-Encoding: the"),
    ({"auth_scheme": "Bearer\n"}, r"collectors\.m\.auth_scheme: holds a line break"),
    ({"token": "t", "headers": {"authorization": "Basic hunter2"}},
     r"collectors\.m: headers\.authorization: the token is sent in this header \(auth_header\), and would replace it; "
     r"fix: remove it from headers"),
    ({"token_env": "TOK", "auth_header": "X-Api-Key", "headers": {"X-API-KEY": "hunter2"}},
     r"headers\.X-API-KEY: the token is sent in this header"),
    # The relay frames the body and reads the answers itself: Transfer-Encoding was answered
    # 400 (every event dead-lettered); with Accept-Encoding, a gzip batch reply was not read,
    # so the events it listed as failed counted as delivered.
    ({"headers": {"Transfer-Encoding": "chunked"}},
     r"collectors\.m\.headers: Transfer-Encoding: the relay sets this header itself.*fix: remove it from headers"),
    ({"headers": {"accept-encoding": "gzip"}}, r"collectors\.m\.headers: accept-encoding: the relay sets this"),
    # ${API_KEY} with API_KEY set but empty: every request carried 'X-Api-Key: ' (401s).
    ({"headers": {"X-Api-Key": ""}}, r"collectors\.m\.headers: X-Api-Key: the value is empty or blank.*fix: give it a "
                                     r"value, or remove the header"),
    ({"headers": {"X-Api-Key": "  "}}, r"collectors\.m\.headers: X-Api-Key: the value is empty or blank"),
])
def test_collector_headers_that_no_request_could_carry_are_refused_naming_the_header(extra, message):
    refused = _refused(_collector(**extra))
    assert re.search(message, refused), refused
    assert "hunter2" not in refused


def test_good_headers_pass():
    c = build_config(_collector(headers={"X-Api-Key": "k-123", "X-Tenant": "a\tb"}, token="t",
                                auth_header="X-Token", auth_scheme="")).collectors[0]
    assert c.headers == {"X-Api-Key": "k-123", "X-Tenant": "a\tb"} and c.auth_header == "X-Token"


@pytest.mark.parametrize("properties,message", [
    ({"acks": 0}, r"kafka\.producer_properties: acks: the relay writes dead letters and run state idempotently, "
                  r"which needs acks: all; fix: remove it \(the relay sets all\), or set it to all"),
    ({"acks": 1}, r"kafka\.producer_properties: acks: .*fix: remove it"),
    ({"request.required.acks": "0"}, r"kafka\.producer_properties: request\.required\.acks: .*fix: remove it"),
    ({"enable.idempotence": False}, r"kafka\.producer_properties: enable\.idempotence: .*fix: remove it"),
    # What librdkafka refuses only with the relay's own defaults (enable.idempotence: true) applied.
    ({"max.in.flight.requests.per.connection": 10},
     r"kafka\.producer_properties: .*max\.in\.flight.*enable\.idempotence.*the relay's producers set "
     r"enable\.idempotence: true"),
    ({"bootstrap.servers": "k:9092"}, r"kafka\.producer_properties: bootstrap\.servers: .*kafka\.bootstrap_servers"),
])
def test_producer_properties_are_checked_with_the_relays_own_producer_defaults(properties, message):
    """acks: 0 passed check-config, then the run failed after 15 s on enable.idempotence."""
    assert re.search(message, _refused(_kafka(producer_properties=properties)))


def test_producer_acks_all_passes():
    for acks in ("all", "-1", -1):
        assert build_config(_kafka(producer_properties={"acks": acks})).kafka.producer_properties


@pytest.mark.parametrize("key,fix", [
    ("group.id", r"fix: remove it, and set kafka\.group_id"),
    ("bootstrap.servers", r"fix: remove it, and set kafka\.bootstrap_servers"),
    ("metadata.broker.list", r"fix: remove it, and set kafka\.bootstrap_servers"),
    ("enable.auto.commit", r"fix: remove it: the relay commits offsets itself"),
    ("enable.auto.offset.store", r"fix: remove it: the relay commits offsets itself"),
])
def test_consumer_properties_the_relay_sets_itself_are_refused(key, fix):
    from relay.source.consumer_config import RELAY_SETS, consumer_config

    value = "true" if key.startswith("enable") else "hunter2:9092"
    refused = _refused(_kafka(consumer_properties={key: value}))
    assert re.search(rf"kafka\.consumer_properties: {re.escape(key)}: the relay sets it itself.*{fix}", refused)
    assert "hunter2" not in refused
    # Every property consumer_config sets over the user's is in RELAY_SETS.
    conf = consumer_config("b:9092", "g", {k: "user" for k in RELAY_SETS})
    assert {k for k in RELAY_SETS if conf.get(k, "user") != "user"} >= {"group.id", "bootstrap.servers",
                                                                        "enable.auto.commit",
                                                                        "enable.auto.offset.store"}


def test_a_consumer_property_flag_goes_through_the_same_check():
    args = _argparser().parse_args(["--bootstrap-servers", "k:9092", "--collector", "m=http://a:5000",
                                    "--consumer-property", "group.id=other"])
    with pytest.raises(ConfigError, match=r"kafka\.consumer_properties: group\.id: .*kafka\.group_id"):
        config_from_args(args)


@pytest.mark.parametrize("servers", ["http://kafka:9092", "kafka:9092,SASL_SSL://kafka2:9093", "kafka:9092/"])
def test_bootstrap_servers_that_are_urls_are_refused(servers):
    refused = _refused(_kafka(bootstrap_servers=servers))
    assert re.search(r"kafka\.bootstrap_servers: broker \d is a URL; list brokers as host:port without a scheme",
                     refused)
    assert "kafka2" not in refused


def test_bootstrap_servers_as_host_port_pass():
    assert build_config(_kafka(bootstrap_servers="k1:9092, k2:9092,[::1]:9092")).kafka.bootstrap_servers


@pytest.mark.parametrize("data,message,value", [
    (_kafka(topics=["ok", "hunter2 x"]), r"kafka\.topics: topic 2 is not a Kafka topic name \(it holds a space\)",
     "hunter2"),
    (_kafka(topics="hunter2,"), r"kafka\.topics: topic 2 is not a Kafka topic name \(it is empty\)", "hunter2"),
    (_kafka(topics=["hunter2" * 40]), r"kafka\.topics: the name is not a Kafka topic name \(it is 280 characters",
     "hunter2"),
    (_kafka(dlq_topic="hunter2/dlq"), r"kafka\.dlq_topic: the name is not a Kafka topic name \(it holds '/'\)",
     "hunter2"),
    (_kafka(consumer_properties={"group.protocol": "hunter2"}), r"group\.protocol: only classic is supported",
     "hunter2"),
    (_collector(type="hunter2"), r"collectors\.m\.type: unknown collector type; use one of", "hunter2"),
    (_collector(type="hunter2.kinds.Acme"), r"collectors\.m\.type: cannot import the module", "hunter2"),
    (_collector(route={"include": [{"event_types": ["START", "hunter2"]}]}),
     r"event_types: entry 2 is not an event type; use some of ABORT", "hunter2"),
    ({"kafka": {"bootstrap_servers": "k:9092"},
      "collectors": [{"name": "a", "type": "atlan", "tenant": "Hunter2", "connector": "spark", "token": "t"}]},
     r"tenant: not an Atlan tenant name", "Hunter2"),
    ({"kafka": {"bootstrap_servers": "k:9092"},
      "collectors": [{"name": "a", "type": "atlan", "tenant": "acme", "connector": "hunter2/x", "token": "t"}]},
     r"connector: must be one path segment", "hunter2"),
])
def test_validation_messages_say_what_is_wrong_without_echoing_the_value(data, message, value):
    refused = _refused(data)
    assert re.search(message, refused), refused
    assert value not in refused


@pytest.mark.parametrize("flag,item,expected", [
    ("--consumer-property", "sasl.password:hunter2",
     "--consumer-property: expected KEY=VALUE, e.g. --consumer-property session.timeout.ms=6000 (no =)"),
    ("--consumer-property", "sasl.password=", "--consumer-property: expected KEY=VALUE, e.g."),
    ("--collector", "=http://hunter2:5000", "--collector: expected NAME=URL, e.g. --collector marquez="),
    ("--collector-mode", "hunter2", "--collector-mode: expected NAME=MODE, e.g. --collector-mode marquez=consolidated"),
])
def test_a_malformed_flag_is_not_echoed_and_its_example_fits_the_flag(flag, item, expected):
    args = _argparser().parse_args(["--bootstrap-servers", "k:9092", "--collector", "m=http://a:5000", flag, item])
    with pytest.raises(ConfigError) as refused:
        config_from_args(args)
    message = str(refused.value)
    assert expected in message and "hunter2" not in message


def test_check_config_reads_the_files_and_variables_run_reads_first(tmp_path, monkeypatch, capsys):
    """A missing token_file or tls.ca_bundle, or an unset token_env, passed check-config and stopped run."""
    monkeypatch.delenv("NOPE_UNSET_TOKEN", raising=False)
    for entry, message in (
            ("token_file: /nonexistent/token", "collectors.m.token_file: cannot read /nonexistent/token"),
            ("tls: {ca_bundle: /nonexistent/ca.pem}", "collectors.m.tls.ca_bundle: cannot load /nonexistent/ca.pem"),
            ("token_env: NOPE_UNSET_TOKEN", "collectors.m.token_env: environment variable NOPE_UNSET_TOKEN")):
        path = write(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n"
                               f"collectors: [{{name: m, url: 'https://m:5000', {entry}}}]\n")
        assert main(["check-config", str(path)]) == 2
        assert message in capsys.readouterr().err
    token = tmp_path / "token"
    token.write_text("t0k\n")
    path = write(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n"
                           f"collectors: [{{name: m, url: 'https://m:5000', token_file: '{token}'}}]\n")
    assert main(["check-config", str(path)]) == 0
    assert "t0k" not in capsys.readouterr().out


def test_check_config_names_every_file_problem_at_once(tmp_path, monkeypatch, capsys):
    """As for the file's own keys: it stopped at the first collector's, so fixing three took
    three runs."""
    monkeypatch.delenv("NOPE_UNSET_TOKEN", raising=False)
    path = write(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n"
                           "collectors:\n"
                           "  - {name: a, url: 'https://a:5000', token_file: /nonexistent/token}\n"
                           "  - {name: b, url: 'https://b:5000', token_env: NOPE_UNSET_TOKEN,\n"
                           "     tls: {ca_bundle: /nonexistent/ca.pem}}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    for message in ("collectors.a.token_file: cannot read /nonexistent/token",
                    "collectors.b.token_env: environment variable NOPE_UNSET_TOKEN",
                    "collectors.b.tls.ca_bundle: cannot load /nonexistent/ca.pem"):
        assert message in err, err


def test_an_http_server_that_cannot_listen_names_http_host_or_http_port():
    import asyncio
    import socket

    from relay.server import _listen_problem, start_server

    async def problem(host: str, port: int) -> str:
        try:
            runner, _ = await start_server(None, host, port)  # type: ignore[arg-type]
        except OSError as err:
            return _listen_problem(err)
        await runner.cleanup()
        raise AssertionError("it listened")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        in_use = asyncio.run(problem("127.0.0.1", busy.getsockname()[1]))
    assert in_use.startswith("http.port: cannot listen there") and "0 for any free one" in in_use
    for host in ("no-such-host.invalid", "192.0.2.1"):  # unknown name; not an address of this machine
        assert asyncio.run(problem(host, 0)).startswith("http.host: cannot listen there")


@pytest.mark.parametrize("data,message", [
    (_collector(mode="coalesce", consolidation={"settle_s": 5}),
     r"collectors\.m: .*consolidation\.settle_s: only used with mode consolidated.*fix: remove it, or set mode: "
     r"consolidated"),
    (_collector(mode="consolidated", consolidation={"coalesce_window_s": 5}),
     r"consolidation\.coalesce_window_s: only used with mode coalesce.*fix: remove it, or set mode: coalesce"),
    (_collector(route={"include": [{"kinds": ["dataset"], "event_types": ["COMPLETE"]}]}),
     r"collectors\.m\.route\.include\.0: .*event_types: only RunEvents have an eventType.*fix: add run to kinds"),
    (_collector(route={"exclude": [{"kinds": "job", "event_types": ["START"]}]}),
     r"route\.exclude\.0: .*never matches"),
    (_collector(type="datahub", route={"include": [{"kinds": ["dataset"]}]}),
     r"route\.include\.0\.kinds: names only event kinds this collector does not take \(event_kinds: run, the "
     r"default of type datahub\).*fix: add those kinds to event_kinds, or remove the rule"),
    (_collector(event_kinds=["dataset", "job"], route={"include": [{"event_types": ["COMPLETE"]}]}),
     r"route\.include\.0\.event_types: only RunEvents have an eventType.*fix: add run to event_kinds"),
    (_collector(route={"include": [{"kinds": ["dataset"], "job_name": "*"}]}),
     r"collectors\.m\.route\.include\.0: .*job_name: only RunEvents and JobEvents have a job.*fix: add run"),
    (_collector(event_kinds=["dataset"], route={"exclude": [{"job_namespace": "tmp-*"}]}),
     r"route\.exclude\.0\.job_namespace: only RunEvents and JobEvents have a job.*fix: add run or job to "
     r"event_kinds"),
    (_collector(tls={"ca_bundle": "/etc/ssl/ca.pem"}),
     r"collectors\.m: .*tls: only used with an https:// url.*fix: use the collector's https:// url, or remove tls"),
    (_collector(tls={"verify": False}), r"tls: only used with an https:// url"),
    (_collector(url="https://a", tls={"verify": False, "ca_bundle": "/etc/ssl/ca.pem"}),
     r"collectors\.m\.tls: .*ca_bundle: has no effect with verify: false.*fix: remove verify: false to verify "
     r"against this CA, or remove ca_bundle"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"decode_worker": False, "decode_processes": 4}},
     r"pipeline: .*decode_processes: only used with decode_worker: true.*fix: remove decode_processes, or set "
     r"decode_worker: true"),
    ({"kafka": {"bootstrap_servers": "x"}, "collectors": [{"name": "m", "url": "http://a"}],
      "pipeline": {"decode_worker": False, "decode_priority": "idle"}}, r"decode_priority: only used with"),
])
def test_settings_that_would_have_no_effect_are_refused_naming_the_key_and_the_fix(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data)


def test_the_settings_each_mode_reads_and_defaults_written_out_are_accepted():
    assert build_config(_collector(mode="consolidated", consolidation={"settle_s": 5, "parent_hold_s": 1}))
    assert build_config(_collector(mode="coalesce", consolidation={"coalesce_window_s": 5, "max_open_runs": 9}))
    assert build_config(_collector(url="https://a", tls={"ca_bundle": "/etc/ssl/ca.pem"}))
    assert build_config(_collector(url="https://a", tls={"verify": False, "client_cert": "/etc/tls/c.pem"}))
    # An all-default tls block (as examples/relay.yaml writes it out) changes nothing either way.
    assert build_config(_collector(tls={"ca_bundle": None, "client_cert": None, "client_key": None, "verify": True}))
    assert build_config(_collector(route={"include": [{"kinds": ["run", "dataset"], "event_types": ["COMPLETE"]}]}))
    assert build_config(_collector(type="datahub", route={"include": [{"kinds": ["run", "dataset"]}]}))
    assert build_config(_collector(route={"include": [{"kinds": ["job", "dataset"], "job_name": "*.daily"}]}))
    cfg = build_config({**_collector(), "pipeline": {"decode_worker": False, "decode_processes": 1}})
    assert not cfg.pipeline.decode_worker


@pytest.mark.parametrize("data,key", [
    ({**_collector(), "http": {"port": False}}, r"http\.port"),
    (_collector(concurrency=True), r"collectors\.m\.concurrency"),
    ({**_collector(), "pipeline": {"decode_processes": True}}, r"pipeline\.decode_processes"),
    ({**_collector(), "drain_timeout_s": True}, r"drain_timeout_s"),
    ({**_collector(), "kafka": {"bootstrap_servers": "x", "topic_replication_factor": True}},
     r"kafka\.topic_replication_factor"),
])
def test_true_or_false_where_a_number_goes_is_refused(data, key):
    with pytest.raises(ConfigError, match=key + r": is true or false where a number is expected; fix: write a number"):
        build_config(data)


def test_numbers_from_environment_variables_still_read_as_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("PORT", "9200")
    monkeypatch.setenv("CONCURRENCY", "8")
    monkeypatch.setenv("MARQUEZ_TOKEN", "t")
    cfg = load_config(write(tmp_path, MINIMAL.replace("    token:", "    concurrency: ${CONCURRENCY}\n    token:")
                            + "http:\n  port: ${PORT}\npipeline:\n  decode_worker: ${WORKER:-false}\n"))
    assert cfg.http.port == 9200 and cfg.collectors[0].concurrency == 8 and cfg.pipeline.decode_worker is False


def test_an_initial_backoff_above_the_cap_is_refused_naming_both_keys():
    """Every wait is capped at max_backoff_s: initial_backoff_s: 60 under the default cap of
    30 had no effect, silently (waits stayed under 30 s)."""
    with pytest.raises(ConfigError, match=r"collectors\.m\.retry: .*initial_backoff_s: 60 is above max_backoff_s "
                                          r"\(30\).*fix: lower initial_backoff_s, or raise max_backoff_s"):
        build_config(_collector(retry={"initial_backoff_s": 60}))
    assert build_config(_collector(retry={"initial_backoff_s": 60, "max_backoff_s": 60}))
