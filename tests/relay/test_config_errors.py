"""What a wrong configuration is told: the key, what is wrong and the fix, all at once,
never a value (relay.config_errors, relay.config_file, relay.source.properties)."""

import argparse

import pytest

from relay.cli import _add_relay_flags, config_from_args, main
from relay.config import load_config
from relay.errors import ConfigError

SECRET = "HUNTER2pw"


def write(tmp_path, text):
    p = tmp_path / "relay.yaml"
    p.write_text(text)
    return p


def refused(tmp_path, text) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    return str(err.value)


@pytest.mark.parametrize("properties,key", [
    ("{security.protocol: SASL_SSL, sasl.mechanism: '${KAFKA_PASSWORD}'}", "sasl.mechanism"),  # librdkafka: "...: <it>"
    ("{security.protocol: '${KAFKA_PASSWORD}'}", "security.protocol"),                         # 'Invalid value "<it>"'
    ("{auto.offset.reset: '${KAFKA_PASSWORD}'}", "auto.offset.reset"),
])
def test_librdkafka_refusals_never_echo_the_value(tmp_path, monkeypatch, properties, key):
    """A password put in the wrong property came back in librdkafka's own message."""
    monkeypatch.setenv("KAFKA_PASSWORD", SECRET)
    message = refused(tmp_path, f"kafka: {{bootstrap_servers: k:9092, consumer_properties: {properties}}}\n"
                                "collectors: [{name: m, url: 'http://m:5000'}]\n")
    assert f"kafka.consumer_properties: {key}: " in message and "<value>" in message
    assert SECRET not in message and SECRET.lower() not in message.lower()


def test_a_java_jaas_config_is_named_and_its_password_not_shown(tmp_path):
    message = refused(tmp_path, "kafka:\n  bootstrap_servers: k:9092\n  producer_properties:\n"
                                "    sasl.jaas.config: 'org.apache.kafka.common.security.plain.PlainLoginModule "
                                f"required username=\"u\" password=\"{SECRET}\";'\n"
                                "collectors: [{name: m, url: 'http://m:5000'}]\n")
    assert "kafka.producer_properties: sasl.jaas.config: Java JAAS configuration is not supported" in message
    assert "fix: remove it, and set sasl.mechanism" in message and SECRET not in message


@pytest.mark.parametrize("text,line", [
    ("kafka: {bootstrap_servers: k:9092, topic: [a]}\ncollectors: [{name: m, url: 'http://m'}]\n",
     "kafka.topic: unknown key; did you mean topics? fix: rename it, or remove it"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', timeout: 10}]\n",
     "collectors.m.timeout: unknown key; did you mean timeout_s? fix: rename it, or remove it"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', retry: {max_backof_s: 3}}]\n",
     "collectors.m.retry.max_backof_s: unknown key; did you mean max_backoff_s? fix: rename it"),
    # A kind's own keys are known too (atlan: tenant, connector).
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: a, type: atlan, tenant: t, conector: spark, "
     "token: '${T}'}]\n", "collectors.a.conector: unknown key; did you mean connector? fix: rename it"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', zzz: 1}]\n",
     "collectors.m.zzz: unknown key; fix: remove it, or correct its spelling (known keys here: "),
])
def test_an_unknown_key_is_given_the_known_keys_it_is_closest_to(tmp_path, monkeypatch, text, line):
    monkeypatch.setenv("T", "t")
    assert line in refused(tmp_path, text)


def test_a_misspelt_required_key_is_reported_once_as_the_misspelling(tmp_path):
    message = refused(tmp_path, "kafka: {bootstrap_servers: k:9092}\ncollector: [{name: m, url: 'http://m'}]\n")
    assert "collector: unknown key; did you mean collectors?" in message
    assert "collectors: Field required" not in message


def test_every_unset_variable_is_reported_at_once_with_the_other_errors(tmp_path, monkeypatch):
    for name in ("LR_BS", "LR_URL", "LR_TOKEN", "LR_KEY", "LR_SASL"):
        monkeypatch.delenv(name, raising=False)
    message = refused(tmp_path, "kafka:\n  bootstrap_servers: ${LR_BS}\n  topic: [a]\n"
                                "  consumer_properties: {sasl.password: '${LR_SASL}'}\n"
                                "collectors:\n  - name: marquez\n    url: ${LR_URL}\n    token: ${LR_TOKEN}\n"
                                "    headers: {X-Api-Key: '${LR_KEY}'}\n    timeout: 5\n")
    lines = message.splitlines()[1:]
    assert "kafka.bootstrap_servers: environment variable LR_BS is not set; fix: export it, or write " \
           "${LR_BS:-default}" in message
    assert "collectors.marquez.url: environment variable LR_URL is not set" in message
    # The typos of the same file, in the same round; no error about the placeholder of an unset one.
    assert "kafka.topic: unknown key; did you mean topics?" in message
    assert "collectors.marquez.timeout: unknown key; did you mean timeout_s?" in message
    assert len(lines) == 7, message
    # A secret's default would be a secret written in the file: not offered.
    for key, name in (("collectors.marquez.token", "LR_TOKEN"), ("collectors.marquez.headers.X-Api-Key", "LR_KEY"),
                      ("kafka.consumer_properties.sasl.password", "LR_SASL")):
        line = next(line for line in lines if line.strip().startswith(f"{key}: environment variable {name}"))
        assert "Kubernetes" in line and ":-default" not in line
    assert "token_env" in next(line for line in lines if "LR_TOKEN" in line)


@pytest.mark.parametrize("entry,line", [
    ("kafka: {bootstrap_servers: k:9092, topics: 5}\ncollectors: [{name: m, url: 'http://m'}]\n",
     "kafka.topics: is not a list of topic names; fix: write a list such as [openlineage], or one string of "
     "comma-separated names"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', timeout_s: ten}]\n",
     "collectors.m.timeout_s: is not a number; fix: write a number in digits"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', concurrency: 3.5}]\n",
     "collectors.m.concurrency: has a fractional part where a whole number is expected; fix: write a whole number"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m'}]\nhttp: {port: abc}\n",
     "http.port: is not a whole number; fix: write a whole number in digits"),
    ("kafka: {bootstrap_servers: k:9092, create_dlq_topic: maybe}\ncollectors: [{name: m, url: 'http://m'}]\n",
     "kafka.create_dlq_topic: is not true or false; fix: write true or false"),
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', token: 123456789012}]\n",
     "collectors.m.token: is a number where text is expected (YAML reads unquoted digits as a number); fix: take "
     "it from an environment variable (token: ${NAME}, always text), or quote it"),
    # YAML 1.1 reads an unquoted on/yes/true as a boolean: no number, no digits to blame.
    ("kafka: {bootstrap_servers: k:9092}\ncollectors: [{name: m, url: 'http://m', headers: {X-Debug: on}}]\n",
     "collectors.m.headers.X-Debug: is true or false where text is expected (YAML reads unquoted true, false, "
     "yes, no, on and off as one); fix: take it from an environment variable (X-Debug: ${NAME}, always text), "
     "or quote it"),
])
def test_a_value_of_the_wrong_type_is_told_what_to_write_without_quoting_it(tmp_path, entry, line):
    message = refused(tmp_path, entry)
    assert line in message
    assert "Input should" not in message and "123456789012" not in message and "ten" not in message.split(": ", 1)[1]


INLINE = ("kafka: {bootstrap_servers: k:9092}\n"
          "collectors: [{name: marquez, url: 'http://m:5000', token: s3cr3t-inline-TOKEN}, "
          "{name: other, url: 'http://o:5000', token: '${LR_OTHER_TOKEN}'}]\n")


def test_a_token_written_in_the_file_is_warned_about_naming_the_collector(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LR_OTHER_TOKEN", "from-a-variable")
    path = write(tmp_path, INLINE)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    assert "OK" in out.out
    warnings = [line for line in out.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "collectors.marquez.token: a secret written in the file" in warnings[0]
    assert "s3cr3t" not in out.err + out.out and "token_env or token_file" in warnings[0]
    # run: the same, handed over to be logged once at start-up.
    p = argparse.ArgumentParser()
    _add_relay_flags(p)
    found: list[str] = []
    config_from_args(p.parse_args(["--config", str(path)]), found)
    assert found == ["collectors.marquez.token"]


def test_run_logs_the_inline_token_once_without_it(tmp_path, monkeypatch, capsys):
    import relay.cli

    async def no_relay(_config):
        return None

    monkeypatch.setenv("LR_OTHER_TOKEN", "from-a-variable")
    monkeypatch.setattr(relay.cli, "serve", no_relay)
    assert main(["run", "--config", str(write(tmp_path, INLINE))]) == 0
    err = capsys.readouterr().err
    logged = [line for line in err.splitlines() if "secret_in_config_file" in line]
    assert len(logged) == 1 and "collectors.marquez.token" in logged[0] and '"WARNING"' in logged[0].upper()
    assert "s3cr3t" not in err


BATCHES = """
kafka: {bootstrap_servers: 127.0.0.1:9092}
collectors:
  - {name: om, type: http, url: http://om:8585, batch: {max_events: 200, max_requests: 4}CONCURRENCY}
"""


@pytest.mark.parametrize("concurrency, warned", [("", False), (", concurrency: 800", False),
                                                 (", concurrency: 32", True)])
def test_a_concurrency_below_full_batches_is_warned_about_by_check_config_and_run(
        tmp_path, monkeypatch, capsys, concurrency, warned):
    # Batches fill from the events in flight: concurrency 32 with 4 requests of 200 events
    # sends batches of a few events each, a cap nothing told the user about.
    import relay.cli

    async def no_relay(_config):
        return None

    path = write(tmp_path, BATCHES.replace("CONCURRENCY", concurrency))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    printed = [line for line in out.err.splitlines() if "warning" in line]
    monkeypatch.setattr(relay.cli, "serve", no_relay)
    assert main(["run", "--config", str(path)]) == 0
    logged = [line for line in capsys.readouterr().err.splitlines() if "config_warning" in line]
    if not warned:
        assert printed == [] and logged == []
        return
    assert len(printed) == 1 and len(logged) == 1
    for line in (printed[0], logged[0]):
        assert "collectors.om.concurrency: at most 32 events in flight" in line and "(800)" in line
        assert "fix: remove concurrency" in line


@pytest.mark.parametrize(("content", "message"), [
    (b"\x00\xff\xfe", "is not UTF-8 text (byte 1"),
    ("kafka: {}\n# caf\u00e9\n".encode("latin-1"), "is not UTF-8 text (byte 15"),
    (b"consumer_properties: &x {k: *x}\n", "a YAML alias refers to itself"),
])
def test_a_file_that_is_not_utf8_or_refers_to_itself_is_named_with_the_fix(tmp_path, capsys, content, message):
    path = tmp_path / "relay.yaml"
    path.write_bytes(content)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "fix: " in err and "Traceback" not in err


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "relay.yaml"
    path.write_bytes(b"\xef\xbb\xbfkafka:\n  bootstrap_servers: 127.0.0.1:9092\n")
    from relay.config_file import read_yaml

    assert read_yaml(path) == {"kafka": {"bootstrap_servers": "127.0.0.1:9092"}}


def test_a_yaml_syntax_error_names_the_place_without_quoting_the_line(tmp_path, capsys):
    # A secret substituted before parsing (`--config <(envsubst < relay.yaml)`) may break the
    # YAML; PyYAML's own message quotes the offending line, secret and all.
    path = tmp_path / "relay.yaml"
    path.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:9092\n  properties:\n"
                    "    sasl.password: Tr0ub4dor: &3-TOPSECRET\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML" in err and "line 4" in err
    assert "TOPSECRET" not in err and "Tr0ub4dor" not in err and "Traceback" not in err
