"""A collector's settings (one entry of ``collectors:``), validated into frozen objects.

Each collector kind (:mod:`relay.sinks.kinds`) derives its config class from
:class:`CollectorConfig`; its sub-sections (retry, consolidation, tls, batch, adaptive
concurrency) are in :mod:`relay.sinks.sections`; :mod:`relay.config` re-exports these names.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from relay.frozen import Frozen
from relay.sinks.sections import (
    AdaptiveConcurrencyConfig,
    BatchConfig,
    ConsolidationConfig,
    RetryConfig,
    TlsConfig,
    endpoint_problem,
)
from relay.stages.rewrite_config import RewriteConfig
from relay.stages.route import RouteConfig, kinds_list

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: Headers the relay sets from the body it sends and the answers it reads (lower case), each
#: with why a value given in ``headers`` breaks delivery.
_RELAY_OWNED_HEADERS = {
    "content-length": "the relay frames each body itself; a fixed length breaks every request",
    "transfer-encoding": "the relay frames each body itself; collectors answer 400 to every request",
    "content-encoding": "the relay sends the body uncompressed; collectors cannot read it",
    "accept-encoding": "the relay reads answers uncompressed only; a compressed batch reply is not read, so "
                       "the events it lists as failed count as delivered",
}
#: Headers no token can be sent in: the relay (or its HTTP client) sets them on every request,
#: so a request would carry the header twice, once with the token.
_NOT_FOR_TOKEN = frozenset({*_RELAY_OWNED_HEADERS, "content-type", "user-agent", "host"})


def _controls(text: str) -> bool:
    """Whether ``text`` holds what no HTTP header value can carry: a line break or another
    control character (a horizontal tab is allowed)."""
    return any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text)


DeliveryMode = Literal["passthrough", "consolidated", "coalesce"]
EventKind = Literal["run", "dataset", "job"]


class CollectorConfig(Frozen):
    """One collector. ``type`` picks its kind (:mod:`relay.sinks.kinds`): ``http`` (this
    class, the generic OpenLineage HTTP endpoint), ``marquez``, ``atlan``, ``datahub``,
    ``openmetadata``, or a dotted path ``package.module.Class`` to a third-party kind. Each
    kind's config class derives from this one and supplies its own defaults (endpoint,
    mode, event kinds, size limit) where the user sets none."""

    #: Whether the kind has a batch endpoint (``batch`` is refused otherwise).
    supports_batch: ClassVar[bool] = True
    #: Whether the kind always needs credentials (``token``, ``token_env`` or ``token_file``).
    needs_token: ClassVar[bool] = False
    #: The kind's size limit: ``rewrite.max_event_bytes`` when the user sets none.
    default_max_event_bytes: ClassVar[int | None] = None

    type: str = "http"
    name: str
    url: str
    #: Path appended to ``url``; the OpenLineage HTTP default.
    endpoint: str = "/api/v1/lineage"
    timeout_s: float = Field(10.0, gt=0)
    #: Events in flight at once to this collector (events of one run are always sequential).
    #: Without ``batch`` it is also the number of requests in flight.
    concurrency: int = Field(32, ge=1, le=1024)
    #: Events accepted for this collector but not yet delivered; above it the relay pauses consumption.
    max_pending: int = Field(20_000, ge=1)
    #: Out of repr(): values are often API keys (as tokens, they must never reach a log line).
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    #: The bearer token, at most one of: inline (use ``${VAR}``), ``token_env`` (the name of an
    #: environment variable read at start-up) or ``token_file`` (a mounted secret, re-read
    #: when it changes, without restart).
    token: SecretStr | None = None
    token_env: str | None = None
    token_file: str | None = None
    #: How the token is sent: ``<auth_header>: <auth_scheme> <token>`` (empty scheme: the bare token).
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    tls: TlsConfig = TlsConfig()
    retry: RetryConfig = RetryConfig()
    #: Which events this collector gets (job/dataset namespace and name globs, event types).
    route: RouteConfig = RouteConfig()
    #: Per-collector changes: namespace mapping, credential redaction, facet drop/mask, size cap.
    rewrite: RewriteConfig = RewriteConfig()
    #: Event kinds this collector takes; others are not sent to it (counted as dropped,
    #: reason ``unsupported_event_kind``). The kind sets the default.
    event_kinds: tuple[EventKind, ...] = ("run", "dataset", "job")
    #: ``passthrough``: every event as it comes (ordered per run); ``consolidated``: each run
    #: as its START and one terminal event holding everything the run said; ``coalesce``:
    #: like passthrough with a run's RUNNING events merged per ``coalesce_window_s``.
    mode: DeliveryMode = "passthrough"
    consolidation: ConsolidationConfig = ConsolidationConfig()
    #: Send events in batches to the collector's batch endpoint (kinds that have one).
    batch: BatchConfig | None = None
    #: Learn how many requests the collector takes at once instead of always sending up
    #: to the ceiling (off by default).
    adaptive_concurrency: AdaptiveConcurrencyConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _batch_concurrency(cls, data: Any) -> Any:
        # A batch fills from events in flight: unless told otherwise, keep enough of them
        # in flight to fill every batch request.
        if not isinstance(data, dict) or "concurrency" in data:
            return data
        batch = data["batch"] if "batch" in data else cls.model_fields["batch"].default
        if isinstance(batch, BatchConfig):
            batch = batch.model_dump()
        if isinstance(batch, dict):
            events = batch.get("max_events", BatchConfig.model_fields["max_events"].default)
            requests = batch.get("max_requests", BatchConfig.model_fields["max_requests"].default)
            if isinstance(events, int) and isinstance(requests, int):
                data = {**data, "concurrency": max(1, min(1024, events * requests))}
        return data

    def warnings(self) -> list[str]:
        """What is valid but likely not meant, each naming the key and the fix (run logs
        them at start-up, check-config prints them)."""
        batch = self.batch
        if batch is None or "concurrency" not in self.model_fields_set:
            return []
        full = batch.max_events * batch.max_requests
        if self.concurrency >= min(full, 1024):
            return []
        return [f"collectors.{self.name}.concurrency: at most {self.concurrency} events in flight, fewer than "
                f"batch.max_requests ({batch.max_requests}) full batches of batch.max_events ({batch.max_events}) "
                f"hold ({full}): batches leave smaller and the collector gets more requests; fix: remove "
                f"concurrency (it defaults to batch.max_events x batch.max_requests, at most 1024) or raise it"]

    @model_validator(mode="before")
    @classmethod
    def _kind_size_limit(cls, data: Any) -> Any:
        limit = cls.default_max_event_bytes
        if limit is None or not isinstance(data, dict):
            return data
        rewrite = data.get("rewrite")
        if rewrite is None:
            return {**data, "rewrite": {"max_event_bytes": limit}}
        if isinstance(rewrite, dict) and "max_event_bytes" not in rewrite:
            return {**data, "rewrite": {**rewrite, "max_event_bytes": limit}}
        return data

    @model_validator(mode="after")
    def _kind_rules(self) -> CollectorConfig:
        if self.batch is not None and not type(self).supports_batch:
            raise ValueError(f"batch: type {self.type} has no batch endpoint; remove batch (a server that takes "
                             "POST .../lineage/batch can be configured as type: http with batch)")
        adaptive = self.adaptive_concurrency
        if adaptive is not None:
            ceiling, key = (self.batch.max_requests, "batch.max_requests") if self.batch is not None \
                else (self.concurrency, "concurrency")
            if adaptive.min > ceiling:
                raise ValueError(f"adaptive_concurrency.min: {adaptive.min} is above {key} ({ceiling}), the "
                                 f"ceiling; lower adaptive_concurrency.min or raise {key}")
            if adaptive.initial is not None and not adaptive.min <= adaptive.initial <= ceiling:
                raise ValueError(f"adaptive_concurrency.initial: {adaptive.initial} is outside min..{key} "
                                 f"({adaptive.min}..{ceiling}); set it within them or leave it out")
        if type(self).needs_token and self.token is None and self.token_env is None and self.token_file is None:
            raise ValueError(f"token: type {self.type} needs credentials; set token: ${{VAR}}, "
                             "token_env: VAR or token_file: /path/to/mounted/secret")
        return self

    @model_validator(mode="after")
    def _consolidation_needs_a_mode(self) -> CollectorConfig:
        if self.mode == "passthrough" and "consolidation" in self.model_fields_set:
            raise ValueError("consolidation: only used with mode consolidated or coalesce; "
                             "set mode: consolidated (or coalesce), or remove consolidation")
        # Each holding mode reads one knob the other does not (relay.stages.consolidate).
        given = self.consolidation.model_fields_set
        for key, used_by, other in (("settle_s", "consolidated", "coalesce"),
                                    ("coalesce_window_s", "coalesce", "consolidated")):
            if self.mode == other and key in given:
                raise ValueError(f"consolidation.{key}: only used with mode {used_by}, so under mode {other} it "
                                 f"would have no effect; fix: remove it, or set mode: {used_by}")
        return self

    @model_validator(mode="after")
    def _tls_needs_https(self) -> CollectorConfig:
        # Only settings that differ from the defaults: an all-default block changes nothing.
        if self.tls != TlsConfig() and not self.url.lower().startswith("https://"):
            raise ValueError("tls: only used with an https:// url, and url is http://, so these settings would "
                             "have no effect (the collector is reached in plain text); fix: use the collector's "
                             "https:// url, or remove tls")
        return self

    @model_validator(mode="after")
    def _routes_can_match(self) -> CollectorConfig:
        # A rule that no event the collector takes can match: an include rule that routes
        # nothing, or an exclude rule that excludes nothing.
        taken = set(self.event_kinds)
        for which, rules in (("include", self.route.include), ("exclude", self.route.exclude)):
            for i, rule in enumerate(rules):
                kinds = taken & set(rule.kinds) if rule.kinds is not None else taken
                if not kinds:
                    raise ValueError(
                        f"route.{which}.{i}.kinds: names only event kinds this collector does not take "
                        f"(event_kinds: {', '.join(self.event_kinds)}"
                        f"{'' if 'event_kinds' in self.model_fields_set else f', the default of type {self.type}'}"
                        "); such events are dropped before any rule, so this rule never matches; fix: add "
                        "those kinds to event_kinds, or remove the rule")
                if rule.event_types is not None and "run" not in kinds:
                    raise ValueError(
                        f"route.{which}.{i}.event_types: only RunEvents have an eventType, and this collector "
                        f"takes no RunEvents (event_kinds: {', '.join(self.event_kinds)}), so this rule never "
                        "matches; fix: add run to event_kinds, or remove event_types")
                for key in ("job_namespace", "job_name"):
                    if getattr(rule, key) is not None and not kinds & {"run", "job"}:
                        raise ValueError(
                            f"route.{which}.{i}.{key}: only RunEvents and JobEvents have a job, and this "
                            f"collector takes neither (event_kinds: {', '.join(self.event_kinds)}), so this rule "
                            f"never matches; fix: add run or job to event_kinds, or remove {key}")
        return self

    @field_validator("token")
    @classmethod
    def _printable_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("is empty (an environment variable set but empty gives ''), so every request would be "
                             "refused; set the variable, or remove token (or use token_env or token_file)")
        if v is not None and not v.get_secret_value().strip().isprintable():
            raise ValueError("the token holds a line break or a control character, which no HTTP header can "
                             "carry; set the token alone")
        return v

    @model_validator(mode="after")
    def _one_token_source(self) -> CollectorConfig:
        given = [k for k in ("token", "token_env", "token_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give the token one way only; keep one of them")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("use letters, digits, '_', '.', '-' (it labels metrics and dead-letter records)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        # Never the URL itself in a message: it may come from a variable, with credentials.
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// base URL such as http://marquez:5000")
        if any(c.isspace() or not c.isprintable() for c in v):
            raise ValueError("holds a space, a line break or a control character; write the base URL alone, "
                             "such as http://marquez:5000")
        parts = urlsplit(v)
        if "@" in parts.netloc:
            raise ValueError("holds credentials (user:password@); remove them from the URL and give them as "
                             "token (token_env, token_file) or headers")
        if parts.query or v.endswith("?"):
            raise ValueError("has a query string (?...); the relay appends endpoint to a base URL, so give the "
                             "base URL alone, such as http://marquez:5000")
        if parts.fragment or "#" in v:
            raise ValueError("has a fragment (#...); give the base URL alone, such as http://marquez:5000")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            raise ValueError("has a port that is not a number from 1 to 65535; fix the port, or leave it out "
                             "for the scheme's own (80, 443)")
        if not parts.hostname:
            raise ValueError("has no host; write it such as http://marquez:5000")
        return v.rstrip("/")

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        # Never a value in a message: headers carry API keys.
        for name, value in v.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError("a header name holds a space, ':' or a character HTTP does not allow in one; "
                                 "use letters, digits and '-', such as X-Api-Key")
            if _controls(value):
                raise ValueError(f"{name}: the value holds a line break or a control character, which no HTTP "
                                 "header can carry (a value read from a file often ends in a newline); set the "
                                 "value alone")
            if not value.strip():
                # ${VAR} with VAR set but empty: sent as it is, the collector sees a header
                # without the key it expects (401 for every event), as with a blank token.
                raise ValueError(f"{name}: the value is empty or blank (an environment variable set to \"\"?); "
                                 "fix: give it a value, or remove the header")
        lowered = [name.lower() for name in v]
        for name, value in v.items():
            reason = _RELAY_OWNED_HEADERS.get(name.lower())
            # Accept-Encoding: identity is what the relay sends itself: harmless, so accepted.
            if reason is not None and not (name.lower() == "accept-encoding" and value.strip().lower() == "identity"):
                raise ValueError(f"{name}: the relay sets this header itself ({reason}); fix: remove it from headers")
        repeated = sorted({n for n in lowered if lowered.count(n) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)}: given more than once (header names ignore case); keep one")
        return v

    @field_validator("auth_header")
    @classmethod
    def _auth_header(cls, v: str) -> str:
        if not _HEADER_NAME.fullmatch(v):
            raise ValueError("must be an HTTP header name such as Authorization or X-Api-Key (not empty, no "
                             "spaces or ':'); leave it out for Authorization")
        if v.lower() in _NOT_FOR_TOKEN:
            raise ValueError(f"{v}: the relay sets this header itself on every request, so requests would carry it "
                             "twice, once with the token, and collectors refuse or misread them; fix: send the token "
                             "in the header the collector reads it from, such as Authorization (leave auth_header "
                             "out) or X-Api-Key")
        return v

    @field_validator("auth_scheme")
    @classmethod
    def _auth_scheme(cls, v: str) -> str:
        if _controls(v) or v != v.strip():
            raise ValueError("holds a line break, a control character or surrounding spaces; write the scheme "
                             "alone, such as Bearer, or '' for the bare token")
        return v

    @model_validator(mode="after")
    def _url_is_a_base(self) -> CollectorConfig:
        # A base URL may have a path of its own (a reverse proxy's prefix, http://proxy/marquez);
        # one that already ends with the endpoint the relay appends would post to it twice.
        path = urlsplit(self.url).path.rstrip("/")
        endpoint = self.endpoint.rstrip("/")
        if endpoint and (path == endpoint or path.endswith(endpoint)):
            which = f"the endpoint {endpoint}" if "endpoint" not in self.model_fields_set else "endpoint"
            raise ValueError(f"url: its path ends with {which}, which the relay appends to url (it would post "
                             f"to it twice, and be answered 404); fix: remove {which} from url, keeping only "
                             "the base URL (and a proxy's path prefix, if any)")
        return self

    @model_validator(mode="after")
    def _token_header_is_free(self) -> CollectorConfig:
        if self.token is None and self.token_env is None and self.token_file is None:
            return self
        taken = [name for name in self.headers if name.lower() == self.auth_header.lower()]
        if taken:
            raise ValueError(f"headers.{taken[0]}: the token is sent in this header (auth_header), and would "
                             "replace it; fix: remove it from headers, or remove the token, or send the token "
                             "in another header (auth_header)")
        return self

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        problem = endpoint_problem(v, "/api/v1/lineage", batch=False)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("token_env")
    @classmethod
    def _token_env(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be an environment variable name such as MARQUEZ_TOKEN (not its value)")
        return v

    @field_validator("event_kinds", mode="before")
    @classmethod
    def _event_kinds(cls, v: Any) -> Any:
        return kinds_list(v, "must list at least one of run, dataset, job")

    @property
    def target(self) -> str:
        return self.url + self.endpoint

    @property
    def batch_target(self) -> str | None:
        """Where batches go, or None when this collector takes events one at a time."""
        if self.batch is None:
            return None
        return self.url + (self.batch.endpoint or self.endpoint.rstrip("/") + "/batch")
