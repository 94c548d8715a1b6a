"""Where the deployment files are, and small readers for them (Dockerfile, relay.yaml in
a ConfigMap, ``${NAME}`` references, .dockerignore, Spark properties)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = ROOT / "examples"
K8S = DEPLOY / "kubernetes"
K8S_BASE = K8S / "base"
K8S_OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
KEDA = K8S / "optional" / "keda-scaledobject.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
SPARK_DOCKERFILE = EXAMPLES / "spark" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_RELAY_CONFIG = DEPLOY / "compose" / "relay.yaml"
EXAMPLE_RELAY_CONFIG = EXAMPLES / "relay.yaml"
DASHBOARD = DEPLOY / "grafana" / "lineage-relay-dashboard.json"
ALERT_RULES = DEPLOY / "prometheus" / "lineage-relay-alerts.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "lineage-relay-alerts.test.yaml"
SPARK_DEFAULTS = EXAMPLES / "spark" / "spark-defaults.conf"
OPENLINEAGE_YML = EXAMPLES / "openlineage.yml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

#: The relay's own syntax (relay/config.py): ${NAME} or ${NAME:-default}.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")


def required_env(text: str) -> set[str]:
    """Variables a relay.yaml reads without a default (start-up fails when unset)."""
    return {m.group(1) for m in ENV_REF.finditer(text) if m.group(2) is None}


def placeholder_env(text: str) -> dict[str, str]:
    """A value for every ``${NAME}`` the text references, for check-config."""
    return {name: f"placeholder-{name.lower()}" for name in required_env(text)}


def relay_yaml_of(configmap: dict[str, Any]) -> str:
    data = configmap.get("data") or {}
    assert "relay.yaml" in data, f"ConfigMap {configmap['metadata']['name']} has no relay.yaml key"
    return data["relay.yaml"]


def parse_relay_yaml(text: str) -> dict[str, Any]:
    """The YAML as written (``${NAME}`` left in place): for comparing values across files."""
    return yaml.safe_load(text)


def by_kind(resources: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in resources if r.get("kind") == kind]


def one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    hits = by_kind(resources, kind)
    assert len(hits) == 1, f"expected one {kind}, found {len(hits)}"
    return hits[0]


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int
    flags: dict[str, str] = field(default_factory=dict)

    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form's arguments, or None for the shell form."""
        body = self.value.strip()
        if body.startswith("["):
            return json.loads(body)
        return None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        hits = self.all(keyword)
        return hits[-1] if hits else None


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined and comments
    (and parser directives) dropped. Enough of the Dockerfile grammar for these tests."""
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        logical.append((start, buf + stripped))
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, text in logical:
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags: dict[str, str] = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            key, _, val = flag[2:].partition("=")
            flags[key] = val
            rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            base = expand_args(parts[0], args)
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name, instructions=[]))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, number, flags))
    return args, stages


def expand_args(text: str, args: dict[str, str]) -> str:
    """``text`` with the ``$NAME`` / ``${NAME}`` of ``args`` replaced (others left as they are)."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def copy_sources(stage: Stage) -> list[str]:
    """Build-context paths a stage COPYs (not ``COPY --from``)."""
    sources: list[str] = []
    for ins in stage.all("COPY") + stage.all("ADD"):
        if "from" in ins.flags:
            continue
        parts = ins.exec_form() or shlex.split(ins.value)
        sources.extend(parts[:-1])
    return sources


def env_of(stage: Stage) -> dict[str, str]:
    """ENV KEY=VALUE ... of a stage (the KEY=VALUE form only)."""
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for token in shlex.split(ins.value):
            key, sep, value = token.partition("=")
            assert sep, f"line {ins.line}: use ENV KEY=VALUE"
            env[key] = value
    return env


def dockerignore_patterns(path: Path) -> list[str]:
    if not path.is_file():
        return []
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def dockerignored(relpath: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes ``relpath`` (or a folder above it). Implements
    ``*``, ``?``, ``**`` and ``!`` exceptions, later patterns winning, as Docker does."""
    parts = relpath.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        regex = _glob_regex(pat.strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def spark_properties(path: Path) -> dict[str, str]:
    """A spark-defaults.conf: ``key value`` (or ``key=value``) per line, # comments."""
    props: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^(\S+?)(?:\s*[=:]\s*|\s+)(.*)$", line)
        assert match, f"{path}: cannot parse {raw!r}"
        props[match.group(1)] = match.group(2).strip()
    return props


def duration_s(text: str | int | float) -> float:
    """A compose duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    total = 0.0
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text):
        total += float(number) * units[unit]
    return total
