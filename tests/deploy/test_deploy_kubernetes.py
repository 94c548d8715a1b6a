"""The Kubernetes manifests validate offline against the Kubernetes JSON schemas
(kubernetes-validate ships them, strict: unknown fields fail), the overlay renders, the
KEDA ScaledObject has the fields KEDA requires, and the hardening the README promises
is in the rendered Deployment."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy import kustomize
from tests.deploy.deployfiles import K8S_BASE, K8S_OVERLAYS, KEDA, SCHEMAS, by_kind, one

#: The oldest Kubernetes the manifests support, and the newest the schemas know.
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())

RENDERED = {"base": K8S_BASE, **{f"overlays/{p.name}": p for p in K8S_OVERLAYS}}


def render(name: str) -> list[dict]:
    return kustomize.build(RENDERED[name])


def scaled_by_keda(resources: list[dict]) -> dict | None:
    """The ScaledObject that scales the rendered Deployment, if any."""
    dep = one(resources, "Deployment")
    return next((r for r in by_kind(resources, "ScaledObject")
                 if r["spec"]["scaleTargetRef"]["kind"] == "Deployment"
                 and r["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]), None)


def fewest_replicas(resources: list[dict]) -> int:
    """The Deployment's replica count, or with KEDA the fewest it scales to."""
    scaled = scaled_by_keda(resources)
    if scaled is not None:
        return scaled["spec"].get("minReplicaCount", 0)
    return one(resources, "Deployment")["spec"]["replicas"]


def _validate(resource: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path)
        raise AssertionError(f"{resource['kind']}/{resource['metadata']['name']} at {path}: {err.message}") from None


def test_there_is_a_production_overlay():
    assert "overlays/production" in RENDERED


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_manifests_validate_against_kubernetes_schemas(name, version):
    resources = render(name)
    kinds = sorted(r["kind"] for r in resources if r["kind"] != "ScaledObject")  # KEDA's: checked below
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"]
    for resource in resources:
        if resource["kind"] != "ScaledObject":
            _validate(resource, version)


def test_schema_validation_rejects_an_unknown_field():
    deployment = copy.deepcopy(one(render("base"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {"httpGet": {"path": "/healthz"}}
    with pytest.raises(AssertionError, match="livenesProbe"):
        _validate(deployment, K8S_VERSIONS[-1])


def test_schema_validation_rejects_a_wrong_type():
    pdb = copy.deepcopy(one(render("base"), "PodDisruptionBudget"))
    pdb["spec"]["selector"] = "app=lineage-relay"
    with pytest.raises(AssertionError, match="selector"):
        _validate(pdb, K8S_VERSIONS[-1])


# -- KEDA --------------------------------------------------------------------------------

def _keda_schema() -> dict:
    return json.loads((SCHEMAS / "keda-scaledobject.schema.json").read_text())


def test_keda_scaledobject_has_the_fields_keda_requires():
    docs = kustomize.load_documents(KEDA)
    assert len(docs) == 1
    jsonschema.Draft202012Validator(_keda_schema()).validate(docs[0])


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_a_rendered_keda_scaledobject_has_the_fields_keda_requires(name):
    """An overlay's patched ScaledObject too (a patch replaces the trigger list whole)."""
    for scaled in (r for r in render(name) if r["kind"] == "ScaledObject"):
        jsonschema.Draft202012Validator(_keda_schema()).validate(scaled)


@pytest.mark.parametrize("mutate, error", [
    (lambda so: so["spec"].pop("scaleTargetRef"), "scaleTargetRef"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].pop("consumerGroup"), "consumerGroup"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(lagThreshold=5000), "5000"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(consumergroup="x"), "consumergroup"),
    (lambda so: so["spec"].update(minReplicaCount="2"), "'2'"),
])
def test_keda_schema_rejects_broken_scaledobjects(mutate, error):
    scaled = kustomize.load_documents(KEDA)[0]
    mutate(scaled)
    with pytest.raises(jsonschema.ValidationError, match=error):
        jsonschema.Draft202012Validator(_keda_schema()).validate(scaled)


# -- the renderer itself ----------------------------------------------------------------

@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: nothing to compare with")
@pytest.mark.parametrize("name", sorted(RENDERED))
def test_python_renderer_matches_kubectl_kustomize(name):
    out = subprocess.run(["kubectl", "kustomize", str(RENDERED[name])], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    theirs = {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(out) if r}
    ours = {(r["kind"], r["metadata"]["name"]): r for r in render(name)}
    assert ours == theirs


def test_overlay_changes_what_it_says():
    """Replicas, image, namespace, resources and relay.yaml come from the overlay;
    everything else from the base."""
    base, prod = render("base"), render("overlays/production")
    dep_base, dep = one(base, "Deployment"), one(prod, "Deployment")
    assert dep_base["spec"]["replicas"] == 2 and dep["spec"]["replicas"] == 3
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("registry.example.com/") and ":" in container["image"].rsplit("/", 1)[1]
    assert {r["metadata"].get("namespace") for r in prod} == {"lineage"}
    assert container["resources"] != dep_base["spec"]["template"]["spec"]["containers"][0]["resources"]
    # The patch merged into the container (by name): probes and mounts from the base survive.
    assert container["livenessProbe"] and container["readinessProbe"] and container["volumeMounts"]
    assert one(prod, "ConfigMap")["data"] != one(base, "ConfigMap")["data"]


def test_strategic_merge_merges_named_lists_and_replaces_others():
    original = {"containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "y"}]}
    patch = {"containers": [{"name": "b", "image": "z", "args": ["3"]}, {"name": "c", "image": "w"}]}
    merged = kustomize.strategic_merge(original, patch)
    assert merged == {"containers": [{"name": "a", "image": "x", "args": ["1", "2"]},
                                     {"name": "b", "image": "z", "args": ["3"]}, {"name": "c", "image": "w"}]}
    assert kustomize.strategic_merge({"args": ["1", "2"], "k": 1}, {"args": ["3"], "k": None}) == {"args": ["3"]}


def test_json_patch_operations():
    doc = {"spec": {"replicas": 3, "a/b": {"~": 1}, "items": [1, 2, 3]}}
    ops = [{"op": "remove", "path": "/spec/replicas"},
           {"op": "replace", "path": "/spec/a~1b/~0", "value": 2},
           {"op": "add", "path": "/spec/items/1", "value": 9},
           {"op": "add", "path": "/spec/items/-", "value": 4},
           {"op": "remove", "path": "/spec/items/0"},
           {"op": "add", "path": "/spec/new", "value": {"k": "v"}}]
    assert kustomize.json_patch(doc, ops) == {"spec": {"a/b": {"~": 2}, "items": [9, 2, 3, 4], "new": {"k": "v"}}}
    assert doc["spec"]["replicas"] == 3, "the original is left alone"
    for missing in ("/spec/nothing", "/spec/items/7", "/nothing/replicas"):
        with pytest.raises(LookupError):
            kustomize.json_patch(doc, [{"op": "remove", "path": missing}])
    with pytest.raises(kustomize.Unsupported, match="move"):
        kustomize.json_patch(doc, [{"op": "move", "from": "/spec/replicas", "path": "/spec/count"}])


def test_json_patch_applies_to_its_target_only(tmp_path):
    (tmp_path / "two.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec: {replicas: 2}\n---\n"
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: b}\nspec: {replicas: 2}\n")
    (tmp_path / "patch.yaml").write_text("- op: remove\n  path: /spec/replicas\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [two.yaml]\npatches:\n  - path: patch.yaml\n"
        "    target: {group: apps, version: v1, kind: Deployment, name: b}\n")
    assert [r["spec"] for r in kustomize.build(tmp_path)] == [{"replicas": 2}, {}]
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [two.yaml]\npatches:\n  - path: patch.yaml\n    target: {kind: Deployment, name: c}\n")
    with pytest.raises(LookupError, match="no resource matches"):
        kustomize.build(tmp_path)


def test_renderer_refuses_features_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: prod-\n")
    with pytest.raises(kustomize.Unsupported, match="namePrefix"):
        kustomize.build(tmp_path)


@pytest.mark.parametrize("image, expected", [
    ("lineage-relay:0.1.0", ("lineage-relay", "0.1.0", None)),
    ("registry:5000/team/lineage-relay", ("registry:5000/team/lineage-relay", None, None)),
    ("r.io/lineage-relay:1@sha256:ab", ("r.io/lineage-relay", "1", "sha256:ab")),
])
def test_split_image(image, expected):
    assert kustomize.split_image(image) == expected


# -- what the Deployment promises -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RENDERED))
def test_deployment_is_hardened(name):
    resources = render(name)
    dep = one(resources, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert fewest_replicas(resources) >= 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sa = one(resources, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["automountServiceAccountToken"] is False
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} >= {"kubernetes.io/hostname"}
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc.get("privileged", False) is False
        res = container["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_selectors_select_the_relay_pods(name):
    resources = render(name)
    dep = one(resources, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict) -> bool:
        return selector and all(labels.get(k) == v for k, v in selector.items())

    assert selects(dep["spec"]["selector"]["matchLabels"])
    assert selects(one(resources, "Service")["spec"]["selector"])
    pdb = one(resources, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"])
    assert pdb["spec"]["minAvailable"] == 1
    assert fewest_replicas(resources) > pdb["spec"]["minAvailable"], "the PDB would block every eviction"
    for constraint in dep["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert selects(constraint["labelSelector"]["matchLabels"])


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_unready_pods_never_block_a_drain(name):
    """With no relay Ready (a missing input topic, an unreachable broker, a crash loop), the
    default policy (IfHealthyBudget) refuses every eviction: node drains hang."""
    pdb = one(render(name), "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow"


def test_schema_knows_the_unhealthy_pod_eviction_policy():
    """Our oldest supported Kubernetes has the field (beta, on by default since 1.27): strict
    validation would reject it otherwise, as it rejects a misspelt one."""
    pdb = copy.deepcopy(one(render("base"), "PodDisruptionBudget"))
    for version in K8S_VERSIONS:
        _validate(pdb, version)
    pdb["spec"]["unhealthyPodEvictionPolicies"] = pdb["spec"].pop("unhealthyPodEvictionPolicy")
    with pytest.raises(AssertionError, match="unhealthyPodEvictionPolicies"):
        _validate(pdb, K8S_VERSIONS[0])


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_keda_alone_sets_the_replica_count(name):
    """Where KEDA scales the Deployment, the rendered Deployment has no spec.replicas: every
    `kubectl apply` of one that has would scale it back to that count (Kubernetes' HPA docs,
    "Migrating Deployments and StatefulSets to horizontal autoscaling"). Elsewhere it has one."""
    resources = render(name)
    dep = one(resources, "Deployment")
    if scaled_by_keda(resources) is not None:
        assert "replicas" not in dep["spec"], f"{name}: KEDA's replica count is reset by each apply"
    else:
        assert dep["spec"]["replicas"] >= 2


def test_there_is_a_keda_overlay():
    assert any(scaled_by_keda(render(name)) is not None for name in RENDERED if name.startswith("overlays/"))


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_metrics_service_is_scraped_on_the_container_port(name):
    resources = render(name)
    svc = one(resources, "Service")
    container = one(resources, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    notes = svc["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/path"] == "/metrics"
    (port,) = svc["spec"]["ports"]
    assert ports[port["targetPort"]] == int(notes["prometheus.io/port"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_config_volume_and_secret_are_wired(name):
    resources = render(name)
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    cm = one(resources, "ConfigMap")
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volumes = [v for v in volumes.values() if "configMap" in v]
    assert [v["configMap"]["name"] for v in config_volumes] == [cm["metadata"]["name"]]
    secret_refs = [e["secretRef"]["name"] for e in pod["containers"][0].get("envFrom", []) if "secretRef" in e]
    assert secret_refs, "the tokens relay.yaml reads (${MARQUEZ_TOKEN}) come from a Secret"
    assert not by_kind(resources, "Secret"), "no Secret in the manifests: its values are not ours to commit"
