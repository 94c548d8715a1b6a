"""Rewriter: per-collector namespace mapping, redaction, facet removal and size limit."""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime

import orjson
import pytest
import yaml
from pydantic import ValidationError

from relay.embedded.sample import CUSTOM_RUN_FACET_SCHEMA_URL, PRODUCER_URI, dataset_event, spark_run
from relay.events import LineageEvent
from relay.stages import rewrite
from relay.stages.decode import decode_record
from relay.stages.event_checks import MAX_DEPTH
from relay.stages.json_bytes import dumps
from relay.stages.rewrite import TOO_LARGE_FOR_COLLECTOR, Rewriter
from relay.stages.rewrite_config import RewriteConfig
from relay.stages.scrub import MASK
from tests.support.spec import validator

START = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
MB = 1_000_000


def run_events(columns: int = 8, **kwargs: object) -> list[dict]:
    return spark_run("spark-prod", "orders_etl.insert.orders_daily", start=START, rng=random.Random(11),
                     columns=columns, **kwargs)


def custom_facet(**fields: object) -> dict:
    return {"_producer": PRODUCER_URI, "_schemaURL": CUSTOM_RUN_FACET_SCHEMA_URL, **fields}


def rewriter(**config: object) -> Rewriter:
    return Rewriter(RewriteConfig.model_validate(config))


def apply_ok(r: Rewriter, doc: dict) -> dict:
    """Apply, check the result is sent and valid per the spec, return it parsed."""
    result = r.apply(doc)
    assert result.rejection is None and result.body is not None
    out = orjson.loads(result.body)
    validator().validate(out)
    return out


# -- no-op ---------------------------------------------------------------------------


def test_empty_config_is_a_noop_that_keeps_the_bytes() -> None:
    doc = run_events()[-1]
    original = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    r = Rewriter(RewriteConfig())
    assert r.is_noop
    result = r.apply(doc, original=original)
    assert result.body is original and result.dropped == [] and result.rejection is None
    assert orjson.loads(r.apply(doc).body) == doc


@pytest.mark.parametrize(
    "config",
    [
        {"namespace_map": [{"from": "a", "to": "b"}]},
        {"redact_credentials": True},
        {"drop_facets": ["x"]},
        {"mask_keys": ["x"]},
        {"max_event_bytes": 4096},
    ],
)
def test_any_setting_makes_it_not_a_noop(config: dict) -> None:
    assert not rewriter(**config).is_noop


def test_unchanged_event_is_forwarded_byte_for_byte() -> None:
    doc = run_events()[0]
    original = orjson.dumps(doc)
    result = rewriter(namespace_map=[{"from": "airflow-*", "to": "x"}]).apply(doc, original=original)
    assert result.body is original


# -- namespace mapping -----------------------------------------------------------------


def test_namespace_map_first_match_wins_and_covers_parent_jobs() -> None:
    r = rewriter(namespace_map=[
        {"from": "spark-prod", "to": "default/spark/1714520000"},
        {"from": "spark-*", "to": "default/spark/other"},
        {"from": "airflow-*", "to": "default/airflow/1714520001"},
    ])
    parent = ("airflow-prod", "orders_dag.spark_orders", "0190e3c1-4c8e-7a2b-9f3d-0a1b2c3d4e5f")
    root = ("airflow-prod", "orders_dag", "0190e3c1-4c8e-7a2b-9f3d-0a1b2c3d4e60")
    doc = run_events(parent=parent, root=root)[-1]
    out = apply_ok(r, doc)
    assert out["job"]["namespace"] == "default/spark/1714520000"
    assert out["run"]["facets"]["parent"]["job"]["namespace"] == "default/airflow/1714520001"
    assert out["run"]["facets"]["parent"]["root"]["job"]["namespace"] == "default/airflow/1714520001"
    # Dataset namespaces are left alone unless asked.
    assert [d["namespace"] for d in out["inputs"]] == [d["namespace"] for d in doc["inputs"]]

    other = spark_run("spark-analytics", "a.b", start=START, rng=random.Random(1))[0]
    assert apply_ok(r, other)["job"]["namespace"] == "default/spark/other"
    untouched = spark_run("flink", "a.b", start=START, rng=random.Random(1))[0]
    assert apply_ok(r, untouched) == untouched


def test_dataset_namespaces_are_mapped_everywhere_they_are_referenced() -> None:
    r = rewriter(
        namespace_map=[{"from": "s3://acme-lake-raw", "to": "s3://lake"}, {"from": "s3://acme-*", "to": "s3://wh"}],
        map_dataset_namespaces=True,
    )
    doc = run_events()[-1]
    out = apply_ok(r, doc)
    assert {d["namespace"] for d in out["inputs"]} == {"s3://lake"}
    assert {d["namespace"] for d in out["outputs"]} == {"s3://wh"}
    lineage = out["outputs"][0]["facets"]["columnLineage"]
    sources = [src for spec in lineage["fields"].values() for src in spec["inputFields"]] + lineage["dataset"]
    assert sources and {src["namespace"] for src in sources} == {"s3://lake"}
    assert out["job"]["namespace"] == "spark-prod"  # no job rule matched
    ds = apply_ok(r, dataset_event("s3://acme-warehouse", "t", event_time=START))
    assert ds["dataset"]["namespace"] == "s3://wh"


def test_symlinks_are_mapped_with_the_datasets_they_name() -> None:
    """A symlink names another identity of the dataset (the Hive table of a path): mapped
    like every other dataset reference, or it would point at a namespace the collector
    never sees."""
    doc = run_events()[-1]
    doc["inputs"][0]["facets"]["symlinks"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/SymlinksDatasetFacet.json#/$defs/SymlinksDatasetFacet",
        "identifiers": [{"namespace": "hive://acme-metastore:9083", "name": "raw.users", "type": "TABLE"},
                        {"namespace": "glue://eu-west-1", "name": "raw.users", "type": "TABLE"}]}
    mapping = [{"from": "hive://acme-*", "to": "hive://metastore"}]
    out = apply_ok(rewriter(namespace_map=mapping, map_dataset_namespaces=True), doc)
    identifiers = out["inputs"][0]["facets"]["symlinks"]["identifiers"]
    assert [i["namespace"] for i in identifiers] == ["hive://metastore", "glue://eu-west-1"]
    assert [i["name"] for i in identifiers] == ["raw.users", "raw.users"]
    # Dataset references are left alone unless asked.
    assert apply_ok(rewriter(namespace_map=mapping), doc)["inputs"][0]["facets"]["symlinks"] == \
        doc["inputs"][0]["facets"]["symlinks"]


LINEAGE_SCHEMA = "https://openlineage.io/spec/facets/1-0-0/LineageFacet.json#/$defs/"


def test_the_lineage_facet_is_mapped_with_the_datasets_and_jobs_it_names() -> None:
    """The ``lineage`` facet (LineageDatasetFacet on a dataset, LineageJobFacet on a job)
    names source and target datasets and jobs: mapped like every other reference (datasets
    with map_dataset_namespaces, jobs as the event's job), or they would dangle."""
    doc = run_events()[-1]

    def ref(namespace: str, kind: str = "DATASET", **more: object) -> dict:
        return {"namespace": namespace, "name": "t", "type": kind, **more}

    doc["outputs"][0]["facets"]["lineage"] = {
        "_producer": PRODUCER_URI, "_schemaURL": LINEAGE_SCHEMA + "LineageDatasetFacet",
        "inputs": [ref("hive://acme-metastore:9083"), ref("spark-prod", "JOB")],
        "fields": {"id": {"inputs": [ref("hive://acme-metastore:9083", field="id"), {"type": "JOB"}]}}}
    doc["job"].setdefault("facets", {})["lineage"] = {
        "_producer": PRODUCER_URI, "_schemaURL": LINEAGE_SCHEMA + "LineageJobFacet",
        "entries": [
            {**ref("hive://acme-metastore:9083"), "inputs": [ref("spark-prod", "JOB")],
             "fields": {"total": {"inputs": [ref("glue://eu-west-1", field="x")]}}},
            {**ref("spark-prod", "JOB"), "inputs": [ref("hive://acme-metastore:9083")]},
            {"type": "JOB", "inputs": [ref("hive://acme-metastore:9083")]}]}
    mapping = [{"from": "hive://acme-*", "to": "hive://metastore"}, {"from": "spark-prod", "to": "default/spark"}]
    out = apply_ok(rewriter(namespace_map=mapping, map_dataset_namespaces=True), doc)
    on_dataset = out["outputs"][0]["facets"]["lineage"]
    assert [i["namespace"] for i in on_dataset["inputs"]] == ["hive://metastore", "default/spark"]
    assert on_dataset["fields"]["id"]["inputs"] == [ref("hive://metastore", field="id"), {"type": "JOB"}]
    entries = out["job"]["facets"]["lineage"]["entries"]
    assert [e.get("namespace") for e in entries] == ["hive://metastore", "default/spark", None]
    assert [[i["namespace"] for i in e["inputs"]] for e in entries] == \
        [["default/spark"], ["hive://metastore"], ["hive://metastore"]]
    assert entries[0]["fields"]["total"]["inputs"][0]["namespace"] == "glue://eu-west-1"  # no rule for it
    # Without map_dataset_namespaces, only the jobs it names are mapped (as the event's job is).
    jobs_only = apply_ok(rewriter(namespace_map=mapping), doc)
    assert [i["namespace"] for i in jobs_only["outputs"][0]["facets"]["lineage"]["inputs"]] == \
        ["hive://acme-metastore:9083", "default/spark"]
    assert [e.get("namespace") for e in jobs_only["job"]["facets"]["lineage"]["entries"]] == \
        ["hive://acme-metastore:9083", "default/spark", None]
    assert doc["outputs"][0]["facets"]["lineage"]["inputs"][0]["namespace"] == "hive://acme-metastore:9083"


def test_job_dependencies_and_a_renamed_datasets_previous_identifier_are_mapped() -> None:
    """jobDependencies names upstream and downstream jobs (mapped as the event's job is);
    lifecycleStateChange's previousIdentifier names a dataset (mapped with
    map_dataset_namespaces): left alone, they would dangle."""
    doc = run_events()[-1]
    doc["run"].setdefault("facets", {})["jobDependencies"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/JobDependenciesRunFacet.json"
                      "#/$defs/JobDependenciesRunFacet",
        "upstream": [{"job": {"namespace": "spark-prod", "name": "extract"},
                      "run": {"runId": "01934b5e-0000-7000-8000-000000000002"}},
                     {"job": {"namespace": "airflow", "name": "sensor"}}],
        "downstream": [{"job": {"namespace": "spark-prod", "name": "report"}}]}
    doc["outputs"][0].setdefault("facets", {})["lifecycleStateChange"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/LifecycleStateChangeDatasetFacet.json"
                      "#/$defs/LifecycleStateChangeDatasetFacet",
        "lifecycleStateChange": "RENAME", "previousIdentifier": {"namespace": "hive://acme-metastore:9083",
                                                                 "name": "old_t"}}
    mapping = [{"from": "hive://acme-*", "to": "hive://metastore"}, {"from": "spark-prod", "to": "default/spark"}]
    out = apply_ok(rewriter(namespace_map=mapping, map_dataset_namespaces=True), doc)
    deps = out["run"]["facets"]["jobDependencies"]
    assert [d["job"]["namespace"] for d in deps["upstream"]] == ["default/spark", "airflow"]
    assert deps["downstream"][0]["job"] == {"namespace": "default/spark", "name": "report"}
    assert deps["upstream"][0]["run"] == {"runId": "01934b5e-0000-7000-8000-000000000002"}
    previous = out["outputs"][0]["facets"]["lifecycleStateChange"]["previousIdentifier"]
    assert previous == {"namespace": "hive://metastore", "name": "old_t"}
    # Without map_dataset_namespaces, the jobs only.
    jobs_only = apply_ok(rewriter(namespace_map=mapping), doc)
    assert jobs_only["run"]["facets"]["jobDependencies"]["downstream"][0]["job"]["namespace"] == "default/spark"
    assert jobs_only["outputs"][0]["facets"]["lifecycleStateChange"] == \
        doc["outputs"][0]["facets"]["lifecycleStateChange"]
    assert doc["run"]["facets"]["jobDependencies"]["upstream"][0]["job"]["namespace"] == "spark-prod"


def test_an_exact_namespace_holding_brackets_matches_itself() -> None:
    """An IPv6 host (postgres://[fd00::1]:5432, per the naming spec) is no character class."""
    doc = dataset_event("postgres://[fd00::1]:5432", "public.t", event_time=START)
    r = rewriter(namespace_map=[{"from": "postgres://[fd00::1]:5432", "to": "pg"}], map_dataset_namespaces=True)
    assert apply_ok(r, doc)["dataset"]["namespace"] == "pg"


# -- credentials ---------------------------------------------------------------------

URIS_WITH_SECRETS = [
    ("s3a://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@acme-raw",
     "s3a://acme-raw", ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "bPxRfiCYEXAMPLEKEY"]),
    ("postgres://etl_user:pw-123@db.internal:5432/sales",
     "postgres://db.internal:5432/sales", ["etl_user", "pw-123"]),
    ("postgres://etl_user:p@ss@db.internal:5432/sales",
     "postgres://db.internal:5432/sales", ["etl_user", "p@ss"]),
    ("jdbc:postgresql://db.internal:5432/sales?user=etl&password=hunter2&ssl=true",
     "jdbc:postgresql://db.internal:5432/sales?user=etl&ssl=true", ["hunter2"]),
    ("jdbc:postgresql://db.internal/sales?password=hunter2",
     "jdbc:postgresql://db.internal/sales", ["hunter2"]),
    ("jdbc:sqlserver://sql.internal:1433;databaseName=dw;user=etl;password=s3cret",
     "jdbc:sqlserver://sql.internal:1433;databaseName=dw;user=etl", ["s3cret"]),
    ("https://acct.blob.core.windows.net/container?sv=2022-11-02&ss=b&srt=co&sp=rl"
     "&se=2030-01-01T00:00:00Z&sig=AbCdEf%2BgHiJ%3D",
     "https://acct.blob.core.windows.net/container", ["sig=", "AbCdEf"]),
    ("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAXX%2F20240501"
     "&X-Amz-Signature=deadbeef00",
     "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256", ["AKIAXX", "deadbeef00"]),
    ("mongodb://admin:Pa55w0rd@h1:27017,h2:27017/app?authSource=admin&TOKEN=abc123",
     "mongodb://h1:27017,h2:27017/app?authSource=admin", ["Pa55w0rd", "abc123"]),
    ("redis://:r3d1s@cache:6379", "redis://cache:6379", ["r3d1s"]),
    # A user name holding '@' (Azure Database's user@server), and an e-mail as the user.
    ("postgresql://myadmin@mydemoserver:S3cret@mydemoserver.postgres.database.azure.com:5432/db",
     "postgresql://mydemoserver.postgres.database.azure.com:5432/db", ["myadmin", "S3cret"]),
    ("smtp://me@gmail.com:apppass@smtp.gmail.com", "smtp://smtp.gmail.com", ["me@gmail", "apppass"]),
    # A token as the whole userinfo, over https (a sourceCodeLocation's git URL).
    ("https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/org/repo.git",
     "https://github.com/org/repo.git", ["ghp_16C7e42F"]),
    # A braced JDBC value may hold ';'.
    ("jdbc:sqlserver://sql.internal:1433;databaseName=dw;password={a;b}",
     "jdbc:sqlserver://sql.internal:1433;databaseName=dw", ["{a", "b}"]),
    # Generated passwords hold '#', '?', '{', '[' unencoded.
    ("postgresql://etl:Xy#9kq@db.internal:5432/warehouse", "postgresql://db.internal:5432/warehouse", ["Xy#9kq"]),
    ("jdbc:mysql://root:p?ss@mysql:3306/app", "jdbc:mysql://mysql:3306/app", ["p?ss"]),
    ("mongodb://admin:s3cr{e}t@mongo:27017/db", "mongodb://mongo:27017/db", ["s3cr{e}t"]),
    ("redis://:Secr3t[1]@cache:6379", "redis://cache:6379", ["Secr3t[1]"]),
    ("postgresql://etl:#abc@db", "postgresql://db", ["#abc"]),
    # A password holding "'" (RFC 3986 allows it raw in userinfo; generated passwords hold it).
    ("postgres://app:ab'S3cret@db:5432/sales", "postgres://db:5432/sales", ["ab'S3cret", "S3cret"]),
    ("jdbc:mysql://app:S3cret'x@db/x", "jdbc:mysql://db/x", ["S3cret"]),
    # ... and a secret parameter's value: it was cut there, the rest of it sent on.
    ("jdbc:postgresql://db/x?password=ab'S3cret&ssl=true", "jdbc:postgresql://db/x?ssl=true", ["S3cret"]),
    # A password holding "://": it was taken for the start of another URL, and kept whole.
    ("postgres://etl:S3c://R3t@db:5432/sales", "postgres://db:5432/sales", ["S3c", "R3t"]),
    # Parameters whose names hold a secret word (Trino, pgjdbc, BigQuery, Snowflake, MySQL, Azure).
    ("jdbc:trino://trino:443/hive?user=u&accessToken=S3cret", "jdbc:trino://trino:443/hive?user=u", ["S3cret"]),
    ("jdbc:postgresql://db/x?user=u&sslpassword=S3cret", "jdbc:postgresql://db/x?user=u", ["S3cret"]),
    ("jdbc:bigquery://https://www.googleapis.com/bigquery/v2:443;ProjectId=p;OAuthType=2;OAuthAccessToken=S3cret",
     "jdbc:bigquery://https://www.googleapis.com/bigquery/v2:443;ProjectId=p;OAuthType=2", ["S3cret"]),
    ("jdbc:snowflake://a.snowflakecomputing.com/?user=u&private_key_file_pwd=S3cret",
     "jdbc:snowflake://a.snowflakecomputing.com/?user=u", ["S3cret"]),
    ("jdbc:mysql://db/x?trustCertificateKeyStorePassword=S3cret", "jdbc:mysql://db/x", ["S3cret"]),
    # OAuth's implicit flow puts the token in the fragment.
    ("https://app.example.com/cb#access_token=S3cret&token_type=bearer", "https://app.example.com/cb", ["S3cret"]),
    ("https://app.example.com/cb#access_token=S3cret&state=xyz", "https://app.example.com/cb#state=xyz", ["S3cret"]),
    # Oracle thin: user/password@ without "//"; the '@' stays (the URL's form without credentials).
    ("jdbc:oracle:thin:scott/S3cret@//db:1521/svc", "jdbc:oracle:thin:@//db:1521/svc", ["scott", "S3cret"]),
    ("jdbc:oracle:thin:scott/S3cret@db:1521:orcl", "jdbc:oracle:thin:@db:1521:orcl", ["scott", "S3cret"]),
    ("jdbc:oracle:thin:scott/pa@S3cret@db:1521:orcl", "jdbc:oracle:thin:@db:1521:orcl", ["scott", "S3cret"]),
]


@pytest.mark.parametrize("uri, clean, secrets", URIS_WITH_SECRETS)
def test_credentials_are_stripped_everywhere(uri: str, clean: str, secrets: list[str]) -> None:
    doc = run_events()[0]
    dataset = doc["inputs"][0]
    dataset["namespace"] = uri
    dataset["name"] = uri
    dataset["facets"]["dataSource"].update(name=uri, uri=uri)
    doc["run"]["facets"]["connector_log"] = custom_facet(
        attempts=[{"message": f"could not connect to {uri} (timeout)"}]
    )
    doc["job"]["facets"]["sql"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-1-0/SQLJobFacet.json#/$defs/SQLJobFacet",
        "query": f"COPY INTO t FROM '{uri}'",
    }
    before = copy.deepcopy(doc)

    result = rewriter(redact_credentials=True).apply(doc)
    for secret in secrets:
        assert secret not in result.body.decode()
    out = orjson.loads(result.body)
    validator().validate(out)
    got = out["inputs"][0]
    assert (got["namespace"], got["name"]) == (clean, clean)
    assert (got["facets"]["dataSource"]["name"], got["facets"]["dataSource"]["uri"]) == (clean, clean)
    assert out["run"]["facets"]["connector_log"]["attempts"][0]["message"] == f"could not connect to {clean} (timeout)"
    assert out["job"]["facets"]["sql"]["query"] == f"COPY INTO t FROM '{clean}'"
    assert doc == before


@pytest.mark.parametrize(
    "text",
    [
        "abfss://container@account.dfs.core.windows.net",  # naming convention, not a credential
        "wasbs://container@account.blob.core.windows.net/path",
        "postgres://readonly@db:5432",  # a user name alone is kept
        "postgres://db:5432/sales?note=a@b",
        "http://host:8080/a?email=ops@example.com",
        "s3://bucket/path/with:colon",
        "https://example.com/search?q=password",
        "sessions",
        # Not userinfo: an IPv6 host, a path holding '@', a template, a port then a path.
        "https://[2001:db8::1]/files/report@2024.csv",
        "http://[::1]:8080/path/user@example.com",
        "http://${host}:${port}/api?email=a@b.com",
        "http://host:80?email=a@b.com",
        "http://host:80#a@b.com",
        "https://host/files/report@2024.csv",
        # Azure SAS names are common words elsewhere: removed only beside a sig.
        "https://api.example.com/items?st=open&sp=2&page=3",
        # Only a query a secret was removed from is tidied up, not every '?'.
        "SELECT * FROM t WHERE a = ? AND b = ?",
        # A URL in quotes ends there: what follows is not its password (a quoted e-mail).
        "VALUES ('http://h:80','ops@example.com')",
        "`http://h:80`,`ops@example.com`",
        # Parameters that name a dataset stay.
        "jdbc:snowflake://a.snowflakecomputing.com/?db=SALES&schema=PUBLIC&warehouse=WH&role=R",
        "jdbc:bigquery://https://www.googleapis.com/bigquery/v2:443;ProjectId=p;DefaultDataset=d",
        "jdbc:sqlserver://sql.internal:1433;databaseName=dw;encrypt=true",
        "DefaultEndpointsProtocol=https;AccountName=a;EndpointSuffix=core.windows.net",
        # Fragments without secrets, Oracle and ssh URLs without a password.
        "https://example.com/docs#token-rotation",
        "https://app.example.com/#/route?id=1",
        "jdbc:oracle:thin:@//db:1521/svc",
        "jdbc:oracle:thin:@db:1521:orcl",
        "ssh://git@github.com/org/repo",
        "git@github.com:org/repo.git",
    ],
)
def test_strings_without_credentials_are_kept(text: str) -> None:
    doc = run_events()[0]
    doc["inputs"][0]["namespace"] = text
    doc["run"]["facets"]["note"] = custom_facet(text=text)
    out = orjson.loads(rewriter(redact_credentials=True).apply(doc).body)
    assert out["inputs"][0]["namespace"] == text
    assert out["run"]["facets"]["note"]["text"] == text


@pytest.mark.parametrize("text, clean", [
    ("SELECT * FROM t WHERE a = ? AND u = 'https://h/p?sig=s'", "SELECT * FROM t WHERE a = ? AND u = 'https://h/p'"),
    ("Is this right? see https://h/p?token=abc", "Is this right? see https://h/p"),
    ("https://h/p?a=1&token=x&b=2", "https://h/p?a=1&b=2"),
    ("https://h/p?token=x&b=2", "https://h/p?b=2"),
    ("https://u:p@host/a@b", "https://host/a@b"),
    # A URL quoted in a message (an errorMessage facet): what follows its host is no path.
    ("Connection to postgresql://etl:hunter2@db.internal:5432, failed",
     "Connection to postgresql://db.internal:5432, failed"),
    ("could not reach (postgresql://etl:hunter2@db.internal)", "could not reach (postgresql://db.internal)"),
    ("url postgresql://etl:hunter2@db.internal.", "url postgresql://db.internal."),
    ("FATAL at jdbc:postgresql://etl:hunter2@db.internal:5432. Retrying",
     "FATAL at jdbc:postgresql://db.internal:5432. Retrying"),
    # A password holding '@' and a dot: not cut at the first '@'.
    ("s3a://KEY:ab@cd.ef@bucket.example", "s3a://bucket.example"),
    # ... nor at an '@' followed by what ends a URL in a message ('!', '=', ')'...).
    ("connecting to postgres://admin:Str0ng@Pass!2024@db.example.com:5432/prod failed",
     "connecting to postgres://db.example.com:5432/prod failed"),
    ("jdbc uri mysql://etl:s3cr3t@x*y@db:3306/app", "jdbc uri mysql://db:3306/app"),
    ("mongodb://svc:Abc@def$ghi@mongo-1:27017,mongo-2:27017/db", "mongodb://mongo-1:27017,mongo-2:27017/db"),
    ("https://user:my@pass.word!@host.example.com/path", "https://host.example.com/path"),
    ("postgres://u:p@ssw0rd=1@db/x", "postgres://db/x"),
    ("failed (postgres://u:pa@ss)@db.internal)", "failed (postgres://db.internal)"),
    # Whatever follows the host: a closing backtick, CJK punctuation, a non-ASCII host,
    # characters no host has, a template, a zero-width space.
    ("cannot connect to `postgres://u:S3cret@db` (timeout)", "cannot connect to `postgres://db` (timeout)"),
    ("连接失败 postgres://u:S3cret@db。重试", "连接失败 postgres://db。重试"),
    ("https://u:S3cret@bücher.example/x", "https://bücher.example/x"),
    ("postgres://u:S3cret@db*", "postgres://db*"),
    ("postgres://u:S3cret@db|x", "postgres://db|x"),
    ("postgres://u:S3cret@db&x=1", "postgres://db&x=1"),
    ("postgres://u:S3cret@db\\x", "postgres://db\\x"),
    ("postgres://u:S3cret@db:{port}/x", "postgres://db:{port}/x"),
    ("postgres://u:S3cret@db\u200b/x", "postgres://db\u200b/x"),
    ("1postgres://u:S3cret@db/x", "1postgres://db/x"),
    # A secret parameter's value runs past a quote, except one that can close a quoted URL.
    ("https://h/p?password=ab'S3cret&x=1", "https://h/p?x=1"),
    ("https://h/p?password=ab''S3cret", "https://h/p"),
    ("SELECT * FROM t WHERE url='https://h/p?password=S3cret' AND id=1",
     "SELECT * FROM t WHERE url='https://h/p' AND id=1"),
    ("IN ('https://h/p?token=S3cret','https://h/q?a=1&token=it''s')", "IN ('https://h/p','https://h/q?a=1')"),
    ("f('https://h/p?token=S3cret')", "f('https://h/p')"),
    # Another URL after "://" past the userinfo's ':' is the password's only with an '@' after
    # it; one after a host and port (a list of URLs) is not.
    ("http://h:8080,postgres://u:S3cret@db/x", "http://h:8080,postgres://db/x"),
    ("kafka://b1:9092,b2:9092,postgres://u:S3cret@db/x", "kafka://b1:9092,b2:9092,postgres://db/x"),
    ("http://a.example,postgres://u:S3cret@db/x", "http://a.example,postgres://db/x"),
    ("postgres://u:S3c://R3t@db/x and mysql://v:S3c2@db2/y", "postgres://db/x and mysql://db2/y"),
    ("http://u:S3c://R3t@h/x,postgres://v:S3c2@db/y", "http://h/x,postgres://db/y"),
    # A quoted URL ends at its closing quote, a password's quote (doubled, as SQL escapes it) aside.
    ("error: 'postgres://app:ab'S3cret@db:5432/sales'", "error: 'postgres://db:5432/sales'"),
    ("VALUES ('postgres://app:ab''S3cret@db', 'x')", "VALUES ('postgres://db', 'x')"),
    ("a ?token=x#section", "a #section"),
    # Azure connection strings (not URIs: ';'-separated keys).
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=S3cret",
     "Endpoint=sb://ns.servicebus.windows.net/"),
    ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=S3cret;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=a;EndpointSuffix=core.windows.net"),
    ("https://h/p?a=1#id_token=x", "https://h/p?a=1"),
])
def test_removing_a_secret_leaves_the_rest_of_the_text_as_it_was(text: str, clean: str) -> None:
    doc = run_events()[0]
    doc["run"]["facets"]["note"] = custom_facet(text=text)
    out = orjson.loads(rewriter(redact_credentials=True).apply(doc).body)
    assert out["run"]["facets"]["note"]["text"] == clean


def test_secret_query_params_are_configurable() -> None:
    doc = dataset_event("https://api.example.com/v1?apikey=k1&session=s1", "t", event_time=START)
    default = orjson.loads(rewriter(redact_credentials=True).apply(doc).body)
    assert default["dataset"]["namespace"] == "https://api.example.com/v1?session=s1"
    custom = orjson.loads(rewriter(redact_credentials=True, secret_query_params=["session"]).apply(doc).body)
    assert custom["dataset"]["namespace"] == "https://api.example.com/v1?apikey=k1"


def test_a_name_holding_a_secret_word_goes_unless_a_list_of_ones_own_says_otherwise() -> None:
    """The default takes any name holding password, token, secret...: a non-secret one too
    (tokenizer), which a list of one's own keeps; '*' in an entry is any run of name characters."""
    doc = dataset_event("https://api.example.com/v1?tokenizer=bert&page_token=p1&passphrase=x&mypass=y", "t",
                        event_time=START)
    default = orjson.loads(rewriter(redact_credentials=True).apply(doc).body)
    assert default["dataset"]["namespace"] == "https://api.example.com/v1?passphrase=x&mypass=y"
    custom = orjson.loads(rewriter(redact_credentials=True, secret_query_params=["*_token", "pass*"]).apply(doc).body)
    assert custom["dataset"]["namespace"] == "https://api.example.com/v1?tokenizer=bert&mypass=y"


def test_credentials_in_producer_and_schema_urls_are_stripped_too() -> None:
    """The event's producer and schemaURL and every facet's _producer and _schemaURL are
    never masked (mask_keys), but they are strings of the event like any other: a URL there
    loses its credentials, and stays a URI (the spec's format for them)."""
    doc = run_events()[0]
    doc["producer"] = "https://ci:S3cret1@git.example.com/OpenLineage/x"
    doc["schemaURL"] = doc["schemaURL"] + "?token=S3cret0"
    doc["run"]["facets"]["custom"] = {"_producer": "https://ghp_S3cret2@github.com/x",
                                      "_schemaURL": "https://h.example.com/s.json?token=S3cret3#/$defs/Custom",
                                      "v": "postgres://u:S3cret4@db/x"}
    doc["inputs"][0]["facets"]["dataSource"]["_producer"] = "https://u:S3cret5@git.example.com/y"
    before = copy.deepcopy(doc)
    for r in (rewriter(redact_credentials=True), rewriter(redact_credentials=True, mask_keys=["_*"])):
        out = apply_ok(r, doc)
        assert "S3cret" not in orjson.dumps(out).decode()
        assert out["producer"] == "https://git.example.com/OpenLineage/x"
        assert out["schemaURL"] == before["schemaURL"].removesuffix("?token=S3cret0")
        assert out["run"]["facets"]["custom"]["_producer"] == "https://github.com/x"
        assert out["run"]["facets"]["custom"]["_schemaURL"] == "https://h.example.com/s.json#/$defs/Custom"
        assert out["inputs"][0]["facets"]["dataSource"]["_producer"] == "https://git.example.com/y"
    assert doc == before
    dataset = dataset_event("postgres://db:5432", "sales.orders", event_time=START)
    dataset["producer"] = "https://ghp_S3cret6@github.com/x"
    assert apply_ok(rewriter(redact_credentials=True), dataset)["producer"] == "https://github.com/x"


def test_an_event_without_credentials_is_forwarded_byte_for_byte_with_redaction_on() -> None:
    doc = run_events()[0]
    original = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    assert rewriter(redact_credentials=True).apply(doc, original=original).body is original


# -- dropping and masking ------------------------------------------------------------


def test_drop_facets_removes_them_from_every_place() -> None:
    doc = run_events()[-1]
    doc["job"]["facets"]["custom_owner"] = custom_facet(team="billing")
    doc["outputs"][0]["facets"]["custom_quality"] = custom_facet(score=1)
    doc["inputs"][0]["inputFacets"] = {"custom_scan": custom_facet(files=3)}
    r = rewriter(drop_facets=["processing_engine", "outputStatistics", "dataSource", "custom_*"])
    out = apply_ok(r, doc)
    assert set(out["run"]["facets"]) == set(doc["run"]["facets"]) - {"processing_engine"}
    assert set(out["job"]["facets"]) == {"jobType"}
    assert set(out["outputs"][0]["facets"]) == {"schema", "columnLineage"}
    assert out["outputs"][0]["outputFacets"] == {}
    assert out["inputs"][0]["inputFacets"] == {}
    assert all(set(d["facets"]) == {"schema"} for d in out["inputs"])
    # Everything else is as it was.
    assert out["outputs"][0]["facets"]["columnLineage"] == doc["outputs"][0]["facets"]["columnLineage"]
    assert out["inputs"][0]["facets"]["schema"] == doc["inputs"][0]["facets"]["schema"]


def test_mask_keys_anywhere_in_facets_case_insensitively() -> None:
    doc = run_events()[0]
    properties = doc["run"]["facets"]["spark_properties"]["properties"]
    properties.update({
        "spark.hadoop.fs.s3a.secret.key": "wJalrXUtnFEMI",
        "SPARK.HADOOP.FS.S3A.ACCESS.KEY": "AKIAIOSFODNN7EXAMPLE",
        "spark.jdbc.options": {"client_secret": {"v": "nested-secret"}, "user": "etl"},
    })
    doc["run"]["facets"]["environmentVariables"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/EnvironmentVariablesRunFacet.json"
                      "#/$defs/EnvironmentVariablesRunFacet",
        "environmentVariables": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "wJalr2"}, {"name": "HOME", "value": "/h"}],
    }
    r = rewriter(mask_keys=["*secret*", "spark.hadoop.fs.s3a.access.key", "AWS_*"])
    out = apply_ok(r, doc)
    got = out["run"]["facets"]["spark_properties"]["properties"]
    assert got["spark.hadoop.fs.s3a.secret.key"] == MASK
    assert got["SPARK.HADOOP.FS.S3A.ACCESS.KEY"] == MASK
    assert got["spark.jdbc.options"] == {"client_secret": {"v": MASK}, "user": "etl"}  # each value inside
    assert got["spark.master"] == properties["spark.master"]
    assert out["run"]["facets"]["environmentVariables"]["environmentVariables"] == [
        {"name": "AWS_SECRET_ACCESS_KEY", "value": MASK}, {"name": "HOME", "value": "/h"}
    ]
    for secret in ("wJalr", "AKIAIOSFODNN7EXAMPLE", "nested-secret"):
        assert secret not in orjson.dumps(out).decode()
    # Facet envelopes are never masked, whatever the pattern.
    assert rewriter(mask_keys=["*"]).apply(doc).body.count(b'"_producer":"https://') == orjson.dumps(doc).count(
        b'"_producer":"https://'
    )


# -- size limit ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def huge_event() -> tuple[dict, bytes]:
    """A ~21 MB COMPLETE event: a 20-column schema and columnLineage, a ~12 MB custom
    run facet, a ~9 MB spark_properties facet and a small custom output facet."""
    doc = run_events(columns=20)[-1]
    facets = doc["run"]["facets"]
    facets["huge_debug"] = custom_facet(tasks=[
        {"stage": i // 100, "task": i, "host": f"worker-{i % 50}.cluster.local", "metric": "bytesRead", "value": i * 7}
        for i in range(130_000)
    ])
    facets["spark_properties"] = custom_facet(properties={
        f"spark.custom.setting.number_{i:06d}": f"value-{i}-" + "x" * 40 for i in range(100_000)
    })
    doc["outputs"][0]["facets"]["small_note"] = custom_facet(note="n" * 1_000)
    body = orjson.dumps(doc)
    assert len(body) > 20 * MB
    return doc, body


def lineage(doc: dict) -> tuple:
    def datasets(group: str) -> list:
        return [(d["namespace"], d["name"], d["facets"].get("schema"), d["facets"].get("columnLineage"))
                for d in doc[group]]
    return datasets("inputs"), datasets("outputs")


def test_huge_event_is_shrunk_under_the_limit_keeping_lineage(huge_event, monkeypatch) -> None:
    doc, original = huge_event
    encoded: list[int] = []
    real_dumps = orjson.dumps
    monkeypatch.setattr(rewrite.orjson, "dumps", lambda *a, **k: encoded.append(len(out := real_dumps(*a, **k))) or out)

    # drop_facets makes the rewritten tree differ from ``original``: its size is still
    # worked out by parts, not by encoding it whole.
    result = rewriter(max_event_bytes=5 * MB, drop_facets=["outputStatistics"]).apply(doc, original=original)

    monkeypatch.undo()
    assert result.rejection is None
    assert len(result.body) < 5 * MB
    assert result.dropped == ["huge_debug", "spark_properties"]  # largest first, then stop
    out = orjson.loads(result.body)
    validator().validate(out)
    assert lineage(out) == lineage(doc)
    assert len(out["outputs"][0]["facets"]["schema"]["fields"]) == 20
    assert len(out["outputs"][0]["facets"]["columnLineage"]["fields"]) == 20
    assert "small_note" in out["outputs"][0]["facets"]
    assert set(out["run"]["facets"]) == set(doc["run"]["facets"]) - {"huge_debug", "spark_properties"}
    assert "outputStatistics" not in out["outputs"][0]["outputFacets"]
    # Bounded work and memory: the whole event is never encoded, each facet once.
    assert max(encoded) < len(original) * 0.7
    assert sum(encoded) < len(original) + len(result.body) + 10_000
    assert orjson.dumps(doc) == original  # the shared input is untouched


def test_shrink_order_is_followed(huge_event) -> None:
    doc, original = huge_event
    limit = 13 * MB
    default = rewriter(max_event_bytes=limit).apply(doc, original=original)
    assert default.dropped == ["huge_debug"]
    ordered = rewriter(max_event_bytes=limit, shrink_order=["spark_properties", "*"]).apply(doc, original=original)
    assert ordered.dropped == ["spark_properties"]
    assert len(ordered.body) <= limit
    only = rewriter(max_event_bytes=5 * MB, shrink_order=["spark_properties"]).apply(doc, original=original)
    assert only.body is None and only.rejection[0] == TOO_LARGE_FOR_COLLECTOR


def test_essential_facets_are_kept_unless_named() -> None:
    doc = run_events(columns=3_000)[0]  # START: inputs with large schemas
    compact = orjson.dumps(doc)
    limit = len(compact) - 2_000  # more than the droppable spark_properties facet
    rejected = rewriter(max_event_bytes=limit).apply(doc)
    assert rejected.body is None and rejected.dropped == []
    reason, detail = rejected.rejection
    assert reason == TOO_LARGE_FOR_COLLECTOR
    assert f"event is {len(compact)} bytes" in detail and f"max_event_bytes of {limit}" in detail
    assert "spark_properties" in detail
    assert doc == run_events(columns=3_000)[0]

    result = rewriter(max_event_bytes=limit, shrink_order=["spark_properties", "schema"]).apply(doc)
    assert result.dropped == ["spark_properties", "schema"]
    out = orjson.loads(result.body)
    validator().validate(out)
    assert len(result.body) <= limit
    assert sum("schema" in d["facets"] for d in out["inputs"]) == len(doc["inputs"]) - 1


def test_event_that_cannot_shrink_enough_is_rejected() -> None:
    doc = run_events()[0]
    doc["inputs"] = [{"namespace": "s3://acme-lake-raw", "name": f"raw/part-{i:06d}"} for i in range(40_000)]
    size = len(orjson.dumps(doc))
    result = rewriter(max_event_bytes=MB).apply(doc)
    assert result.body is None and result.dropped == []
    reason, detail = result.rejection
    assert reason == TOO_LARGE_FOR_COLLECTOR
    assert str(size) in detail and str(MB) in detail
    assert len(doc["inputs"]) == 40_000


def test_whitespace_alone_is_not_a_reason_to_drop() -> None:
    doc = run_events(columns=20)[-1]
    pretty = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    compact = orjson.dumps(doc)
    limit = (len(pretty) + len(compact)) // 2
    result = rewriter(max_event_bytes=limit).apply(doc, original=pretty)
    assert result.body == compact and result.dropped == []
    assert rewriter(max_event_bytes=len(pretty)).apply(doc, original=pretty).body is pretty


def test_everything_together_leaves_the_input_untouched(huge_event) -> None:
    doc, original = huge_event
    small = run_events()[-1]
    small["inputs"][0]["namespace"] = "s3a://AKIA:secret@acme-lake-raw"
    small["run"]["facets"]["debug"] = custom_facet(text="d" * 4_000)
    before = copy.deepcopy(small)
    r = rewriter(
        namespace_map=[{"from": "spark-*", "to": "atlan"}, {"from": "s3a://*", "to": "s3://lake"}],
        map_dataset_namespaces=True, redact_credentials=True, drop_facets=["outputStatistics"],
        mask_keys=["spark.*"], max_event_bytes=8192,
    )
    result = r.apply(small)
    assert result.rejection is None and result.dropped == ["debug"]
    out = orjson.loads(result.body)
    validator().validate(out)
    assert out["job"]["namespace"] == "atlan" and out["inputs"][0]["namespace"] == "s3://lake"
    assert small == before
    # The huge event is masked and redacted, then rejected (20 columns of lineage do not
    # fit in 8 KiB): nothing of that may leak into the shared input either.
    assert r.apply(doc, original=original).rejection[0] == TOO_LARGE_FOR_COLLECTOR
    assert orjson.dumps(doc) == original


# -- configuration -------------------------------------------------------------------

YAML_EXAMPLE = """
namespace_map:
  - {from: spark-prod, to: default/spark/1714520000}
  - {from: "spark-*", to: default/spark/other}
map_dataset_namespaces: false
redact_credentials: true
drop_facets: [spark_unknown, "spark.logicalPlan"]
mask_keys: ["*secret*", "*password*", "spark.hadoop.fs.s3a.*.key"]
max_event_bytes: 5000000
shrink_order: [spark_properties, "*"]
"""


def test_documented_yaml_example_is_valid() -> None:
    config = RewriteConfig.model_validate(yaml.safe_load(YAML_EXAMPLE))
    assert config.namespace_map[0].from_ == "spark-prod"
    assert config.shrink_order == ("spark_properties", "*")
    assert not Rewriter(config).is_noop


@pytest.mark.parametrize(
    "config, where",
    [
        ({"drop_facet": ["x"]}, "drop_facet"),
        ({"namespace_map": [{"from": "a"}]}, "to"),
        ({"namespace_map": [{"from": "a", "to": ""}]}, "to"),
        ({"max_event_bytes": 10}, "max_event_bytes"),
        ({"shrink_order": ["x"]}, "max_event_bytes"),
        ({"secret_query_params": ["x"]}, "redact_credentials"),
        ({"map_dataset_namespaces": True}, "namespace_map"),
        ({"namespace_map": [{"from": "postgres://[fd00::1]:*", "to": "pg"}]}, "write [[] for a literal ["),
        ({"mask_keys": [""]}, "mask_keys"),
    ],
)
def test_bad_config_is_rejected_naming_the_key(config: dict, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        RewriteConfig.model_validate(config)
    assert where in str(err.value)


# -- depth ---------------------------------------------------------------------------


def test_an_event_as_deep_as_decode_accepts_is_rewritten() -> None:
    # Deeper than orjson writes (254 levels) and than Python's recursion limit: redaction,
    # masking, dropping and the size limit all still apply, at every depth.
    doc = run_events()[0]
    value: object = {"url": "postgres://etl:hunter2@db:5432/x", "password": "pw", "keep": "postgres://db/x"}
    levels_above = 5  # the event, run, facets, deep, its "value"
    for _ in range(MAX_DEPTH - levels_above - 1):
        value = [value]
    doc["run"]["facets"]["deep"] = custom_facet(value=value)
    doc["run"]["facets"]["dropped"] = custom_facet(note="n" * 5_000)
    raw = dumps(doc)
    decoded = decode_record(raw, max_bytes=1 << 22)
    assert isinstance(decoded, LineageEvent), decoded  # decode takes it: so must every collector's rewrite
    r = rewriter(redact_credentials=True, mask_keys=["password"], drop_facets=["spark_*"],
                 max_event_bytes=len(raw) - 1_000)
    result = r.apply(orjson.loads(raw), original=raw)
    assert result.rejection is None and result.dropped == ["dropped"]
    body = result.body
    assert body.count(b"[") - body.count(b"]") == 0 and b"[" * (MAX_DEPTH - levels_above - 1) + b"{" in body
    assert b"hunter2" not in body and b'"password":"***"' in body and b"postgres://db/x" in body
    assert b"spark_" not in body and b'"dropped"' not in body
    assert decode_record(body, max_bytes=1 << 22).kind == "run"
    # Nothing to change: the original bytes, as for any event.
    assert rewriter(mask_keys=["nothing-here"]).apply(orjson.loads(raw), original=raw).body is raw


def test_the_loop_for_deep_values_scrubs_exactly_as_the_recursion_does() -> None:
    """Shallow facets take the recursion, deep ones the loop: the same event must come out
    the same whichever took it (and unchanged parts stay the very same objects)."""
    r = rewriter(redact_credentials=True, mask_keys=["password", "*secret*", "fields"])
    rng = random.Random(7)
    leaves = ["postgres://etl:hunter2@db:5432/x", "plain", "https://tok@h/p?sig=abc", 3, None, True, MASK, 2.5]

    def tree(depth: int) -> object:
        if depth == 0 or rng.random() < 0.2:
            return rng.choice(leaves)
        if rng.random() < 0.5:
            return [tree(depth - 1) for _ in range(rng.randint(0, 3))]
        keys = ["password", "name", "value", "url", "client_secret", "_producer", "note", "fields"]
        return {rng.choice(keys): tree(depth - 1) for _ in range(rng.randint(0, 4))}

    for i in range(600):
        facet = tree(6)
        names = "fields" if i % 2 else None  # the key of a map keyed by column names, as in columnLineage
        nested, deep = r._scrubber._scrub_nested(facet, names), r._scrubber._scrub_deep(facet, names)
        assert nested == deep
        assert (nested is facet) == (deep is facet)


def test_mask_keys_mask_values_never_column_names_and_keep_the_event_valid() -> None:
    """Maps keyed by column names (columnLineage.fields, dataQualityMetrics.columnMetrics,
    lineage.fields) hold lineage, not secrets: a column named like a mask pattern keeps its
    entry, and the event stays valid per the spec (a collector refuses it otherwise). A
    matching key whose value is an object or a list has each value inside it masked."""
    doc = run_events(columns=3)[-1]
    output = doc["outputs"][0]
    source = {"namespace": "s3://acme-lake-raw", "name": "raw/users", "field": "password"}
    output["facets"]["columnLineage"]["fields"].update({
        "password_hash": {"inputFields": [source]},
        "customer_key": {"inputFields": [{**source, "field": "id"}]},
    })
    output["facets"]["lineage"] = {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/LineageFacet.json#/$defs/LineageDatasetFacet",
        "fields": {"secret_question": {"inputs": [{"namespace": "s3://acme-lake-raw", "name": "raw/users",
                                                   "type": "DATASET", "field": "secret_q"}]}},
    }
    doc["inputs"][0]["inputFacets"] = {"dataQualityMetrics": {
        "_producer": PRODUCER_URI,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-2/DataQualityMetricsInputDatasetFacet.json"
                      "#/$defs/DataQualityMetricsInputDatasetFacet",
        "rowCount": 10, "columnMetrics": {"password": {"nullCount": 0, "distinctCount": 9}}}}
    doc["run"]["facets"]["vault"] = custom_facet(
        secrets={"db": {"password": "hunter2", "port": 5432, "tls": True, "note": None}},
        api_secret=["tok-1", {"k": "tok-2"}], user="etl")
    validator().validate(doc)
    for masks in (["*secret*", "*password*"], ["*key*"]):  # README's example; a mask for API keys
        out = apply_ok(rewriter(mask_keys=masks), doc)  # valid per the spec
        assert out["outputs"][0]["facets"]["columnLineage"] == output["facets"]["columnLineage"]
        assert out["outputs"][0]["facets"]["lineage"] == output["facets"]["lineage"]
        assert out["inputs"][0]["inputFacets"] == doc["inputs"][0]["inputFacets"]
    vault = apply_ok(rewriter(mask_keys=["*secret*"]), doc)["run"]["facets"]["vault"]
    # Every value inside, at any depth; a boolean or null holds nothing to hide and is kept.
    assert vault["secrets"] == {"db": {"password": MASK, "port": MASK, "tls": True, "note": None}}
    assert vault["api_secret"] == [MASK, {"k": MASK}] and vault["user"] == "etl"
