"""Dataset names per the OpenLineage naming spec (spec/Naming.md), credentials stripped.

* ``file:/data/x`` -> (``file``, ``/data/x``)
* ``s3a://bucket/key`` (s3, s3n too) -> (``s3://bucket``, ``key``)
* ``gs://bucket/key`` -> (``gs://bucket``, ``key``)
* ``hdfs://nn:8020/p`` -> (``hdfs://nn:8020``, ``/p``); hosts, buckets and nameservices as
  written (``hdfs://MyCluster``: an HA nameservice ID is case-sensitive), the scheme lower-cased
* ``abfss://container@account.dfs.core.windows.net/p`` -> (that authority, ``p``); ``abfs://``
  is named ``abfss://`` and ``wasb://`` ``wasbs://`` (the same stores; the spec's schemes)
* ``wasbs://``, ``dbfs:/`` likewise by authority
* JDBC ``jdbc:postgresql://host:5432/db`` + table ``schema.t`` -> (``postgres://host:5432``, ``db.schema.t``);
  mysql, sqlserver, db2, ... by their naming-spec scheme; Oracle ``jdbc:oracle:thin:u/p@//db:1521/ORCL``
  (or ``@db:1521:SID``) -> (``oracle://db:1521``, ``ORCL.schema.t``), as the spec's
  ``{serviceName|sid}.{schema}.{table}``. A URL without a port gets the database's default
  port where the official integration adds one (:data:`DEFAULT_PORTS`: ``postgres://host:5432``),
  so both name one server alike; others (SQL Server, Redshift, ...) keep the host alone.
  A SQL Server named instance (``host\\INST1``, ``instanceName=INST1``) ->
  ``sqlserver://host[:port]/INST1``; Trino ``jdbc:trino://h:8080/hive/sales`` + ``orders`` ->
  ``hive.sales.orders`` (catalog.schema.table). Hosts as written, as ``URI.getHost()``.
  User, password and other ``key=value`` URL properties are never part of either.
* JDBC ``dbtable`` that is a FROM clause (``APP.ORDERS o JOIN APP.CUSTOMERS c ON ...``: it
  holds whitespace outside quotes): read as the query ``SELECT * FROM <dbtable>`` it is.
* JDBC ``query`` option (Spark passes ``(<query>) SPARK_GEN_SUBQ_<n>``): one dataset per table
  a simple query reads (:func:`jdbc_query_tables`); a query too involved to read safely is
  no dataset at all (:func:`jdbc_datasets` says why), never a made-up ``<db>.query`` that
  would link unrelated jobs.
* catalog tables: physical location first (as the official Spark integration does), with a
  ``symlinks`` facet naming the table ``db.table`` in ``hive://metastore:9083`` or, for Spark's
  built-in catalog, in the directory holding the table (``file:/wh/db.db``; the warehouse
  when the table's location is unknown).

Partition directories (``/year=2026/month=01``) collapse to the table root; user info in a
URI (``s3a://AKIA...:secret@bucket``) and credential query parameters are removed.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

#: ``col=value``: a partition directory. Spark escapes ``?``, ``#`` and ``=`` in partition
#: names and values, so a segment holding ``?`` or ``#`` is a directory's own name.
_PARTITION = re.compile(r"^[^/=?#]+=[^/?#]*$")
_SECRET_PARAMS = re.compile(r"(?i)(password|passwd|pwd|secret|token|key|credential|sig|signature)")
_JDBC_SCHEMES = {
    "postgresql": "postgres", "postgres": "postgres", "mysql": "mysql", "mariadb": "mysql",
    "sqlserver": "sqlserver", "oracle": "oracle", "db2": "db2", "redshift": "redshift",
    "snowflake": "snowflake", "teradata": "teradata", "trino": "trino", "presto": "presto",
    "clickhouse": "clickhouse", "ch": "clickhouse", "sqlite": "sqlite",
}
#: The port a server listens on when its JDBC URL names none, by namespace scheme: those the
#: official integration (openlineage-java's JDBC extractors) fills in. Teradata's URL may
#: carry it as ``DBS_PORT=``, SQL Server's as ``portNumber=``.
DEFAULT_PORTS = {"postgres": 5432, "mysql": 3306, "oracle": 1521, "teradata": 1025, "db2": 6789,
                 "crate": 5432, "trino": 443, "oceanbase": 2881, "clickhouse": 8123}
#: ``mysql:loadbalance://``, ``mysql+srv://``, ``clickhouse:http://``: the driver's
#: sub-protocol; the server is after ``//`` as in any other URL.
_SUB_PROTOCOL = re.compile(r"^([\w-]+)(?:[+:][\w+:-]*)?://")


def strip_partitions(path: str) -> str:
    """``path`` without its trailing partition directories (``/t/year=2026/m=1`` -> ``/t``),
    never down to nothing: the last remaining segment is kept (``s3a://b/x=1`` is ``x=1`` of
    the bucket, not the bucket's root)."""
    parts = path.rstrip("/").split("/")
    while sum(1 for p in parts if p) > 1 and _PARTITION.match(parts[-1]):
        parts.pop()
    return "/".join(parts) or "/"


def _hostname(parts) -> str | None:
    """``parts.hostname`` (of :func:`urllib.parse.urlsplit`) as written: urlsplit lower-cases
    it, but a name is not always case-insensitive (an HDFS HA nameservice ID is not), and the
    official integration keeps it as written (``URI.getHost()``). User info and port dropped,
    an IPv6 address without its brackets, as ``hostname``."""
    host = parts.hostname
    if not host:
        return host
    netloc = parts.netloc.rpartition("@")[2]
    written = netloc[1:netloc.find("]")] if netloc.startswith("[") else netloc.partition(":")[0]
    return written if written.lower() == host else host


def _netloc(host: str | None, port: int | None) -> str:
    if not host:
        return ""
    return f"{host}:{port}" if port else host


#: Hadoop file systems: their paths have no query and no fragment, a ``?`` or ``#`` is part
#: of a file's name (``/runs/run#1``), never cut off.
FILE_SYSTEM_SCHEMES = frozenset({
    "file", "hdfs", "viewfs", "webhdfs", "swebhdfs", "har", "s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs",
    "adl", "dbfs", "oss", "cos", "cosn", "obs", "ofs", "o3fs", "alluxio", "jfs", "lakefs", "maprfs"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


#: Azure's schemes without TLS and the ones with it, that name the same store.
_AZURE_TLS = {"abfs": "abfss", "wasb": "wasbs"}


def _uri_scheme(uri: str) -> str:
    m = _SCHEME.match(uri)
    return m.group(1).lower() if m else ""


def is_file_system_path(uri: str) -> bool:
    """Whether ``uri`` is a Hadoop path (absolute, or of a file-system scheme)."""
    return uri.startswith("/") or _uri_scheme(uri) in FILE_SYSTEM_SCHEMES


def from_path(uri: str) -> tuple[str, str]:
    """(namespace, name) of a file-system path or URI."""
    if uri.startswith("/"):
        return "file", strip_partitions(uri)
    file_system = is_file_system_path(uri)
    parts = urlsplit(uri, allow_fragments=not file_system)
    scheme = (parts.scheme or "file").lower()
    raw_path = parts.path
    if file_system and parts.query:   # "?" of a Hadoop path: part of the name
        raw_path = f"{raw_path}?{parts.query}"
    elif file_system and uri.endswith("?") and not parts.query:
        raw_path = f"{raw_path}?"
    path = strip_partitions(raw_path or "/")
    host = _hostname(parts)   # as written: hdfs://MyCluster (an HA nameservice ID), s3://MyBucket
    if scheme == "file":
        return "file", path
    if scheme in ("s3", "s3a", "s3n"):
        return f"s3://{host}", path.lstrip("/")
    if scheme == "gs":
        return f"gs://{host}", path.lstrip("/")
    if scheme in ("abfs", "abfss", "wasb", "wasbs"):
        # container@account.host: the user part names the container, not a credential.
        # abfs:// and wasb:// are the same stores as abfss:// and wasbs:// (without TLS): one
        # name for both, the spec's (the official integration rewrites abfs to abfss too).
        authority = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        return f"{_AZURE_TLS.get(scheme, scheme)}://{authority}", path.lstrip("/")
    if scheme == "dbfs":
        return "dbfs", path
    return f"{scheme}://{_netloc(host, parts.port)}", path


def from_jdbc(url: str, table: str) -> tuple[str, str]:
    """(namespace, name) of a JDBC table; ``table`` may be ``schema.table`` or a query.

    Neither part ever carries what a URL may hold besides the server and the database:
    ``user[:password]@`` / ``user/password@`` (Oracle), and ``key=value`` properties
    (``;user=u;password=p;`` of DB2 and SQL Server, ``,PASSWORD=p`` of Teradata).
    """
    raw = url[5:] if url.lower().startswith("jdbc:") else url
    scheme = re.match(r"[\w-]*", raw).group(0).lower()   # mysql of mysql:loadbalance, mysql+srv; informix-sqli
    name = table.strip()
    if is_jdbc_query(name):
        tables = jdbc_query_tables(_as_query(name))
        # One table read: that table. Otherwise no name can be right; callers that can
        # emit several datasets or none use jdbc_datasets instead.
        name = tables[0] if tables is not None and len(tables) == 1 else "query"
    if scheme == "oracle":
        netloc, database = _oracle(raw)
        return f"oracle://{_with_port(netloc, DEFAULT_PORTS['oracle'])}", ".".join(x for x in (database, name) if x)
    if scheme == "sqlserver":  # jdbc:sqlserver://host[\\instance][:1433];databaseName=db
        return _sqlserver(raw), ".".join(x for x in (_sqlserver_database(raw), name) if x)
    raw = _SUB_PROTOCOL.sub(r"\1://", raw, count=1)
    # The authority by hand, not urlsplit's netloc: MySQL's (host=h,port=p,password=x) and
    # address=(host=h)(password=x) forms hold "/", "@", "[" and "#" that urlsplit misreads.
    key_value = False
    if "://" in raw:
        rest = raw.partition("://")[2]
        key_value = _KEY_VALUE_START.search(rest) is not None
        authority, path = _split_authority(rest, grouped=key_value)
    else:   # jdbc:derby:memory:db, jdbc:sqlite:/x.db: no server, a path
        try:
            authority, path = "", urlsplit(raw).path
        except ValueError:
            authority, path = "", ""
    namespace_scheme = _JDBC_SCHEMES.get(scheme, scheme)
    default_port = DEFAULT_PORTS.get(namespace_scheme)
    if namespace_scheme == "teradata":   # jdbc:teradata://host/DATABASE=db,DBS_PORT=1025
        default_port = _jdbc_properties(path).get("dbs_port") or default_port
    database = _jdbc_database(path)
    if namespace_scheme == "trino":   # jdbc:trino://host:8080/catalog/schema: catalog.schema.table
        database = ".".join(x for x in database.split("/") if x)
    return f"{namespace_scheme}://{_servers(authority, default_port, grouped=key_value)}", \
        ".".join(x for x in (database, name) if x)


def _sqlserver_parts(raw: str) -> tuple[str, dict[str, str]]:
    """The server part (``host[\\instance][:port]``, user info dropped) and the properties
    (keys lower-cased) of ``sqlserver://server;k=v;...``."""
    hostport, _, props = raw.split("//", 1)[-1].partition(";")
    properties = _jdbc_properties(props)
    return hostport.split("@")[-1] or properties.get("servername", ""), properties


def _sqlserver_database(raw: str) -> str:
    properties = _sqlserver_parts(raw)[1]
    return properties.get("databasename") or properties.get("database", "")


def _sqlserver(raw: str) -> str:
    """The namespace of a SQL Server URL: ``sqlserver://host[:port]``, and ``/instance`` for
    a named instance (``host\\INST1`` or ``instanceName=INST1``), as the official
    integration's SqlServerJdbcExtractor: ``sqlserver://host:1444/INST1``. A port only
    when the URL gives one (in the server part or as ``portNumber=``)."""
    hostport, properties = _sqlserver_parts(raw)
    port = properties.get("portnumber")
    host = hostport
    if ":" in hostport.rpartition("]")[2]:   # host:port ([::1] is an address, not a port)
        host, _, port = hostport.rpartition(":")
    host, _, instance = host.partition("\\")
    instance = instance or properties.get("instancename", "")
    server = f"{host}:{port}" if port else host
    return f"sqlserver://{server}/{instance}" if instance else f"sqlserver://{server}"


#: MySQL's key-value host forms, at the start of the authority or after user info:
#: ``(host=..``, ``[(host=..),..]``, ``address=(..``. Only they group with parentheses.
_KEY_VALUE_START = re.compile(r"(?:^|@)\s*(?:\(|\[\s*\(|address=\()", re.IGNORECASE)


def _split_authority(rest: str, *, grouped: bool) -> tuple[str, str]:
    """``rest`` (what follows ``scheme://``) as (authority, path): the authority ends at the
    first ``/``, ``?`` or ``#`` (``grouped``, MySQL's key-value forms: outside parentheses
    and brackets, which hold those characters; else a ``(`` is just a character, as in a
    password); the path at ``?``/``#``."""
    depth = 0
    end = len(rest)
    for i, ch in enumerate(rest):
        if grouped and ch in "([":
            depth += 1
        elif grouped and ch in ")]":
            depth = max(depth - 1, 0)
        elif depth == 0 and ch in "/?#":
            end = i
            break
    return rest[:end], re.split(r"[?#]", rest[end:], maxsplit=1)[0]


#: MySQL's ``address=(host=h)(port=p)(key=value)...``: one ``(key=value)`` group.
_ADDRESS_PAIR = re.compile(r"\(\s*([^()=\s]+)\s*=\s*([^()]*)\)")


def _top_level_split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(depth - 1, 0)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _key_value_server(entry: str) -> str | None:
    """``host[:port]`` of MySQL's key-value host forms, ``(host=h,port=p,user=u,password=x)``
    and ``address=(host=h)(port=p)(password=x)``; only the host and the port are read.
    None when ``entry`` is in neither form."""
    entry = entry.strip()
    if entry.lower().startswith("address="):
        pairs = _ADDRESS_PAIR.findall(entry[len("address="):])
    elif entry.startswith("(") and entry.endswith(")"):
        pairs = [tuple(p.split("=", 1)) for p in entry[1:-1].split(",") if "=" in p]
    else:
        return None
    found = {k.strip().lower(): v.strip() for k, v in pairs}
    host, port = found.get("host", ""), found.get("port", "")
    if not host or "=" in host:
        return ""
    return f"{host}:{port}" if port.isdigit() else host


def _servers(netloc: str, default_port: int | str | None, *, grouped: bool = False) -> str:
    """``host:port`` of each server a JDBC URL names (failover lists: ``h1:5432,h2``), with
    ``default_port`` where one has none; user info dropped, hosts as written (as the official
    integration's ``URI.getHost()``: ``DB.Example.COM`` stays so), IPv6
    addresses kept in brackets. MySQL's key-value host forms (``grouped``) give their host
    and port alone; anything after a ``;`` (``db1;user=u;password=p`` of AS400, ...) and
    any part holding ``=`` are properties, never a server."""
    def split(text: str, sep: str) -> list[str]:
        return _top_level_split(text, sep) if grouped else text.split(sep)

    # User info first when what precedes the last "@" holds no "=" (user:pa;ss@host: a
    # password may hold ";"); else properties first (db1;password=p@x: one may hold "@").
    at = split(netloc, "@")
    if len(at) > 1 and "=" not in "@".join(at[:-1]):
        netloc = at[-1]
    netloc = split(split(netloc, ";")[0], "@")[-1].strip()
    if netloc.startswith("[") and netloc.endswith("]") and "(" in netloc:   # [(host=a),(host=b)]
        netloc = netloc[1:-1]
    servers = []
    for entry in _top_level_split(netloc, ","):
        server = _key_value_server(entry)
        if server is None:   # the plain form: host[:port]
            server = entry.strip()
        if not server or "=" in server or "(" in server or ")" in server:
            continue
        try:
            parts = urlsplit(f"//{server}")
            host, port = _hostname(parts), parts.port
        except ValueError:   # a port that is not a number: keep the host alone
            try:
                host, port = _hostname(urlsplit(f"//{server.rpartition(':')[0]}")), None
            except ValueError:   # not a host at all ("[x"): no server
                continue
        if host:
            servers.append(_with_port(f"[{host}]" if ":" in host else host, port or default_port))
    return ",".join(servers)


def unsafe_namespace(namespace: str) -> str | None:
    """Why ``namespace`` must not be emitted (the last safeguard against a credential leaking
    through a URL form the naming rules misread: a ``key=value`` property in its server
    part), or None. The reason never quotes it. Its server part is what is checked
    (``scheme://<authority>``): a path after it (``file:/wh/x=1``) names a directory. Words
    alone are no sign: hosts and buckets are named ``token-service-db``, ``acme-secret-scans``."""
    scheme, sep, rest = namespace.partition("://")
    if sep:
        namespace = rest.split("/", 1)[0]
    elif scheme.lower() in ("file", "dbfs") or namespace.lower().startswith(("file:", "dbfs:")):
        return None
    if "=" in namespace:
        return "a key=value property"
    return None


def _with_port(host: str, port: int | str | None) -> str:
    """``host`` with ``port`` unless it has one (``[::1]`` is an address, not a port)."""
    if not host or port is None or ":" in host.rpartition("]")[2]:
        return host
    return f"{host}:{port}"


def is_jdbc_query(table_or_query: str) -> bool:
    """Whether a JDBC relation's ``dbtable``/``query`` text is a query, not a table name: a
    query, or a FROM clause (:func:`_is_from_clause`), which Spark reads as
    ``SELECT * FROM <dbtable>``."""
    text = table_or_query.strip()
    return text.startswith("(") or re.match(r"(?i)(select|with)\b", text) is not None or _is_from_clause(text)


def _is_from_clause(text: str) -> bool:
    """Whether a ``dbtable`` is a FROM clause (``APP.ORDERS o``, ``a JOIN b ON ...``), not a
    table name: it holds whitespace outside quotes (``"My Table"``, ``[My Table]`` and
    `` `My Table` `` are names), as the official integration's JdbcSparkUtils reads it."""
    return any(t.isspace() for t in _SQL_TOKEN.findall(text.strip()))


def _as_query(text: str) -> str:
    """The query a ``dbtable``/``query`` text stands for: a FROM clause is what Spark
    selects from (``SELECT * FROM <dbtable>``), anything else as it is."""
    text = text.strip()
    if text.startswith("(") or re.match(r"(?i)(select|with)\b", text) is not None:
        return text
    return f"SELECT * FROM {text}" if _is_from_clause(text) else text


def jdbc_datasets(url: str, table_or_query: str) -> tuple[list[tuple[str, str]], str | None]:
    """The datasets a JDBC relation reads, and why there are none when a query cannot be
    read safely (for an ``extractionError``): a table is one dataset, a simple query one
    per table it names, any other query none."""
    if not is_jdbc_query(table_or_query):
        return [from_jdbc(url, table_or_query)], None
    tables = jdbc_query_tables(_as_query(table_or_query))
    if tables is None:
        return [], ("JDBC query too complex to name its tables (only SELECT ... FROM/JOIN tables "
                    "without subqueries, CTEs, set operations or comments); no input dataset emitted")
    return [from_jdbc(url, t) for t in tables], None


_SQL_TOKEN = re.compile(r"""\s+|'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\]|[A-Za-z_][\w$#]*|\d[\w.]*|.""", re.S)
_SPARK_QUERY_WRAP = re.compile(r"\((.*)\)\s*(?:AS\s+)?[A-Za-z_]\w*", re.S | re.I)
_SQL_REFUSED = frozenset({"with", "union", "intersect", "except", "minus", "lateral", "values", "table",
                          "unnest", "openquery", "openrowset", "into"})
_SQL_AFTER_TABLE = frozenset({
    "where", "group", "order", "having", "limit", "join", "inner", "left", "right", "full", "outer",
    "cross", "natural", "on", "using", "fetch", "offset", "for", "window", "qualify", "straight_join",
    "semi", "anti", "sample", "tablesample", "partition"})


def jdbc_query_tables(query: str) -> list[str] | None:
    """The tables a simple SQL query reads, in order of appearance, or None when the query
    is not simple enough to be sure: one SELECT whose FROM/JOIN clauses name plain tables
    (``schema.t``, quoted parts unquoted, with or without alias). Subqueries, CTEs, set
    operations, table functions and comments give None: missing a table would be worse
    than naming none, and the caller then says so."""
    text = query.strip()
    wrapped = _SPARK_QUERY_WRAP.fullmatch(text)
    if wrapped is not None:
        text = wrapped.group(1).strip()
    if "--" in text or "/*" in text or re.search(r"(^|\s)#", text):  # comments (MySQL's #)
        return None
    tokens = [t for t in _SQL_TOKEN.findall(text) if not t.isspace()]
    words = [t.lower() for t in tokens]
    if not words or words[0] != "select" or words.count("select") != 1 or _SQL_REFUSED & set(words):
        return None
    tables: list[str] = []
    depth, i = 0, 0
    while i < len(tokens):
        word = words[i]
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0 and word in ("from", "join"):
            while True:
                name, i = _sql_table(tokens, words, i + 1)
                if name is None:
                    return None
                if name not in tables:
                    tables.append(name)
                if word == "from" and i < len(tokens) and tokens[i] == ",":
                    continue
                break
            continue
        i += 1
    return tables if depth == 0 else None


def _sql_table(tokens: list[str], words: list[str], i: int) -> tuple[str | None, int]:
    """A table name (and its optional alias) at ``i``: the name and the index after them."""
    parts: list[str] = []
    while i < len(tokens):
        part = _sql_identifier(tokens[i])
        if part is None or (not parts and words[i] in _SQL_AFTER_TABLE | {"select", "from"}):
            return None, i
        parts.append(part)
        i += 1
        if i < len(tokens) and tokens[i] == ".":
            i += 1
            continue
        break
    if not parts or (i < len(tokens) and tokens[i] in ("(", "@")):  # a table function, a db link
        return None, i
    if i < len(tokens) and words[i] == "as":
        i += 1
        if i >= len(tokens) or _sql_identifier(tokens[i]) is None:
            return None, i
        i += 1
    elif i < len(tokens) and _sql_identifier(tokens[i]) is not None and words[i] not in _SQL_AFTER_TABLE:
        i += 1
    if i < len(tokens) and tokens[i] not in (",", ")", ";") and words[i] not in _SQL_AFTER_TABLE:
        return None, i   # anything else after a table: not a shape we know
    return ".".join(parts), i


def _sql_identifier(token: str) -> str | None:
    if token[:1] in ('"', "`", "[") and len(token) >= 2:
        inner = token[1:-1]
        return inner if inner and "." not in inner else None
    return token if re.fullmatch(r"[A-Za-z_][\w$#]*", token) else None


def _jdbc_properties(text: str) -> dict[str, str]:
    """``k=v`` pairs separated by ``;``, ``,`` or ``:`` (keys lower-cased)."""
    pairs = (p.split("=", 1) for p in re.split(r"[;,:&]", text) if "=" in p)
    return {k.strip().lower(): v.strip() for k, v in pairs}


def _jdbc_database(path: str) -> str:
    """The database of a JDBC URL's path: ``/db``, ``/db:user=u;password=p;`` (DB2),
    ``/db;k=v`` or ``/DATABASE=db,USER=u,PASSWORD=p`` (Teradata); never a property."""
    path = path.strip("/")
    head = re.split(r"[;:,?]", path, maxsplit=1)[0]
    if "=" not in head:
        return head
    props = _jdbc_properties(path)
    return props.get("database") or props.get("databasename") or ""


_ORACLE_DESCRIPTOR = re.compile(r"\((HOST|PORT|SERVICE_NAME|SID)\s*=\s*([^()\s]+)\s*\)", re.IGNORECASE)


def _oracle(raw: str) -> tuple[str, str]:
    """``(host:port, service or SID)`` of ``oracle:thin:[user/pw]@//host:port/service``,
    ``oracle:thin:[user/pw]@host:port:SID`` or ``oracle:thin:@(DESCRIPTION=...)``."""
    target = raw.rpartition("@")[2] if "@" in raw else raw.split(":", 2)[-1]
    target = target.split("?", 1)[0]
    if target.lstrip().startswith("("):
        found = {k.upper(): v for k, v in _ORACLE_DESCRIPTOR.findall(target)}
        host, port = found.get("HOST", ""), found.get("PORT")
        return (f"{host}:{port}" if port else host), found.get("SERVICE_NAME") or found.get("SID", "")
    if target.startswith("//"):
        hostport, _, service = target[2:].partition("/")
        return hostport, service.split(":", 1)[0]
    host, _, rest = target.partition(":")
    if "/" in host:               # host/service: no port
        host, _, rest = host.partition("/")
        return host, rest
    port, _, sid = rest.partition(":")
    if not sid and "/" in port:   # host:port/service without the leading //
        port, _, sid = port.partition("/")
    if not sid and not port.isdigit():   # host:SID: no port
        port, sid = "", port
    return (f"{host}:{port}" if port else host), sid


def redact_uri(uri: str) -> str:
    """``uri`` without user info and without credential-like query parameters. A Hadoop path
    (:func:`is_file_system_path`) has neither query nor fragment: only its user info goes,
    the rest is kept as it is (``/runs/run#1``, ``s3a://b/q?x=1``)."""
    if is_file_system_path(uri):
        if uri.startswith("/") or "://" not in uri:
            return uri
        scheme, _, rest = uri.partition("://")
        end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
        netloc, tail = rest[:end], rest[end:]
        if "@" in netloc and scheme.lower() not in ("abfs", "abfss", "wasb", "wasbs"):
            netloc = netloc.rsplit("@", 1)[1]
        return f"{scheme}://{netloc}{tail}"
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


def table_symlink_namespace(metastore_uris: str | None, warehouse: str | None, location: str | None = None) -> str:
    """The namespace of a catalog table's name: the metastore (``hive://host:port``) or,
    for Spark's built-in catalog, the directory that holds the table's ``location`` (as the
    official integration's PathUtils: ``file:/wh/mydb.db`` for ``mydb.t1``, the parent of an
    external table's LOCATION or of a table in a database created WITH LOCATION), or the
    warehouse location when the table's is unknown."""
    if metastore_uris:
        first = metastore_uris.split(",")[0].strip()
        parts = urlsplit(first)
        return f"hive://{_netloc(_hostname(parts), parts.port)}"
    if location:
        ns, name = from_path(location)
        parent = name.rstrip("/").rpartition("/")[0]
        return _directory_namespace(ns, parent or ("/" if name.startswith("/") else ""))
    if warehouse:
        return _directory_namespace(*from_path(warehouse))
    return "spark_catalog"


def _directory_namespace(ns: str, name: str) -> str:
    """A directory (a :func:`from_path` pair) as one namespace: ``file:/tmp/wh``,
    ``hdfs://nn:8020/user/hive/warehouse``, ``s3://bucket/warehouse`` (no double slash)."""
    if ns == "file":
        return f"file:{name}"
    # hdfs://nn:8020 + /user/hive/warehouse; s3://bucket + warehouse (no leading slash)
    return (ns + name if name.startswith("/") else f"{ns}/{name}").rstrip("/")


# --- a SQL statement's text, for the sql job facet ---------------------------------------
# Every pattern below is anchored or bounded, so masking stays linear in the text's length
# (it runs on the job's driver, in the capture's thread, holding the GIL while a regex runs).
MASK = "***"
#: Quick screen: text with none of these has nothing to mask.
_MAYBE = re.compile(r"(?i)pass|pwd|secret|token|credential|sig|key|sas|auth|://|oracle")
_SECRET_SEGMENTS = ("password", "passwd", "pwd", "secret", "token", "credential", "credentials", "signature",
                    "passphrase")
_SECRET_WORDS = {"sig", "sas", "apikey", "accesskey", "secretkey", "privatekey", "accountkey", "sharedaccesskey",
                 "sastoken", "sessiontoken"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("account", "key"),
                 ("shared", "access"), ("session", "token"), ("client", "secret")}
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """Whether an option, property or parameter name names a credential: a name segment
    (split at ``.``, ``_``, ``-`` and camelCase) ending with password, secret, token...
    (``sslpassword``, ``accessToken``), or ``sig``, ``sas``, ``apikey``..., or two segments
    such as ``account.key`` or ``secret_key``."""
    if len(name) > 256:
        return False
    parts = [p.lower() for p in _NAME_SPLIT.split(name.strip("`'\"")) if p]
    for k, part in enumerate(parts):
        if part in _SECRET_WORDS or part.endswith(_SECRET_SEGMENTS):
            return True
        if k and (parts[k - 1], part) in _SECRET_PAIRS:
            return True
    return False


#: ``://user:password@``: the password (a user alone, ``container@account``, is kept).
_USERINFO = re.compile(r"([^\s/@:?#'\"`\\]{1,256}):([^\s@'\"`\\]{1,256})@")
#: Oracle's ``jdbc:oracle:thin:user/password@``.
_ORACLE = re.compile(r"(?i)(jdbc:oracle:[a-z0-9]{1,16}:)([^\s/@'\"`\\]{1,256})/([^\s@'\"`\\]{1,256})@")
#: ``?name=value`` / ``&`` / ``;`` / ``#`` in a URL, a JDBC property list or a connection string.
_PARAM = re.compile(r"([?&;#])([A-Za-z_][\w.\-]{0,127})=([^&;#\s'\"`\\)]{0,4096})")
#: ``name="value"`` (a JAAS config, ``key="value"`` settings in a literal): double quotes
#: only, so a SQL comparison with a string (``token_type = 'refresh'``) is not taken for one.
_QUOTED_ASSIGN = re.compile(
    r"(?<![\w.\-])([A-Za-z_][\w.\-]{0,127})[ \t]{0,16}=[ \t]{0,16}\"((?:[^\"\\]|\\.){0,4096})\"")
#: ``"name": "value"`` (JSON in a literal).
_JSON_PAIR = re.compile(r"\"([A-Za-z_][\w.\-]{0,127})\"[ \t]{0,16}:[ \t]{0,16}\"((?:[^\"\\]|\\.){0,4096})\"")
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|/\*(?:[^*]|\*(?!/))*(?:\*/|\Z))
  | (?P<str>[rR]?'(?:[^'\\]|\\[\s\S]|''|\\\Z)*(?:'|\Z)|[rR]?"(?:[^"\\]|\\[\s\S]|""|\\\Z)*(?:"|\Z))
  | (?P<quoted>`(?:[^`]|``)*(?:`|\Z))
  | (?P<word>[A-Za-z_][\w$]*(?:\.[\w$]+)*)
  | (?P<num>\d[\w.]*)
  | (?P<other>.)""", re.X | re.S)
#: Where options are written: ``OPTIONS (...)``, ``TBLPROPERTIES (...)``, ... or a ``SET``.
_CONTEXT = re.compile(r"(?i)\b(?:options|tblproperties|serdeproperties|dbproperties|properties)\b|\bset\b")
_PROPERTY_LISTS = {"options", "tblproperties", "serdeproperties", "dbproperties", "properties"}


def mask_sql(text: str) -> str:
    """``text`` (a SQL statement, or an error message quoting one) with credentials masked:
    the password of a URL's ``user:password@`` (Oracle's ``user/password@`` too), the value of
    a URL / JDBC / connection-string parameter or of a JSON member named like a secret
    (:func:`is_secret_name`), and, in ``OPTIONS``/``TBLPROPERTIES``/... lists and ``SET``
    statements, the value of a key named like one (``password 'x'`` -> ``password '***'``).
    Everything else is kept as written. The official integration sends the text as is."""
    if not _MAYBE.search(text):
        return text
    text = _mask_userinfo(text)
    text = _ORACLE.sub(lambda m: f"{m.group(1)}{m.group(2)}/{MASK}@", text)
    text = _PARAM.sub(lambda m: f"{m.group(1)}{m.group(2)}={MASK}" if is_secret_name(m.group(2)) else m.group(0),
                      text)
    text = _QUOTED_ASSIGN.sub(
        lambda m: f'{m.group(0)[:m.start(2) - m.start(0)]}{MASK}"' if is_secret_name(m.group(1)) else m.group(0), text)
    text = _JSON_PAIR.sub(lambda m: f'"{m.group(1)}": "{MASK}"' if is_secret_name(m.group(1)) else m.group(0), text)
    if _CONTEXT.search(text):
        text = _mask_options(text)
    return text


def _mask_userinfo(text: str) -> str:
    out: list[str] = []
    done = 0
    at = text.find("://")
    while at != -1:
        m = _USERINFO.match(text, at + 3)
        if m is not None:
            out.append(text[done:m.start(2)])
            out.append(MASK)
            done = m.end(2)
        at = text.find("://", at + 3)
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _masked(kind: str, value: str) -> str:
    if kind == "str":
        quote = "'" if "'" in value[:2] else '"'
        return f"{quote}{MASK}{quote}"
    return MASK


def _mask_options(text: str) -> str:
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]
    sig = [k for k, (kind, _) in enumerate(tokens) if kind not in ("ws", "comment")]
    out = [value for _, value in tokens]
    n = len(sig)
    i = 0
    statement_start = True
    while i < n:
        kind, value = tokens[sig[i]]
        low = value.lower()
        if kind == "other" and value == ";":
            statement_start = True
            i += 1
            continue
        if statement_start and kind == "word" and low == "set":
            i = _mask_set(tokens, sig, out, i + 1)
            statement_start = False
            continue
        statement_start = False
        if kind == "word" and low in _PROPERTY_LISTS and i + 1 < n and tokens[sig[i + 1]][1] == "(":
            i = _mask_list(tokens, sig, out, i + 2)
            continue
        i += 1
    return "".join(out)


def _mask_set(tokens: list, sig: list[int], out: list[str], i: int) -> int:
    """``SET key = value``: the value masked (to the statement's end) when the key is secret."""
    n = len(sig)
    j = i
    while j < n and tokens[sig[j]][1] not in ("=", ";"):
        j += 1
    if j >= n or tokens[sig[j]][1] != "=":
        return j
    key = "".join(out[sig[i]:sig[j]]) if j > i else ""
    end = j + 1
    while end < n and tokens[sig[end]][1] != ";":
        end += 1
    if is_secret_name(key.strip()) and j + 1 < n and sig[j] + 1 <= (sig[end] if end < n else len(out)):
        stop = sig[end] if end < n else len(out)
        first = sig[j + 1] if j + 1 < end else stop
        for k in range(first, stop):
            out[k] = ""
        if first < stop:
            out[first] = MASK
    return end


def _mask_list(tokens: list, sig: list[int], out: list[str], i: int) -> int:
    """``(key [=] value, ...)``: each value whose key is secret masked, up to the closing ``)``."""
    n = len(sig)
    depth = 1
    key_next = True
    secret = False
    while i < n and depth:
        kind, value = tokens[sig[i]]
        if value == "(":
            depth += 1
        elif value == ")":
            depth -= 1
        elif value == "," and depth == 1:
            key_next, secret = True, False
        elif key_next:
            secret = kind in ("word", "quoted", "str") and is_secret_name(_unquote(kind, value))
            key_next = False
        elif secret and kind in ("str", "num", "word", "quoted"):
            out[sig[i]] = _masked(kind, value)
        i += 1
    return i


def _unquote(kind: str, value: str) -> str:
    if kind == "str":
        return value.lstrip("rR")[1:-1]
    if kind == "quoted":
        return value[1:-1]
    return value
