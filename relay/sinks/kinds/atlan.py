"""``type: atlan``: Atlan's OpenLineage ingestion.

``POST https://<tenant>.atlan.com/events/openlineage/<connector>/api/v1/lineage`` with the
Atlan API key as ``Authorization: Bearer <key>`` (required). Give ``tenant`` and
``connector`` (e.g. ``spark``, ``airflow``) and the URL is built; ``url`` replaces the
``https://<tenant>.atlan.com`` part (a proxy, a test server).

Atlan only makes lineage of a run from its START and one terminal event (COMPLETE, FAIL
or ABORT), so the default ``mode`` is ``consolidated``: each run goes as its START and
one terminal event holding everything the run said. It takes RunEvents only. Job
namespaces must equal the Atlan connection name: map them with ``rewrite.namespace_map``.
Default size limit: 5 MB per event (shrunk by dropping facets first, see ``rewrite``).

A connector path Atlan is not set up for is answered 401 with ``Unauthorized: url path not
configured to receive data, urlPath: ...`` (what pyatlan and the Java SDK turn into
OPENLINEAGE_NOT_CONFIGURED). That is not a credentials problem: the event is dead-lettered
as ``connector_not_enabled`` (even with a ``token_file``, whose 401s are otherwise retried)
and one ERROR line of that name says which connector to enable, or to fix ``connector``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import model_validator

from relay.config import CollectorConfig, DeliveryMode, EventKind
from relay.sinks.base import Undeliverable
from relay.sinks.kinds.base import CollectorKind

_TENANT = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CONNECTOR = re.compile(r"^[A-Za-z0-9_-]+$")
#: Atlan's answer to a connector path it is not set up to receive events on.
NOT_CONFIGURED = b"url path not configured to receive data"


def endpoint_for(connector: str) -> str:
    return f"/events/openlineage/{connector}/api/v1/lineage"


class AtlanConfig(CollectorConfig):
    supports_batch: ClassVar[bool] = False
    needs_token: ClassVar[bool] = True
    default_max_event_bytes: ClassVar[int | None] = 5_000_000

    type: str = "atlan"
    #: ``acme`` for https://acme.atlan.com (or give ``url``).
    tenant: str | None = None
    #: The OpenLineage connector in the path, e.g. ``spark`` or ``airflow``.
    connector: str
    mode: DeliveryMode = "consolidated"
    event_kinds: tuple[EventKind, ...] = ("run",)

    @model_validator(mode="before")
    @classmethod
    def _url_from_tenant(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        tenant, connector = data.get("tenant"), data.get("connector")
        if tenant is not None and data.get("url") is not None:
            raise ValueError("tenant and url: give one; tenant builds https://<tenant>.atlan.com")
        if isinstance(tenant, str):
            if not _TENANT.match(tenant):
                raise ValueError("tenant: not an Atlan tenant name (it may hold only lower-case letters, digits "
                                 "and '-', starting with a letter or digit); use the first label of "
                                 "<tenant>.atlan.com, e.g. acme")
            data = {**data, "url": f"https://{tenant}.atlan.com"}
        elif data.get("url") is None:
            raise ValueError("tenant: type atlan needs tenant (https://<tenant>.atlan.com) or url")
        if isinstance(connector, str):
            if not _CONNECTOR.fullmatch(connector):  # match's $ lets a final newline pass
                raise ValueError("connector: must be one path segment of letters, digits, '_' and '-', such as "
                                 "spark or airflow")
            if "endpoint" not in data:
                data = {**data, "endpoint": endpoint_for(connector)}
        return data


class AtlanKind(CollectorKind):
    kind = "atlan"
    config_class = AtlanConfig
    success_statuses = frozenset({200, 201, 202})
    permanent_statuses = frozenset({400, 401, 403, 404, 413, 422})

    @classmethod
    def refusal(cls, config: CollectorConfig, status: int, body: bytes) -> Undeliverable | None:
        if status != 401 or NOT_CONFIGURED not in body.lower():
            return None
        connector = getattr(config, "connector", "?")
        answer = body[:300].decode("utf-8", "replace")
        return Undeliverable(
            "connector_not_enabled",
            f"connector not enabled in Atlan: {config.target} is not set up to receive OpenLineage events, so Atlan "
            f"refuses every event sent there (not a credentials problem). Enable the OpenLineage connector "
            f"{connector!r} in Atlan, or set connector: to one that is enabled. Atlan answered HTTP 401: {answer}",
            status)
