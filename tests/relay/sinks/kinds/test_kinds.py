"""Collector kinds: ``type:`` picks a kind whose config class supplies the contract's
defaults and validates its keys; dotted paths plug in third-party kinds."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from relay.config import build_config
from relay.errors import ConfigError
from relay.metrics import RelayMetrics
from relay.sinks.batch import BatchCollector
from relay.sinks.envelope import json_array
from relay.sinks.http import HttpCollector
from relay.sinks.kinds import build_collector
from relay.sinks.kinds.atlan import AtlanKind
from relay.sinks.kinds.datahub import DataHubKind
from relay.sinks.kinds.marquez import MarquezKind
from relay.sinks.kinds.openmetadata import OpenMetadataKind, events_object
from relay.sinks.retry import Verdict
from tests.support.kind_servers import DATAHUB, MARQUEZ, OPENMETADATA, KindServer, atlan


def collector(**entry):
    return build_config({"kafka": {"bootstrap_servers": "k:9092"}, "collectors": [{"name": "c", **entry}]}).collectors[0]


def rejected(**entry) -> str:
    with pytest.raises(ConfigError) as err:
        collector(**entry)
    return str(err.value)


def test_existing_configs_are_the_generic_http_kind():
    c = collector(url="http://marquez:5000", token="t", endpoint="/api/v1/lineage")
    assert c.type == "http" and c.target == "http://marquez:5000/api/v1/lineage"
    assert c.mode == "passthrough" and c.event_kinds == ("run", "dataset", "job") and c.batch is None
    assert type(build_collector(c, RelayMetrics().for_collector("c"))) is HttpCollector


def test_marquez_defaults_and_contract():
    c = collector(type="marquez", url="http://marquez:5000")
    assert c.target == "http://marquez:5000/api/v1/lineage" and c.event_kinds == ("run", "dataset", "job")
    assert MarquezKind.classify(201) is Verdict.SUCCESS
    assert MarquezKind.classify(400) is MarquezKind.classify(422) is Verdict.REJECT
    assert MarquezKind.classify(503) is Verdict.RETRY
    assert "type marquez has no batch endpoint" in rejected(type="marquez", url="http://m", batch={})


def test_atlan_builds_its_url_from_tenant_and_connector_and_holds_runs():
    c = collector(type="atlan", tenant="acme", connector="spark", token="key")
    assert c.target == "https://acme.atlan.com/events/openlineage/spark/api/v1/lineage"
    assert c.mode == "consolidated", "Atlan needs START + one terminal per run"
    assert c.event_kinds == ("run",) and c.rewrite.max_event_bytes == 5_000_000
    assert collector(type="atlan", tenant="acme", connector="spark", token="k", mode="passthrough").mode == "passthrough"
    assert collector(type="atlan", tenant="acme", connector="spark", token="k",
                     rewrite={"redact_credentials": True}).rewrite.max_event_bytes == 5_000_000
    proxied = collector(type="atlan", url="http://127.0.0.1:8080", connector="airflow", token_file="/run/key")
    assert proxied.target == "http://127.0.0.1:8080/events/openlineage/airflow/api/v1/lineage"
    assert "needs credentials" in rejected(type="atlan", tenant="acme", connector="spark")
    assert "needs tenant" in rejected(type="atlan", connector="spark", token="k")
    assert "not an Atlan tenant name" in rejected(type="atlan", tenant="https://acme.atlan.com", connector="s",
                                                  token="k")
    assert "collectors.c.connector: Field required" in rejected(type="atlan", tenant="acme", token="k")
    assert AtlanKind.classify(200) is Verdict.SUCCESS and AtlanKind.classify(401) is Verdict.REJECT


def test_datahub_defaults_and_contract():
    c = collector(type="datahub", url="http://gms:8080", token="pat")
    assert c.target == "http://gms:8080/openapi/openlineage/api/v1/lineage" and c.event_kinds == ("run",)
    assert collector(type="datahub", url="http://gms:8080", event_kinds=["run", "dataset"]).event_kinds == \
        ("run", "dataset")
    assert DataHubKind.classify(201) is Verdict.SUCCESS and DataHubKind.classify(422) is Verdict.REJECT


def test_openmetadata_batches_by_default_with_its_envelope():
    c = collector(type="openmetadata", url="http://om:8585", token="jwt")
    assert c.target == "http://om:8585/api/v1/openlineage/lineage"
    assert c.batch_target == "http://om:8585/api/v1/openlineage/lineage/batch"
    assert c.event_kinds == ("run",) and c.concurrency == c.batch.max_events * c.batch.max_requests
    assert type(build_collector(c, RelayMetrics().for_collector("c"))) is BatchCollector
    assert events_object([b'{"a":1}', b'{"b":2}']) == b'{"events":[{"a":1},{"b":2}]}'
    single = collector(type="openmetadata", url="http://om:8585", token="jwt", batch=None)
    assert single.batch is None and single.concurrency == 32
    assert "needs credentials" in rejected(type="openmetadata", url="http://om:8585")
    assert OpenMetadataKind.classify(200) is Verdict.SUCCESS and OpenMetadataKind.classify(403) is Verdict.REJECT


@pytest.mark.parametrize("count", [0, 1, 2, 3, 200])
def test_batch_envelopes_hold_every_event_in_order_and_parse(count):
    bodies = [orjson.dumps({"eventType": "START", "run": {"runId": str(i)}}) for i in range(count)]
    assert orjson.loads(json_array(bodies)) == [orjson.loads(b) for b in bodies]
    assert orjson.loads(events_object(bodies)) == {"events": [orjson.loads(b) for b in bodies]}
    assert json_array(bodies) == b"[" + b",".join(bodies) + b"]"


def test_generic_batch_endpoint_follows_the_spec_layout():
    c = collector(url="http://h", endpoint="/ol/api/v1/lineage", batch={"max_events": 50, "max_requests": 2})
    assert c.batch_target == "http://h/ol/api/v1/lineage/batch" and c.concurrency == 100
    assert collector(url="http://h", batch={"endpoint": "/bulk"}).batch_target == "http://h/bulk"
    assert collector(url="http://h", batch={}, concurrency=8).concurrency == 8
    assert "collectors.c.batch.max_events" in rejected(url="http://h", batch={"max_events": 0})
    assert "collectors.c.batch.lingr_ms: unknown key; did you mean linger_ms?" in rejected(url="http://h",
                                                                                        batch={"lingr_ms": 5})


def test_unknown_types_and_keys_name_the_key_and_the_fix():
    refused = rejected(type="marques", url="http://m")
    assert "collectors.c.type: unknown collector type; use one of http, marquez" in refused
    assert "marques" not in refused  # a value is never echoed (it may come from a variable)
    assert "collectors.c.tenant: unknown key; fix: remove it" in rejected(type="marquez", url="http://m", tenant="x")
    assert "collectors.c.event_kinds.0" in rejected(url="http://m", event_kinds=["runs"])
    assert "give the token one way only" in rejected(url="http://m", token="a", token_env="B")
    assert "token_env: must be an environment variable name" in rejected(url="http://m", token_env="abc-def")


def test_a_dotted_path_plugs_in_a_third_party_kind():
    c = collector(type="tests.support.plugin_kind.InboxKind", url="http://unused", mailbox="lineage")
    assert type(c).__name__ == "InboxConfig" and c.mailbox == "lineage"
    built = build_collector(c, RelayMetrics().for_collector("c"))
    assert type(built).__name__ == "InboxCollector" and built.mailbox == "lineage"
    assert "collectors.c.mailbox: Field required" in rejected(type="tests.support.plugin_kind.InboxKind", url="http://u")


def test_a_bad_dotted_path_says_what_to_install_or_fix():
    # The dotted path is never echoed (it may come from a variable): what is wrong with it is said.
    refused = rejected(type="lineage_acme.kinds.Acme", url="http://a")
    assert "collectors.c.type: cannot import the module of this dotted path (ModuleNotFoundError); install the " \
           "package that provides it" in refused and "lineage_acme" not in refused
    refused = rejected(type="tests.support.plugin_kind.Missing", url="http://a")
    assert "the module has no class of the name the dotted path ends with" in refused and "Missing" not in refused
    assert "is not a collector kind; it must subclass relay.sinks.kinds.CollectorKind" in \
        rejected(type="tests.support.plugin_kind.NotAKind", url="http://a")


def _run_event(i: int) -> bytes:
    return orjson.dumps({"eventTime": "2024-01-01T00:00:00Z", "producer": "https://p", "schemaURL": "https://s",
                         "eventType": "COMPLETE", "run": {"runId": f"r{i}"}, "job": {"namespace": "n", "name": "j"}})


@pytest.mark.parametrize("kind,entry", [
    ("marquez", {}),
    ("atlan", {"connector": "spark", "token": "atlan-key"}),
    ("datahub", {"token": "datahub-token"}),
    ("openmetadata", {"token": "om-jwt", "batch": None}),
    ("openmetadata", {"token": "om-jwt", "batch": {"max_events": 3, "linger_ms": 5}}),
])
async def test_each_kind_speaks_its_services_contract(kind, entry):
    """Against a loopback stand-in checking path, credentials and body shape."""
    contract = {"marquez": MARQUEZ, "atlan": atlan("spark"), "datahub": DATAHUB, "openmetadata": OPENMETADATA}[kind]
    with KindServer(contract, token=entry.get("token")) as server:
        c = collector(type=kind, url=server.url, **entry)
        built = build_collector(c, RelayMetrics().for_collector("c"))
        await built.start()
        try:
            results = await asyncio.gather(*(built.deliver(_run_event(i)) for i in range(5)))
        finally:
            await built.close()
    assert results == [None] * 5, results
    assert sorted(e["run"]["runId"] for e in server.received()) == [f"r{i}" for i in range(5)]
    seen = server.seen()
    if c.batch is None:
        assert {(r.path, r.status, r.events) for r in seen} == {(contract.path, contract.ok_status, 1)}
    else:
        assert {(r.path, r.status) for r in seen} == {(contract.batch_path, 200)} and len(seen) == 2  # 3 + 2
    assert {r.authorization for r in seen} == {f"Bearer {entry['token']}" if "token" in entry else None}
