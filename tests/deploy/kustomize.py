"""Render a kustomization in Python: the subset of kustomize that deploy/kubernetes uses.

So the tests need no kustomize binary. Supported kustomization keys: ``resources``
(files, and directories holding a kustomization), ``namespace``, ``images``
(``name``/``newName``/``newTag``/``digest``), ``replicas`` (``name``/``count``) and
``patches``: a ``path`` to a strategic-merge patch (target = the patch's kind and name), or
a ``path`` to a JSON patch (RFC 6902: a list of ``add``/``remove``/``replace`` operations)
with a ``target`` (``group``/``version``/``kind``/``name``/``namespace``). Any other key
raises :class:`Unsupported`, so a manifest that starts using one fails here instead of
being rendered wrongly; extend this module (and compare with ``kubectl kustomize``, as
test_deploy_kubernetes does when kubectl is installed).

Strategic merge follows the Kubernetes rules for the fields these manifests use: maps
merge recursively, ``null`` deletes a key, lists of containers, volumes, env, ports, ...
merge item by item on their merge key, every other list is replaced.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

_KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "patches"}
_SCALABLE = {"Deployment", "StatefulSet", "ReplicaSet"}

#: patchMergeKey of the Kubernetes API's list fields (``ports`` is resolved per item:
#: a container port merges on containerPort, a Service port on port).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "readinessGates": "conditionType",
}


class Unsupported(Exception):
    """The kustomization uses a feature this renderer does not implement."""


def load_documents(path: Path) -> list[Resource]:
    """Every non-empty YAML document of a manifest file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization_file(directory: Path) -> Path:
    for name in _KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"no kustomization.yaml in {directory}")


def build(directory: Path) -> list[Resource]:
    """The resources ``kustomize build directory`` prints, in resource order."""
    directory = Path(directory)
    kfile = kustomization_file(directory)
    spec = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(spec) - _SUPPORTED_KEYS
    if unknown:
        raise Unsupported(f"{kfile}: {', '.join(sorted(unknown))} not implemented in tests/deploy/kustomize.py")

    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        resources.extend(build(target) if target.is_dir() else load_documents(target))
    _check_unique(resources, kfile)

    for patch_entry in spec.get("patches", []):
        if set(patch_entry) not in ({"path"}, {"path", "target"}):
            raise Unsupported(f"{kfile}: only `patches: - path: FILE` (and `target:`) is implemented, not "
                              f"{', '.join(sorted(set(patch_entry) - {'path', 'target'}))}")
        documents = load_documents(directory / patch_entry["path"])
        if len(documents) == 1 and isinstance(documents[0], list):  # kustomize tells them apart the same way
            if "target" not in patch_entry:
                raise ValueError(f"{kfile}: the JSON patch {patch_entry['path']} needs a target")
            hits = _select(resources, patch_entry["target"])
            if not hits:
                raise LookupError(f"{kfile}: no resource matches the target {patch_entry['target']}")
            for target in hits:
                patched = json_patch(target, documents[0])
                target.clear()
                target.update(patched)
            continue
        if "target" in patch_entry:
            raise Unsupported(f"{kfile}: a strategic-merge patch with a target is not implemented")
        for patch in documents:
            target = _find(resources, patch)
            merged = strategic_merge(target, patch)
            target.clear()
            target.update(merged)

    namespace = spec.get("namespace")
    if namespace:
        for res in resources:
            res.setdefault("metadata", {})["namespace"] = namespace

    for image in spec.get("images", []):
        for res in resources:
            for container in _containers(res):
                container["image"] = _retag(container["image"], image)

    for replica in spec.get("replicas", []):
        hits = [r for r in resources if r.get("kind") in _SCALABLE and r["metadata"]["name"] == replica["name"]]
        if not hits:
            raise LookupError(f"{kfile}: replicas: no Deployment/StatefulSet named {replica['name']!r}")
        for res in hits:
            res["spec"]["replicas"] = int(replica["count"])
    return resources


def strategic_merge(original: Any, patch: Any, field: str | None = None) -> Any:
    """``patch`` merged into ``original`` (neither is modified)."""
    if isinstance(patch, dict):
        if "$patch" in patch or any(str(k).startswith("$") for k in patch):
            raise Unsupported(f"strategic-merge directive in {sorted(patch)}")
        if not isinstance(original, dict):
            return _without_nulls(patch)
        out = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = _without_nulls(value)
        return out
    if isinstance(patch, list) and isinstance(original, list):
        key = _merge_key(field, patch + original)
        if key is None:
            return copy.deepcopy(patch)
        out = copy.deepcopy(original)
        for item in patch:
            match = next((i for i, old in enumerate(out) if isinstance(old, dict) and old.get(key) == item.get(key)), None)
            if match is None:
                out.append(_without_nulls(item))
            else:
                out[match] = strategic_merge(out[match], item, field)
        return out
    return copy.deepcopy(patch)


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """``document`` with the RFC 6902 ``operations`` applied, in order (it is not modified).
    Implements ``add``, ``remove`` and ``replace``; a path that does not exist where the
    operation needs one raises ``LookupError``, as kustomize fails the build."""
    out = copy.deepcopy(document)
    for operation in operations:
        op = operation.get("op")
        if op not in ("add", "remove", "replace"):
            raise Unsupported(f"JSON patch operation {op!r}")
        *parents, last = _pointer(operation["path"])
        if not parents and last is None:
            raise Unsupported("a JSON patch of the whole document")
        container = out
        for token in parents:
            container = _step(container, token, operation["path"])
        if isinstance(container, list):
            if op == "add" and last == "-":
                container.append(copy.deepcopy(operation["value"]))
                continue
            index = _index(last, len(container) + (op == "add"), operation["path"])
            if op == "add":
                container.insert(index, copy.deepcopy(operation["value"]))
            elif op == "remove":
                del container[index]
            else:
                container[index] = copy.deepcopy(operation["value"])
        elif isinstance(container, dict):
            if op != "add" and last not in container:
                raise LookupError(f"JSON patch {op} {operation['path']}: no such field")
            if op == "remove":
                del container[last]
            else:
                container[last] = copy.deepcopy(operation["value"])
        else:
            raise LookupError(f"JSON patch {op} {operation['path']}: not inside an object or a list")
    return out


def _pointer(path: str) -> list[Any]:
    """A JSON pointer (RFC 6901) as its tokens; ``[None]`` for the whole document."""
    if path == "":
        return [None]
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} does not start with /")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _step(container: Any, token: str, path: str) -> Any:
    if isinstance(container, dict):
        if token not in container:
            raise LookupError(f"JSON patch {path}: no field {token!r}")
        return container[token]
    if isinstance(container, list):
        return container[_index(token, len(container), path)]
    raise LookupError(f"JSON patch {path}: {token!r} is not inside an object or a list")


def _index(token: str, size: int, path: str) -> int:
    if not token.isdigit() or (token != "0" and token.startswith("0")) or int(token) >= size:
        raise LookupError(f"JSON patch {path}: no list item {token!r}")
    return int(token)


def _select(resources: list[Resource], target: dict[str, Any]) -> list[Resource]:
    """The resources a patch's ``target`` selects (exact names; no selectors or regexes)."""
    unknown = set(target) - {"group", "version", "kind", "name", "namespace"}
    if unknown:
        raise Unsupported(f"patch target {', '.join(sorted(unknown))}")

    def matches(res: Resource) -> bool:
        group, _, version = res.get("apiVersion", "").rpartition("/")
        meta = res.get("metadata") or {}
        have = {"group": group, "version": version, "kind": res.get("kind"), "name": meta.get("name"),
                "namespace": meta.get("namespace", "")}
        return all(have[key] == value for key, value in target.items())

    return [res for res in resources if matches(res)]


def _merge_key(field: str | None, items: list[Any]) -> str | None:
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    if field == "ports":
        return "containerPort" if all("containerPort" in i for i in items) else "port"
    return _MERGE_KEYS.get(field or "")


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _identity(res: Resource) -> tuple[str, str, str]:
    meta = res.get("metadata") or {}
    return res.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _check_unique(resources: list[Resource], where: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for res in resources:
        ident = _identity(res)
        if ident in seen:
            raise ValueError(f"{where}: {ident} appears twice")
        seen.add(ident)


def _find(resources: list[Resource], patch: Resource) -> Resource:
    kind, namespace, name = _identity(patch)
    hits = [r for r in resources if r.get("kind") == kind and r["metadata"].get("name") == name
            and (not namespace or r["metadata"].get("namespace", "") == namespace)]
    if len(hits) != 1:
        raise LookupError(f"patch target {kind}/{name}: {len(hits)} matching resources")
    return hits[0]


def _containers(res: Resource) -> list[dict[str, Any]]:
    spec = res.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or (spec if res.get("kind") == "Pod" else {})
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``registry/name:tag@digest`` -> (name, tag, digest); a registry port is not a tag."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest or None


def _retag(image: str, rule: dict[str, Any]) -> str:
    name, tag, digest = split_image(image)
    if name != rule["name"]:
        return image
    name = rule.get("newName", name)
    if "digest" in rule:
        return f"{name}@{rule['digest']}"
    if "newTag" in rule:
        return f"{name}:{rule['newTag']}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
