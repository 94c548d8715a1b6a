"""Dataset names per the OpenLineage naming spec (spec/Naming.md), credentials stripped.

* ``file:/data/x`` -> (``file``, ``/data/x``)
* ``s3a://bucket/key`` (s3, s3n too) -> (``s3://bucket``, ``key``)
* ``gs://bucket/key`` -> (``gs://bucket``, ``key``)
* ``hdfs://nn:8020/p`` -> (``hdfs://nn:8020``, ``/p``)
* ``abfss://container@account.dfs.core.windows.net/p`` -> (that authority, ``p``)
* ``wasbs://``, ``dbfs:/`` likewise by authority
* JDBC ``jdbc:postgresql://host:5432/db`` + table ``schema.t`` -> (``postgres://host:5432``, ``db.schema.t``);
  mysql, sqlserver, oracle, ... by their naming-spec scheme.
* catalog tables: physical location first (as the official Spark integration does), with a
  ``symlinks`` facet naming the table (``hive://metastore:9083`` or the warehouse, ``db.table``).

Partition directories (``/year=2026/month=01``) collapse to the table root; user info in a
URI (``s3a://AKIA...:secret@bucket``) and credential query parameters are removed.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

_PARTITION = re.compile(r"^[^/=]+=[^/]*$")
_SECRET_PARAMS = re.compile(r"(?i)(password|passwd|pwd|secret|token|key|credential|sig|signature)")
_JDBC_SCHEMES = {
    "postgresql": "postgres", "postgres": "postgres", "mysql": "mysql", "mariadb": "mysql",
    "sqlserver": "sqlserver", "oracle": "oracle", "db2": "db2", "redshift": "redshift",
    "snowflake": "snowflake", "teradata": "teradata", "trino": "trino", "presto": "presto",
    "clickhouse": "clickhouse", "sqlite": "sqlite",
}


def strip_partitions(path: str) -> str:
    parts = path.rstrip("/").split("/")
    while len(parts) > 1 and _PARTITION.match(parts[-1]):
        parts.pop()
    return "/".join(parts) or "/"


def _netloc(host: str | None, port: int | None) -> str:
    if not host:
        return ""
    return f"{host}:{port}" if port else host


def from_path(uri: str) -> tuple[str, str]:
    """(namespace, name) of a file-system path or URI."""
    if uri.startswith("/"):
        return "file", strip_partitions(uri)
    parts = urlsplit(uri)
    scheme = (parts.scheme or "file").lower()
    path = strip_partitions(parts.path or "/")
    host = parts.hostname
    if scheme == "file":
        return "file", path
    if scheme in ("s3", "s3a", "s3n"):
        return f"s3://{host}", path.lstrip("/")
    if scheme == "gs":
        return f"gs://{host}", path.lstrip("/")
    if scheme in ("abfs", "abfss", "wasb", "wasbs"):
        # container@account.host: the user part names the container, not a credential.
        authority = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        return f"{scheme}://{authority}", path.lstrip("/")
    if scheme == "dbfs":
        return "dbfs", path
    return f"{scheme}://{_netloc(host, parts.port)}", path


def from_jdbc(url: str, table: str) -> tuple[str, str]:
    """(namespace, name) of a JDBC table; ``table`` may be ``schema.table`` or a query."""
    raw = url[5:] if url.lower().startswith("jdbc:") else url
    scheme = raw.split(":", 1)[0].lower()
    parts = urlsplit(raw)
    ns_scheme = _JDBC_SCHEMES.get(scheme, scheme)
    database = parts.path.strip("/").split(";")[0]
    if scheme == "sqlserver":  # jdbc:sqlserver://host:1433;databaseName=db
        host_part = raw.split("//", 1)[-1]
        hostport, _, props = host_part.partition(";")
        kv = dict(p.split("=", 1) for p in props.split(";") if "=" in p)
        database = kv.get("databaseName", kv.get("database", ""))
        return f"sqlserver://{hostport.split('@')[-1]}", ".".join(x for x in (database, table) if x)
    namespace = f"{ns_scheme}://{_netloc(parts.hostname, parts.port)}"
    name = table.strip()
    if name.startswith("(") or name.lower().startswith("select"):
        name = "query"
    return namespace, ".".join(x for x in (database, name) if x)


def redact_uri(uri: str) -> str:
    """``uri`` without user info and without credential-like query parameters."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if "@" in netloc and parts.scheme not in ("abfs", "abfss", "wasb", "wasbs"):
        netloc = netloc.rsplit("@", 1)[1]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if not _SECRET_PARAMS.search(k)])
    rebuilt = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else parts.path
    return f"{rebuilt}?{query}" if query else rebuilt


def table_symlink_namespace(metastore_uris: str | None, warehouse: str | None) -> str:
    """The namespace of a catalog table's name: the metastore (``hive://host:port``) or,
    for Spark's built-in catalog, the warehouse location."""
    if metastore_uris:
        first = metastore_uris.split(",")[0].strip()
        parts = urlsplit(first)
        return f"hive://{_netloc(parts.hostname, parts.port)}"
    if warehouse:
        ns, name = from_path(warehouse)
        return f"file:{name}" if ns == "file" else f"{ns}/{name}".rstrip("/")
    return "spark_catalog"
