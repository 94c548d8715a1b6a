"""docker-compose.yml validates against the Compose Specification's JSON Schema (vendored
in schemas/, see schemas/README.md) and holds together: dependencies exist and are
waited for properly, the relay reads the config it is given, Kafka advertises what its
clients are told, ports do not clash."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

from tests.deploy.deployfiles import (
    COMPOSE,
    COMPOSE_RELAY_CONFIG,
    ROOT,
    SCHEMAS,
    SPARK_DEFAULTS,
    parse_dockerfile,
    parse_relay_yaml,
    spark_properties,
)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator: jsonschema.Draft7Validator, doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_validates_against_the_compose_spec(compose, validator):
    assert _errors(validator, compose) == []


@pytest.mark.parametrize("mutate", [
    lambda c: c["services"]["relay"].update(restart_policy="always"),
    lambda c: c["services"]["relay"]["depends_on"]["kafka-init"].update(condition="service_ready"),
    lambda c: c["services"]["kafka"]["healthcheck"].update(test=42),
    lambda c: c.update(service={}),
], ids=["unknown-service-key", "unknown-condition", "wrong-type", "unknown-top-level-key"])
def test_compose_schema_rejects_broken_files(compose, validator, mutate):
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert _errors(validator, broken)


def test_no_unresolved_interpolation(compose):
    # Nothing to set before `docker compose up`; `$` would be interpolated by compose.
    assert "${" not in COMPOSE.read_text()


def test_the_stack_has_the_parts_the_readme_promises(compose):
    services = compose["services"]
    assert {"kafka", "marquez-api", "marquez-web", "marquez-db", "relay", "spark-job"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["marquez-api"]["image"].startswith("marquezproject/marquez:")
    assert services["marquez-web"]["image"].startswith("marquezproject/marquez-web:")
    assert services["relay"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["spark-job"]["build"]["dockerfile"] == "examples/spark/Dockerfile"
    # Pinned images: `docker compose up` a year from now starts the same stack.
    for name, svc in services.items():
        if "image" in svc and "build" not in svc:
            assert ":" in svc["image"] and not svc["image"].endswith(":latest"), name


def _has_healthcheck(svc: dict) -> bool:
    if "healthcheck" in svc:
        return not svc["healthcheck"].get("disable", False)
    if "build" in svc:
        _, stages = parse_dockerfile(ROOT / svc["build"].get("context", ".") / svc["build"]["dockerfile"])
        return stages[-1].last("HEALTHCHECK") is not None
    return False


def test_dependencies_exist_and_are_waited_for(compose):
    services = compose["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long form of depends_on, with a condition"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert _has_healthcheck(services[dep]), f"{name} waits for {dep} to be healthy; it has no healthcheck"
            elif condition == "service_completed_successfully":
                assert services[dep].get("restart", "no") == "no", f"{dep} must run once"
            else:
                pytest.fail(f"{name} -> {dep}: {condition} does not wait for readiness")


def test_dependency_graph_has_no_cycle(compose):
    graph = {name: set(svc.get("depends_on", {})) for name, svc in compose["services"].items()}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"cycle: {' -> '.join(path + (node,))}"
        if node not in done:
            for dep in graph[node]:
                visit(dep, path + (node,))
            done.add(node)

    for node in graph:
        visit(node, ())


ONE_SHOT = {"kafka-init", "spark-job"}


def test_every_long_running_service_has_a_healthcheck(compose):
    for name, svc in compose["services"].items():
        if name in ONE_SHOT:
            assert svc.get("restart", "no") == "no", f"{name} runs once"
        else:
            assert _has_healthcheck(svc), name


def test_bind_mounts_and_build_files_exist(compose):
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in (compose.get("volumes") or {}), f"{name}: undeclared named volume {source}"
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file(), name


def _published(svc: dict) -> list[int]:
    out = []
    for port in svc.get("ports", []):
        parts = str(port).split(":")
        assert len(parts) == 2, f"{port}: write HOST:CONTAINER"
        out.append(int(parts[0]))
    return out


def test_published_ports_are_unique_and_include_the_documented_ones(compose):
    published = [p for svc in compose["services"].values() for p in _published(svc)]
    assert len(published) == len(set(published)), published
    services = compose["services"]
    assert 3000 in _published(services["marquez-web"])
    assert 5000 in _published(services["marquez-api"])
    assert 9108 in _published(services["relay"])


def _listeners(kafka: dict) -> dict[str, str]:
    """KAFKA_ADVERTISED_LISTENERS as {listener name: host:port}."""
    pairs = (item.split("://", 1) for item in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(","))
    return {name: address for name, address in pairs}


def test_kafka_is_a_single_kraft_node_reachable_in_network_and_from_the_host(compose):
    kafka = compose["services"]["kafka"]
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = str(env["KAFKA_NODE_ID"])
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node_id}@kafka:")
    advertised = _listeners(kafka)
    assert advertised["PLAINTEXT"] == "kafka:9092"
    host_port = advertised["PLAINTEXT_HOST"].rsplit(":", 1)[1]
    assert int(host_port) in _published(kafka)
    protocol_map = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(advertised) | {env["KAFKA_CONTROLLER_LISTENER_NAMES"]} <= set(protocol_map)
    # Single node: internal topics cannot have more replicas than brokers.
    assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 1


def test_relay_reads_the_mounted_config_at_the_path_the_image_runs_with(compose):
    relay = compose["services"]["relay"]
    _, stages = parse_dockerfile(ROOT / relay["build"]["context"] / relay["build"]["dockerfile"])
    cmd = relay.get("command") or stages[-1].last("CMD").exec_form()
    config_path = cmd[cmd.index("--config") + 1]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in relay["volumes"]}
    assert config_path in mounts, f"the relay reads {config_path}; nothing is mounted there"
    assert (ROOT / mounts[config_path]).resolve() == COMPOSE_RELAY_CONFIG
    assert relay["volumes"][0].endswith(":ro")


def test_relay_talks_to_the_compose_kafka_and_marquez(compose):
    services = compose["services"]
    config = parse_relay_yaml(COMPOSE_RELAY_CONFIG.read_text())
    assert config["kafka"]["bootstrap_servers"] in _listeners(services["kafka"]).values()
    (collector,) = config["collectors"]
    host, port = collector["url"].removeprefix("http://").split(":")
    assert host in services
    assert int(port) == int(services[host]["environment"]["MARQUEZ_PORT"])
    assert int(config["http"]["port"]) in _published(services["relay"])


def test_spark_job_writes_where_the_relay_reads(compose):
    services = compose["services"]
    props = spark_properties(SPARK_DEFAULTS)
    config = parse_relay_yaml(COMPOSE_RELAY_CONFIG.read_text())
    assert props["spark.openlineage.transport.properties.bootstrap.servers"] in _listeners(services["kafka"]).values()
    assert props["spark.openlineage.transport.topicName"] in config["kafka"]["topics"]
    init = services["kafka-init"]["command"]
    assert init[init.index("--topic") + 1] in config["kafka"]["topics"]


def test_marquez_web_points_at_the_api(compose):
    services = compose["services"]
    web = services["marquez-web"]["environment"]
    assert web["MARQUEZ_HOST"] in services
    assert int(web["MARQUEZ_PORT"]) == int(services[web["MARQUEZ_HOST"]]["environment"]["MARQUEZ_PORT"])
    api = services["marquez-api"]["environment"]
    db = services[api["POSTGRES_HOST"]]["environment"]
    assert (api["POSTGRES_USER"], api["POSTGRES_PASSWORD"], api["POSTGRES_DB"]) == (
        db["POSTGRES_USER"], db["POSTGRES_PASSWORD"], db["POSTGRES_DB"])
