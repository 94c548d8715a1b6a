"""JDBC dataset names: the naming spec's namespace and name, never a credential."""

from __future__ import annotations

import time

import pytest

from producer.spark.naming import MASK, from_jdbc, mask_sql


@pytest.mark.parametrize("url, namespace, name", [
    # Oracle thin, service name and SID forms, with and without user/password.
    ("jdbc:oracle:thin:scott/tiger@//db:1521/ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:scott/tiger@db:1521:ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:@//db:1521/ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:@db:1521:ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:scott/tiger@(DESCRIPTION=(ADDRESS=(PROTOCOL=TCP)(HOST=db)(PORT=1521))"
     "(CONNECT_DATA=(SERVICE_NAME=ORCL)))", "oracle://db:1521", "ORCL.hr.emp"),
    # DB2 properties after the database.
    ("jdbc:db2://db:50000/SAMPLE:user=scott;password=tiger;", "db2://db:50000", "SAMPLE.hr.emp"),
    ("jdbc:db2://db:50000/SAMPLE", "db2://db:50000", "SAMPLE.hr.emp"),
    # Others that carry credentials in the URL.
    ("jdbc:postgresql://scott:tiger@db:5432/shop?password=tiger", "postgres://db:5432", "shop.hr.emp"),
    ("jdbc:sqlserver://db:1433;databaseName=shop;user=scott;password=tiger", "sqlserver://db:1433", "shop.hr.emp"),
    ("jdbc:teradata://db/DATABASE=shop,USER=scott,PASSWORD=tiger", "teradata://db:1025", "shop.hr.emp"),
    ("jdbc:mysql://db:3306/shop;password=tiger", "mysql://db:3306", "shop.hr.emp"),
])
def test_jdbc_names_follow_the_spec_without_credentials(url, namespace, name):
    got = from_jdbc(url, "hr.emp")
    assert got == (namespace, name)
    assert not any(secret in part.lower() for part in got for secret in ("scott", "tiger", "user", "password"))


@pytest.mark.parametrize("url, namespace", [
    # A URL without a port names the server as one with the default port does (the spec's
    # {host}:{port}), with the defaults the official integration fills in.
    ("jdbc:postgresql://db/shop", "postgres://db:5432"),
    ("jdbc:mysql://db/shop", "mysql://db:3306"),
    ("jdbc:oracle:thin:@//db/shop", "oracle://db:1521"),
    ("jdbc:oracle:thin:scott/tiger@db:shop", "oracle://db:1521"),
    ("jdbc:db2://db/shop", "db2://db:6789"),
    ("jdbc:trino://db/shop", "trino://db:443"),
    ("jdbc:clickhouse:http://db/shop", "clickhouse://db:8123"),
    ("jdbc:teradata://db/DATABASE=shop", "teradata://db:1025"),
    # A port given elsewhere in the URL is the port.
    ("jdbc:teradata://db/DATABASE=shop,DBS_PORT=1026", "teradata://db:1026"),
    ("jdbc:sqlserver://db;portNumber=1444;databaseName=shop", "sqlserver://db:1444"),
    # Failover lists: each server; IPv6 addresses stay bracketed.
    ("jdbc:postgresql://db1:5433,db2/shop", "postgres://db1:5433,db2:5432"),
    ("jdbc:mysql:loadbalance://db1,db2:3307/shop", "mysql://db1:3306,db2:3307"),
    ("jdbc:mysql+srv://db/shop", "mysql://db:3306"),
    ("jdbc:postgresql://scott:tiger@[::1]/shop", "postgres://[::1]:5432"),
    # No default in the official integration: the host alone, as it names them.
    ("jdbc:sqlserver://db;databaseName=shop", "sqlserver://db"),
    ("jdbc:redshift://cluster.example.com/shop", "redshift://cluster.example.com"),
    # A scheme with a hyphen is one name, not a sub-protocol.
    ("jdbc:informix-sqli://db:1533/shop", "informix-sqli://db:1533"),
])
def test_a_jdbc_server_without_a_port_in_its_url_is_named_with_its_default_port(url, namespace):
    assert from_jdbc(url, "t")[0] == namespace


@pytest.mark.parametrize(("statement", "masked"), [
    ("CREATE TABLE t USING jdbc OPTIONS (url 'jdbc:postgresql://db:5432/x?user=a&password=S3cret', "
     "dbtable 'orders', user 'app', password 'S3cret')",
     "CREATE TABLE t USING jdbc OPTIONS (url 'jdbc:postgresql://db:5432/x?user=a&password=***', "
     "dbtable 'orders', user 'app', password '***')"),
    ("CREATE TABLE t USING x OPTIONS ('spark.secret.key' = \"S3cret\", `apiKey` 'S3cret', 'path' '/a')",
     "CREATE TABLE t USING x OPTIONS ('spark.secret.key' = \"***\", `apiKey` '***', 'path' '/a')"),
    ("CREATE TABLE t LOCATION 's3a://AKIAX:S3cret@bucket/x' TBLPROPERTIES ('fs.s3a.access.key'='AKIAX')",
     "CREATE TABLE t LOCATION 's3a://AKIAX:***@bucket/x' TBLPROPERTIES ('fs.s3a.access.key'='***')"),
    ("INSERT INTO t SELECT * FROM jdbc_view -- jdbc:sqlserver://h;user=a;password=S3cret;databaseName=x",
     "INSERT INTO t SELECT * FROM jdbc_view -- jdbc:sqlserver://h;user=a;password=***;databaseName=x"),
    ("CREATE TABLE t OPTIONS (token 'a\\'b')", "CREATE TABLE t OPTIONS (token '***')"),
])
def test_credentials_in_a_sql_statement_are_masked(statement, masked):
    assert mask_sql(statement) == masked


@pytest.mark.parametrize("statement", [
    "INSERT INTO sales SELECT id, amount * 2 AS doubled FROM orders WHERE region = 'EU'",
    "SELECT 'my password is' AS p, 'x' FROM t WHERE note = 'token'",   # literals that merely mention one
    "SELECT * FROM t WHERE a = 'it''s' AND b = \"q\"",
    "CREATE TABLE t USING parquet LOCATION 's3a://bucket/p?versionId=3' TBLPROPERTIES ('owner'='data')",
])
def test_a_statement_without_credentials_is_kept_as_written(statement):
    assert mask_sql(statement) == statement


def test_an_error_facet_masks_credentials_spark_quotes_from_the_statement():
    from producer.spark.capture import error_facet

    message = ("[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012\n== SQL (line 1, position 60) ==\n"
               "CREATE TABLE t USING jdbc OPTIONS (url 'jdbc:postgresql://u:S3cret@db/x', password 'S3cret') AS "
               "SELECT 1/0")
    facet = error_facet(message, f"org.apache.spark.SparkArithmeticException: {message}\n\tat x.y(z.scala:1)")
    body = facet["errorMessage"]
    assert "S3cret" not in body["message"] and "S3cret" not in body["stackTrace"]
    assert body["message"].startswith("[DIVIDE_BY_ZERO] Division by zero.") and "password '***'" in body["message"]


# Found by review: forms that leaked, SQL that was damaged, patterns that went quadratic.
LEAKS = {
    "CREATE TABLE k USING kafka OPTIONS ('kafka.sasl.jaas.config' = 'org.apache.kafka.common.security.plain."
    "PlainLoginModule required username=\"u\" password=\"JaasSecret1\";')": "JaasSecret1",
    "CREATE TABLE t USING parquet LOCATION "
    "'https://acct.blob.core.windows.net/c/p?sv=2022-11-02&ss=b&sp=rl&sig=SasSig%2Bsecret%3D'": "SasSig",
    "CREATE TABLE o USING jdbc OPTIONS (url 'jdbc:oracle:thin:scott/OraSecret1@dbhost:1521/ORCL', dbtable 'x')":
        "OraSecret1",
    "CREATE TABLE j USING jdbc OPTIONS (url 'jdbc:postgresql://h/db', password r'RawSecret1', dbtable 'x')":
        "RawSecret1",
    "CREATE TABLE j USING jdbc OPTIONS (url 'jdbc:postgresql://h/db', password 83457291, dbtable 'x')": "83457291",
    "SET spark.hadoop.fs.s3a.secret.key=SetSecret1": "SetSecret1",
    "SET `spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net`=AcctKey1": "AcctKey1",
    "CREATE TABLE j USING jdbc OPTIONS (password 'Abc' 'ConcatTail1')": "ConcatTail1",
    "SELECT from_json('{\"password\": \"JsonSecret1\"}', 'password STRING')": "JsonSecret1",
    "CREATE TABLE s USING parquet LOCATION 's3a://AKIAEXAMPLE:wJalr/SlashSecret1@bucket/p'": "SlashSecret1",
    "SET spark.a=1; set spark.datasource.password = Two Words;": "Two Words",
}


@pytest.mark.parametrize("statement", sorted(LEAKS))
def test_no_credential_form_survives_masking(statement):
    masked = mask_sql(statement)
    assert LEAKS[statement] not in masked, masked
    assert MASK in masked


@pytest.mark.parametrize("statement", [
    "INSERT INTO facts SELECT * FROM src WHERE account_key = 'ACC-0042'",
    "INSERT INTO t SELECT * FROM s WHERE token_type = 'refresh'",
    "INSERT INTO t SELECT * FROM s WHERE region_arkansas_flag = 'Y'",
    "INSERT INTO t SELECT * FROM s WHERE url LIKE 'http://%@%'",
    "INSERT INTO t SELECT * FROM s WHERE kind IN ('token', 'session') AND concat('secret', 'value') <> ''",
    "CREATE TABLE sales USING delta LOCATION 'abfss://raw@lakeacct.dfs.core.windows.net/sales/2024'",
    "INSERT INTO t SELECT * FROM parquet.`wasbs://bronze@acct.blob.core.windows.net/events`",
    "SET spark.sql.shuffle.partitions=4",
    "UPDATE t SET password_changed = true WHERE id = 1",
])
def test_sql_without_a_credential_is_not_damaged(statement):
    assert mask_sql(statement) == statement


@pytest.mark.parametrize("statement", [
    "SET a" + " " * 1_000_000 + "=x",
    "SELECT " + "a." * 500_000 + "a FROM t",
    "SELECT '" + "a:" * 500_000 + "' FROM t",
    "x://a:b" * 150_000,
    "?password=" * 100_000,
    "password=\"" * 100_000,
    "CREATE TABLE t OPTIONS (" + "password 'x', " * 70_000 + ")",
    "SELECT '" + "a'' " * 250_000,
    "/*" * 500_000,
    "jdbc:oracle:thin:a/" * 50_000,
], ids=["blanks", "dotted", "colons", "urls", "params", "assign", "options", "quotes", "comments", "oracle"])
def test_masking_a_megabyte_of_hostile_text_does_not_hang(statement):
    # A guard against patterns that backtrack quadratically (minutes on these inputs), not a
    # speed target: those live in bench/.
    # CPU time of this thread: a loaded machine's waits for a core are not mask_sql's.
    started = time.thread_time()
    mask_sql(statement)
    assert time.thread_time() - started < 10


@pytest.mark.spark
def test_a_relative_path_is_read_under_the_name_it_was_written_under(spark, tmp_path):
    """A directory a streaming file sink wrote is read back through its ``_spark_metadata``
    log, whose root Spark leaves as given: a relative path is qualified as Spark resolves it
    (against the JVM's working directory), so the batch read, the streaming write and the
    batch write of the same data name one dataset."""
    import os
    import shutil
    import uuid

    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder
    from tests.support.relay import eventually
    from tests.support.spec import validator

    user_dir = str(spark.sparkContext._jvm.java.lang.System.getProperty("user.dir"))
    top = f".lineage_relay_relative_{uuid.uuid4().hex[:12]}"   # under the JVM's working directory
    relative = f"{top}/out"
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1, "v": "x"}\n')
    recorder = Recorder()
    lineage = enable_lineage(spark, producer=recorder, namespace="st", app_name="st")
    try:
        query = (spark.readStream.schema("id BIGINT, v STRING").json(str(source)).writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start(relative))
        assert query.awaitTermination(120)
        assert eventually(lambda: any(e["eventType"] == "COMPLETE" for e in recorder.runs().get(str(query.runId), [])),
                          60)
        spark.read.parquet(relative).write.mode("overwrite").parquet(str(tmp_path / "copy"))
        lineage.drain()
    finally:
        disable_lineage(spark)
        shutil.rmtree(os.path.join(user_dir, top), ignore_errors=True)
    absolute = ("file", os.path.join(user_dir, relative))
    streamed = recorder.runs()[str(query.runId)][-1]
    assert [(d["namespace"], d["name"]) for d in streamed["outputs"]] == [absolute]
    copy = [e for e in recorder.events if e["eventType"] == "COMPLETE"
            and [d["name"] for d in e["outputs"]] == [str(tmp_path / "copy")]]
    assert len(copy) == 1
    assert [(d["namespace"], d["name"]) for d in copy[0]["inputs"]] == [absolute]
    for event in recorder.events:
        validator().validate(event)


_KEY_VALUE_URLS = [
    # MySQL's key-value host forms and AS400's ;properties: the reviewer's repro, where the
    # password was part of the namespace and the dataSource facet.
    ("jdbc:mysql://(host=db1,port=3306,user=etl,password=S3cretPw)/sales", "mysql://db1:3306", "sales.t"),
    ("jdbc:mysql://address=(host=db1)(port=3306)(user=etl)(password=S3cretPw)/sales", "mysql://db1:3306", "sales.t"),
    ("jdbc:as400://db1;user=etl;password=S3cretPw", "as400://db1", "t"),
    # Lists of them, a password holding "@", "/" or "," inside the parentheses, user info.
    ("jdbc:mysql://etl:S3cretPw@(host=db1,port=1111,password=a@S3cretPw/x),(host=db2,port=2222)/sales",
     "mysql://db1:1111,db2:2222", "sales.t"),
    ("jdbc:mysql://[(host=db1,password=S3cretPw),address=(host=db2)(port=7)(password=S3cretPw)]/sales",
     "mysql://db1:3306,db2:7", "sales.t"),
    ("jdbc:mysql://address=(protocol=tcp)(host=[::1])(port=3306)(password=S3cretPw)/sales",
     "mysql://[::1]:3306", "sales.t"),
    ("jdbc:as400://db1;password=S3c@S3cretPw", "as400://db1", "t"),
    ("jdbc:db2://db1:50000;user=etl;password=S3cretPw", "db2://db1:50000", "t"),
]


@pytest.mark.parametrize("url", ["jdbc:mysql://app:4821;xK9@db.corp:3306/sales",
                                 "jdbc:mysql://app:pa(ss@db.corp:3306/sales",
                                 "jdbc:mysql://app:pa[ss@db.corp:3306/sales",
                                 "jdbc:mysql://app:p)a]s;s@db.corp:3306/sales"])
def test_a_password_in_user_info_holding_a_semicolon_or_a_parenthesis_names_the_server(url):
    """The key-value fix cut at ";" before removing user info (``app:4821;xK9@db`` was named
    ``mysql://app:4821``: the user and the start of the password) and grouped "(" of a
    password (``mysql://`` and no database)."""
    assert from_jdbc(url, "orders") == ("mysql://db.corp:3306", "sales.orders")


@pytest.mark.parametrize("url, namespace, name", _KEY_VALUE_URLS)
def test_key_value_host_forms_give_the_host_and_port_alone(url, namespace, name):
    got = from_jdbc(url, "t")
    assert got == (namespace, name)
    assert not any(s in part.lower() for part in got for s in ("s3cretpw", "etl", "password", "="))


def test_a_namespace_that_could_hold_a_credential_is_never_emitted(monkeypatch):
    """The last safeguard: whatever URL form the naming rules misread, a namespace holding
    ``=`` or a credential's key name is dropped with an extractionError that names why,
    never the value."""
    from producer.spark import capture, naming
    from producer.spark.capture import CaptureSettings
    from producer.spark.relations import Relation

    assert naming.unsafe_namespace("as400://db1;user=etl;password=S3cretPw") is not None
    assert naming.unsafe_namespace("x://db1:1;pwd=x") is not None
    for fine in ("mysql://db1:3306", "file", "file:/wh/secret=1", "hdfs://nn:8020/token", "hive://ms:9083",
                 # Words are no sign: real hosts, buckets and catalogs are named so.
                 "postgres://token-service-db.internal:5432", "mysql://auth-secret.db.corp:3306",
                 "s3://acme-secret-scans", "gs://customer-credentials-audit", "hdfs://secret-nn:8020",
                 "abfss://token@acct.dfs.core.windows.net", "spark-catalog://secret"):
        assert naming.unsafe_namespace(fine) is None, fine
    monkeypatch.setattr(naming, "jdbc_datasets",
                        lambda url, table: ([("weird://db1;password=S3cretPw", "t"), ("weird://db2", "t")], None))
    errors: list[dict] = []
    refs = capture.dataset_refs(Relation(jdbc_url="jdbc:weird://anything", jdbc_table="t"), CaptureSettings(), errors)
    assert [(r.namespace, r.name) for r in refs] == [("weird://db2", "t")]
    assert len(errors) == 1 and "dropped" in errors[0]["errorMessage"]
    assert "S3cretPw" not in str(errors)


@pytest.mark.spark
def test_no_jdbc_password_reaches_an_event(spark):
    """End to end: writes to key-value-form JDBC URLs (they fail: no MySQL/AS400 driver)
    name their output without the password, in the namespace and the dataSource facet."""
    from producer.spark import disable_lineage, enable_lineage
    from tests.producer.spark.support import Recorder, drain
    from tests.support.spec import validator

    recorder = Recorder()
    enable_lineage(spark, producer=recorder, namespace="jl", app_name="jl")
    df = spark.createDataFrame([(1, "x")], "id int, name string")
    try:
        for url, _, _ in _KEY_VALUE_URLS[:3]:
            with pytest.raises(Exception):
                df.write.mode("append").jdbc(url, "t")
        drain(spark)
    finally:
        disable_lineage(spark)
    ends = [e for e in recorder.events if e["eventType"] == "FAIL"]
    assert sorted(d["namespace"] for e in ends for d in e["outputs"]) == ["as400://db1", "mysql://db1:3306",
                                                                          "mysql://db1:3306"]
    import json
    assert "s3cretpw" not in json.dumps(recorder.events).lower()
    for event in recorder.events:
        validator().validate(event)


@pytest.mark.parametrize("url, expected", [
    # URLs without "//" (no server): named as before the key-value host parsing.
    ("jdbc:derby:memory:db;create=true;user=etl;password=S3cretPw", ("derby://", "memory.t")),
    ("jdbc:sqlite:/tmp/x.db", ("sqlite://", "tmp/x.db.t")),
])
def test_a_jdbc_url_without_a_server_keeps_its_name(url, expected):
    assert from_jdbc(url, "t") == expected


@pytest.mark.parametrize("uri, expected", [
    # Hadoop paths have no query and no fragment: "?" and "#" are part of a name.
    ("/data/run#1", ("file", "/data/run#1")),
    ("file:/data/run#1", ("file", "/data/run#1")),
    ("file:///data/q?x=1", ("file", "/data/q?x=1")),
    ("hdfs://nn:8020/data/a?b#c", ("hdfs://nn:8020", "/data/a?b#c")),
    ("s3a://AKIAX:S3cretPw@bucket/k#1", ("s3://bucket", "k#1")),
    ("abfss://c@acc.dfs.core.windows.net/p#x", ("abfss://c@acc.dfs.core.windows.net", "p#x")),
])
def test_a_file_system_path_keeps_its_question_mark_and_hash(uri, expected):
    from producer.spark.naming import from_path, redact_uri

    assert from_path(redact_uri(uri)) == expected


def test_a_uri_that_is_no_file_system_path_still_loses_its_credentials():
    from producer.spark.naming import redact_uri

    assert redact_uri("https://etl:S3cretPw@h/x?password=S3cretPw&a=2#f") == "https://h/x?a=2"


@pytest.mark.parametrize("uri, expected", [
    # Partition directories go, never the last segment: a table at a bucket's or file
    # system's root keeps its name.
    ("s3a://b/x=1", ("s3://b", "x=1")),
    ("s3a://b/t/x=1/y=2", ("s3://b", "t")),
    ("/x=1", ("file", "/x=1")),
    ("hdfs://nn:8020/a=1", ("hdfs://nn:8020", "/a=1")),
    ("/data/t/p=1", ("file", "/data/t")),
])
def test_partition_stripping_never_empties_a_name(uri, expected):
    from producer.spark.naming import from_path

    assert from_path(uri) == expected
