"""Every relay.yaml the deployment ships passes the real ``lineage-relay check-config``,
and the values that must agree across files do: ports and paths of the probes, the
config path, drain timeout vs grace period, topic and consumer group for KEDA, the
variables the Secret must hold, the producer-side examples vs the relay's topic."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from confluent_kafka import Consumer, KafkaException, Producer

from relay.app import CLOSE_MARGIN_S
from relay.metrics import RelayMetrics
from relay.server import build_app
from tests.deploy import kustomize
from tests.deploy.deployfiles import (
    COMPOSE,
    COMPOSE_RELAY_CONFIG,
    DEPLOY,
    DOCKERFILE,
    EXAMPLE_RELAY_CONFIG,
    EXAMPLES,
    K8S_BASE,
    K8S_OVERLAYS,
    KEDA,
    OPENLINEAGE_YML,
    ROOT,
    SPARK_DEFAULTS,
    duration_s,
    one,
    parse_dockerfile,
    parse_relay_yaml,
    placeholder_env,
    relay_yaml_of,
    required_env,
    spark_properties,
)
from tests.deploy.kustomize import kustomization_file

KUSTOMIZATIONS = {"base": K8S_BASE, **{f"overlays/{p.name}": p for p in K8S_OVERLAYS}}
#: After the relay returned: its threads and the interpreter ending.
EXIT_S = 2.0


def _configmap_text(name: str) -> str:
    return relay_yaml_of(one(kustomize.build(KUSTOMIZATIONS[name]), "ConfigMap"))


def relay_configs() -> dict[str, str]:
    """Every relay.yaml the repository ships, as text, by where it comes from."""
    configs = {f"configmap:{name}": _configmap_text(name) for name in KUSTOMIZATIONS}
    configs["deploy/compose/relay.yaml"] = COMPOSE_RELAY_CONFIG.read_text()
    configs["examples/relay.yaml"] = EXAMPLE_RELAY_CONFIG.read_text()
    # The README's configuration reference, as a reader would copy it.
    readme = (ROOT / "README.md").read_text()
    [reference] = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if b.startswith("kafka:\n")]
    configs["README.md (configuration reference)"] = reference
    return configs


CONFIGS = relay_configs()


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real CLI, as an operator runs it: ``lineage-relay check-config PATH``."""
    clean = {k: v for k, v in os.environ.items() if k not in required_env(path.read_text())}
    return subprocess.run([sys.executable, "-m", "relay", "check-config", str(path)], capture_output=True,
                          text=True, timeout=60, env={**clean, **env}, cwd=ROOT)


@pytest.mark.parametrize("source", sorted(CONFIGS))
def test_check_config_accepts_every_shipped_relay_yaml(source, tmp_path):
    text = CONFIGS[source]
    path = tmp_path / "relay.yaml"
    path.write_text(text)
    result = check_config(path, placeholder_env(text))
    assert result.returncode == 0, f"{source}:\n{result.stderr}"
    names = [c["name"] for c in parse_relay_yaml(text)["collectors"]]
    assert f"({len(names)} collector(s): {', '.join(names)})" in result.stdout


def test_check_config_fails_on_a_key_the_relay_does_not_know(tmp_path):
    """The check above has teeth: a misspelt key, as it would slip into a ConfigMap."""
    path = tmp_path / "relay.yaml"
    path.write_text(CONFIGS["configmap:base"].replace("drain_timeout_s:", "drain_timeout:"))
    result = check_config(path, placeholder_env(path.read_text()))
    assert result.returncode == 2
    assert "drain_timeout" in result.stderr and "unknown key" in result.stderr


def test_check_config_fails_when_a_referenced_variable_is_unset(tmp_path):
    path = tmp_path / "relay.yaml"
    path.write_text(CONFIGS["configmap:base"])
    assert required_env(path.read_text()) == {"MARQUEZ_TOKEN"}
    result = check_config(path, {})
    assert result.returncode == 2 and "MARQUEZ_TOKEN" in result.stderr


@pytest.mark.parametrize("source", sorted(CONFIGS))
def test_librdkafka_properties_exist(source):
    """consumer_properties / producer_properties are passed to librdkafka as they are;
    check-config cannot know its property names, librdkafka can (no connection is made:
    the bootstrap address is replaced by a closed loopback port)."""
    kafka = parse_relay_yaml(CONFIGS[source])["kafka"]
    offline = {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}
    props = {k: str(v) for k, v in kafka.get("consumer_properties", {}).items()}
    try:
        Consumer({**props, "group.id": kafka.get("group_id", "lineage-relay"), **offline}).close()
        Producer({**{k: str(v) for k, v in kafka.get("producer_properties", {}).items()}, **offline}).flush(0)
    except KafkaException as err:
        pytest.fail(f"{source}: {err.args[0].str()}")


def test_librdkafka_check_rejects_a_misspelt_property():
    with pytest.raises(KafkaException, match="sasl.mechansim"):
        Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "sasl.mechansim": "PLAIN"})


# -- Kubernetes -------------------------------------------------------------------------

def _relay_container(name: str) -> tuple[dict, dict, dict]:
    resources = kustomize.build(KUSTOMIZATIONS[name])
    dep = one(resources, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    return dep, pod, pod["containers"][0]


def _routes() -> set[str]:
    stub = SimpleNamespace(started=True, stopping=False, heartbeat=0.0, lanes=[], metrics=RelayMetrics(),
                           source=SimpleNamespace(paused=False, assignment=set()))
    return {r.resource.canonical for r in build_app(stub).router.routes()}


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_probes_use_the_port_and_paths_the_relay_serves(name):
    config = parse_relay_yaml(_configmap_text(name))
    _, _, container = _relay_container(name)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    http_port = config.get("http", {}).get("port", 9108)
    routes = _routes()
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == http_port, f"{probe} asks port {port}; relay.yaml http.port is {http_port}"
        assert get["path"] == path and path in routes
    assert "/metrics" in routes


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_config_is_mounted_where_the_relay_reads_it(name):
    _, pod, container = _relay_container(name)
    _, stages = parse_dockerfile(DOCKERFILE)
    image_cmd = stages[-1].last("CMD").exec_form()
    image_path = image_cmd[image_cmd.index("--config") + 1]
    args = container.get("args") or image_cmd
    assert args[args.index("--config") + 1] == image_path, "Deployment args and the image's CMD disagree"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = set()
    for mount in container["volumeMounts"]:
        cm = volumes[mount["name"]].get("configMap")
        if cm:
            for item in cm.get("items", [{"key": "relay.yaml", "path": "relay.yaml"}]):
                mounted.add(f"{mount['mountPath'].rstrip('/')}/{item['path']}")
            assert mount.get("readOnly") is True
    assert image_path in mounted, f"the relay reads {image_path}; the ConfigMap is mounted at {mounted}"


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_termination_grace_exceeds_the_longest_shutdown(name):
    """The relay returns within drain_timeout_s + CLOSE_MARGIN_S of SIGTERM; the process
    exits a moment later (threads ending): SIGKILL must come after that."""
    config = parse_relay_yaml(_configmap_text(name))
    _, pod, _ = _relay_container(name)
    drain = float(config.get("drain_timeout_s", 20))
    assert pod["terminationGracePeriodSeconds"] >= drain + CLOSE_MARGIN_S + EXIT_S, \
        "SIGKILL would cut the shutdown short"


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_secret_creation_command_lists_exactly_the_variables_relay_yaml_reads(name):
    """The kustomization's `kubectl create secret` line is what an operator copies."""
    needed = required_env(_configmap_text(name))
    _, _, container = _relay_container(name)
    literal_env = {e["name"] for e in container.get("env", [])}
    documented = set(re.findall(r"--from-literal=([A-Za-z_][A-Za-z0-9_]*)=", kustomization_file(KUSTOMIZATIONS[name]).read_text()))
    assert documented == needed - literal_env


def _scaled_objects() -> dict[str, tuple[dict, list[dict]]]:
    """Each ScaledObject the repository ships, by where it is applied: the optional file
    beside the base, and every overlay that renders one; with the resources it scales."""
    found = {"optional/keda-scaledobject.yaml + base": (kustomize.load_documents(KEDA)[0], kustomize.build(K8S_BASE))}
    for name, directory in KUSTOMIZATIONS.items():
        resources = kustomize.build(directory)
        scaled = [r for r in resources if r.get("kind") == "ScaledObject"]
        if scaled:
            (found[name],) = [(scaled[0], resources)]
    return found


def test_an_overlay_ships_keda_autoscaling():
    assert any(name.startswith("overlays/") for name in _scaled_objects()), "overlays/production-keda renders none"


@pytest.mark.parametrize("where", sorted(_scaled_objects()))
def test_keda_scales_the_relay_on_its_own_cluster_group_and_topic(where):
    """The KEDA trigger reads the lag of the cluster, group and topic that the relay.yaml
    applied with it names (an overlay's own, not the base's)."""
    scaled, resources = _scaled_objects()[where]
    dep, pdb, configmap = one(resources, "Deployment"), one(resources, "PodDisruptionBudget"), one(resources, "ConfigMap")
    kafka = parse_relay_yaml(relay_yaml_of(configmap))["kafka"]
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert scaled["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert scaled["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    assert scaled["metadata"].get("namespace") == dep["metadata"].get("namespace")
    assert meta["consumerGroup"] == kafka.get("group_id", "lineage-relay")
    assert meta["topic"] in kafka.get("topics", ["openlineage"])
    assert meta["bootstrapServers"] == kafka["bootstrap_servers"]
    assert meta.get("offsetResetPolicy", "latest") == "earliest", "the relay starts a new group at earliest"
    assert scaled["spec"]["minReplicaCount"] > pdb["spec"]["minAvailable"], "the PDB would block every eviction"
    assert scaled["spec"]["maxReplicaCount"] >= scaled["spec"]["minReplicaCount"]


# -- compose ----------------------------------------------------------------------------

def test_compose_stop_grace_exceeds_the_longest_shutdown():
    relay = yaml.safe_load(COMPOSE.read_text())["services"]["relay"]
    drain = float(parse_relay_yaml(COMPOSE_RELAY_CONFIG.read_text()).get("drain_timeout_s", 20))
    assert duration_s(relay["stop_grace_period"]) >= drain + CLOSE_MARGIN_S + EXIT_S


def test_image_healthcheck_and_expose_match_the_shipped_port():
    _, stages = parse_dockerfile(DOCKERFILE)
    exposed = int(stages[-1].last("EXPOSE").value.split()[0])
    for source in ("configmap:base", "deploy/compose/relay.yaml"):
        assert parse_relay_yaml(CONFIGS[source]).get("http", {}).get("port", 9108) == exposed, source


# -- producer side ----------------------------------------------------------------------

def _producer_config(spark_conf: dict[str, str], tmp_path: Path):
    from producer.config import load_config
    from producer.sources import TRANSPORT_TYPES

    assert spark_conf["spark.openlineage.transport.type"] in TRANSPORT_TYPES
    return load_config(spark_conf=spark_conf, environ={}, cwd=tmp_path, home=tmp_path)


def test_spark_defaults_are_a_valid_producer_config(tmp_path):
    config = _producer_config(spark_properties(SPARK_DEFAULTS), tmp_path)
    compose_kafka = parse_relay_yaml(COMPOSE_RELAY_CONFIG.read_text())["kafka"]
    assert config.bootstrap_servers == compose_kafka["bootstrap_servers"]
    assert config.topic in compose_kafka["topics"]


def _spark_submit_confs(readme: str) -> list[dict[str, str]]:
    blocks = re.findall(r"```bash\n(spark-submit.*?)```", readme, re.S)
    assert blocks, "examples/spark/README.md shows a spark-submit command"
    out = []
    for block in blocks:
        confs = dict(re.findall(r"--conf (spark\.openlineage\.[^=\s]+)=(\S+)", block))
        if "--properties-file" in block:
            confs = {**spark_properties(ROOT / re.search(r"--properties-file (\S+)", block).group(1)), **confs}
        out.append({k: re.sub(r'"?\$\w+"?', "placeholder", v) for k, v in confs.items()})
    return out


def test_spark_submit_examples_are_valid_producer_configs(tmp_path):
    for confs in _spark_submit_confs((EXAMPLES / "spark" / "README.md").read_text()):
        config = _producer_config(confs, tmp_path)
        assert config.topic == "openlineage"


def test_spark_example_enables_lineage_with_the_producer_api():
    tree = ast.parse((EXAMPLES / "spark" / "lineage_example.py").read_text())
    imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("producer.spark", "enable_lineage") in imports
    import inspect

    from producer.spark import enable_lineage
    used = {kw.arg for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "enable_lineage"
            for kw in n.keywords}
    assert used <= set(inspect.signature(enable_lineage).parameters), "the example passes arguments that do not exist"


def test_openlineage_yml_builds_our_transport_config():
    """What openlineage-python's transport factory does with a dotted ``type``: import the
    class, then ``config_class.from_dict(section)`` (unknown keys fail there)."""
    from openlineage.client.transport.transport import Transport
    from openlineage.client.utils import import_from_string

    transport = yaml.safe_load(OPENLINEAGE_YML.read_text())["transport"]
    cls = import_from_string(transport["type"])
    assert isinstance(cls, type) and issubclass(cls, Transport)
    config = cls.config_class.from_dict(dict(transport))
    example_topics = parse_relay_yaml(EXAMPLE_RELAY_CONFIG.read_text())["kafka"]["topics"]
    assert config.producer_config.topic in example_topics
    assert config.producer_config.bootstrap_servers


def test_openlineage_yml_rejects_unknown_keys():
    from openlineage.client.utils import import_from_string

    from producer.errors import ConfigError

    transport = yaml.safe_load(OPENLINEAGE_YML.read_text())["transport"]
    with pytest.raises(ConfigError, match="topicNmae"):
        import_from_string(transport["type"]).config_class.from_dict({**transport, "topicNmae": "x"})


def test_transport_class_is_named_in_one_place():
    """If the class is renamed, one file changes: examples/openlineage.yml."""
    dotted = yaml.safe_load(OPENLINEAGE_YML.read_text())["transport"]["type"]
    module = dotted.rsplit(".", 1)[0]
    assert importlib.import_module(module)
    files = [p for d in (EXAMPLES, DEPLOY) for p in d.rglob("*") if p.is_file()]
    files.append(COMPOSE)
    naming = sorted(str(p.relative_to(ROOT)) for p in files if dotted.rsplit(".", 1)[1] in p.read_text(errors="ignore"))
    assert naming == ["examples/openlineage.yml"]
