"""Where a plan leaf or a write target keeps its data, as a :class:`Relation`: a path, a
catalog table, a JDBC table or a DataSourceV2 table (Java objects in, plain data out)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from producer.spark.java_objects import per_gateway, untracked


@dataclass
class Relation:
    """Where data lives: a path, a catalog table (with its location), a JDBC table or a
    DataSourceV2 table name."""

    paths: list[str] = field(default_factory=list)
    table: str | None = None          # db.table
    location: str | None = None       # a catalog table's storage location
    jdbc_url: str | None = None
    jdbc_table: str | None = None
    v2_name: str | None = None        # a DataSourceV2 table's identifier in its catalog
    v2_catalog: str | None = None     # that catalog's name (``spark_catalog``, ``iceberg``, ...)
    fmt: str | None = None


def opt(value: Any) -> Any:
    return value.get() if value is not None and value.isDefined() else None


#: Joins a Scala Seq's strings in one py4j call; no path contains it.
SEP = "\u001f"


@dataclass(frozen=True)
class LeafInfo:
    """A plan leaf as its JSON describes it."""

    kind: str  # the class's simple name
    has_table: bool  # a catalog table is attached (the JSON has "catalogTable" only then)


def catalog_table(table: Any) -> Relation:
    ident = table.identifier()
    db = opt(ident.database())
    name = f"{db}.{ident.table()}" if db else ident.table()
    loc = opt(table.storage().locationUri())
    # The catalog keeps a java.net.URI (file:/a%20b); a file write names the same place as
    # Hadoop spells it (file:/a b): decoded, the table and its files are one dataset.
    return Relation(table=name, location=unquote(str(loc.toString())) if loc is not None else None,
                    fmt=opt(table.provider()))


def _logical_relation(gateway: Any, leaf: Any, has_table: bool | None = None) -> Relation | None:
    relation = leaf.relation()
    kind = relation.getClass().getSimpleName()
    table = opt(leaf.catalogTable()) if has_table is not False else None
    if kind == "HadoopFsRelation":
        rel = catalog_table(table) if table is not None else Relation()
        index = relation.location()
        roots = index.rootPaths()
        joined = roots.mkString(SEP)
        rel.paths = joined.split(SEP) if joined else []
        if len(rel.paths) > 1:
            rel.paths = _directories(index, roots, rel.paths)
        rel.paths = _qualified_roots(gateway, relation, rel.paths)
        rel.fmt = rel.fmt or relation.fileFormat().toString().lower()
        return rel
    if kind == "JDBCRelation":
        options = relation.jdbcOptions()
        return Relation(jdbc_url=options.url(), jdbc_table=options.tableOrQuery())
    if table is not None:
        return catalog_table(table)
    return None


def _qualified_roots(gateway: Any, relation: Any, paths: list[str], *, v2: bool = False) -> list[str]:
    """A read's root paths as Hadoop qualifies them, like those of a write. Spark qualifies a
    path it lists itself, but not the root of a directory a streaming file sink wrote (read
    through its ``_spark_metadata`` log): ``rel/out`` -> ``file:/<JVM working dir>/rel/out``,
    ``/data/t`` -> on the default file system. No py4j call when every path names its file
    system; else those of :func:`qualified` per path, in the relation's session (its
    ``sparkSession``: a ``HadoopFsRelation``'s or a V2 file table's) and with its options."""
    if gateway is None or all(QUALIFIED_PATH.match(path) for path in paths):
        return paths
    try:
        session = relation.sparkSession()
        # A V2 file table's options are a Java map, where a Scala one is needed: none then.
        options = _empty_options(gateway) if v2 else relation.options()
    except Exception:  # noqa: BLE001 - another relation: as given
        return paths
    return [qualified(gateway, session, path, options) for path in paths]


_EMPTY_OPTIONS: dict[int, tuple[Any, Any]] = {}


def _empty_options(gateway: Any) -> Any:
    def build(gateway: Any) -> Any:
        with untracked():  # kept across actions
            return getattr(getattr(gateway.jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()
    return per_gateway(_EMPTY_OPTIONS, gateway, build)


def _directories(index: Any, roots: Any, paths: list[str]) -> list[str]:
    """Several root paths (``spark.read.csv([a, b])``, or a glob, which Spark expands into
    its matches) named as the official integration names them: a root that is a file stands
    for its directory, and each directory is one dataset. A single root is named as given,
    file or directory, as there too.

    Which roots are files comes from the file index's own listing (the files Spark reads),
    asked for all roots in one call instead of a file-system call per path. A root the
    listing does not hold (a missing path, an index that lists nothing) stays as given, as
    the official integration keeps a path whose status it cannot read."""
    try:
        # A Scala Set is a predicate: roots.filter(set) keeps the roots the listing holds.
        joined = str(roots.filter(index.leafFiles().keySet()).mkString(SEP))
    except Exception:  # noqa: BLE001 - no listing (not a PartitioningAwareFileIndex)
        return paths
    files = set(joined.split(SEP)) if joined else set()
    directories: list[str] = []
    for path in paths:
        directory = _parent(path) if path in files else path
        if directory not in directories:
            directories.append(directory)
    return directories


def _parent(path: str) -> str:
    """The directory of a qualified path (``file:/d/x.csv`` -> ``file:/d``, ``s3a://b/x`` ->
    ``s3a://b/``), as Hadoop's ``Path.getParent`` gives it."""
    authority_at = path.find("://")
    root = path.find("/", authority_at + 3) if authority_at >= 0 else path.find("/")
    cut = path.rstrip("/").rfind("/")
    return path[:cut] if cut > root else path[:root + 1]


#: Leaf classes that can be data at rest; any other leaf (a local relation, a range) is not.
RELATION_KINDS = frozenset({"LogicalRelation", "HiveTableRelation", "DataSourceV2Relation",
                             "DataSourceV2ScanRelation"})


def relation_of(gateway: Any, node: Any, leaf: LeafInfo | None = None) -> Relation | None:
    """A plan leaf (or write target) as a :class:`Relation`, or None when it is not data
    at rest (an in-memory DataFrame, a range). ``leaf``: what the plan's JSON tells about
    it, which saves asking."""
    kind = leaf.kind if leaf is not None else node.getClass().getSimpleName()
    if kind == "LogicalRelation":
        return _logical_relation(gateway, node, leaf.has_table if leaf is not None else None)
    if kind == "HiveTableRelation":
        return catalog_table(node.tableMeta())
    if kind in ("DataSourceV2Relation", "DataSourceV2ScanRelation"):
        rel = node if kind == "DataSourceV2Relation" else node.relation()
        catalog = opt(rel.catalog())
        return v2_table(rel.table(), catalog.name() if catalog is not None else None, opt(rel.identifier()),
                        gateway=gateway)
    return None


#: Spark's DataSourceV2 file tables: a file read when ``spark.sql.sources.useV1SourceList``
#: leaves its format out (the default lists them all, and reads are V1 ``HadoopFsRelation``s).
_FILE_TABLES = frozenset({"ParquetTable", "OrcTable", "CSVTable", "JsonTable", "TextTable", "AvroTable"})


def v2_table(table: Any, catalog: str | None, ident: Any, *, gateway: Any = None) -> Relation | None:
    """A DataSourceV2 ``Table`` (None for Spark's ``noop`` sink). Named as the official
    integration does: a JDBC catalog's table by its JDBC URL, a table with a ``location``
    property (Iceberg, Delta, the session catalog) by that location, any other by its
    catalog and identifier (``ident``; ``Table.name()`` when there is none). A file table
    (a path read through a V2 file source) by its paths, as the same read through V1 is."""
    kind = table.getClass().getSimpleName()
    if kind == "NoopTable":
        return None
    if kind in _FILE_TABLES:
        index = table.fileIndex()
        roots = index.rootPaths()
        joined = roots.mkString(SEP)
        paths = joined.split(SEP) if joined else []
        if len(paths) > 1:
            paths = _directories(index, roots, paths)
        return Relation(paths=_qualified_roots(gateway, table, paths, v2=True), fmt=str(table.formatName()).lower())
    name = str(ident.toString()) if ident is not None else str(table.name())
    if kind == "JDBCTable":
        return Relation(jdbc_url=table.jdbcOptions().url(), jdbc_table=name)
    location = table.properties().get("location")
    return Relation(v2_name=name, v2_catalog=catalog, location=str(location) if location is not None else None)


def v2_created(created: Any) -> Relation:
    """The table a V2 CTAS/RTAS wrote (``ResolvedIdentifier``: catalog and identifier),
    loaded from its catalog for its location or JDBC URL; if it cannot be loaded (a
    failed CTAS), named by catalog and identifier."""
    catalog, ident = created.catalog(), created.identifier()
    catalog_name = str(catalog.name())
    try:
        rel = v2_table(catalog.loadTable(ident), catalog_name, ident)
    except Exception:  # noqa: BLE001 - not created, or not a TableCatalog
        rel = None
    return rel if rel is not None else Relation(v2_name=str(ident.toString()), v2_catalog=catalog_name)


#: ``scheme://`` (s3a://bucket, hdfs://nn:8020) or ``file:``: already names its file system.
QUALIFIED_PATH = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://|file:", re.IGNORECASE)
_HADOOP_PATH: dict[int, tuple[Any, Any]] = {}


def qualified(gateway: Any, session: Any, path: str, options: Any) -> str:
    """A write's ``path`` option (``save("out/t")`` through a source that is not a file
    format, e.g. Delta) as Hadoop resolves it, like the path of any other file write:
    ``out/t`` -> ``file:/<working dir>/out/t``; ``/data/t`` -> on the default file system
    (``fs.defaultFS``: HDFS on a cluster). Spark qualifies a file format's output path
    itself; the source receives the option as the user typed it. A path that names its file
    system is returned as is (no file-system client is made for it), and so is one that
    cannot be resolved."""
    if QUALIFIED_PATH.match(path):
        return path
    try:
        hadoop_path = per_gateway(_HADOOP_PATH, gateway, _path_class)(path)
        conf = session.sessionState().newHadoopConfWithOptions(options)  # the write's own settings
        return str(hadoop_path.getFileSystem(conf).makeQualified(hadoop_path).toString())
    except Exception:  # noqa: BLE001 - unresolvable: as given
        return path


def _path_class(gateway: Any) -> Any:
    with untracked():  # a class, kept across actions
        return gateway.jvm.org.apache.hadoop.fs.Path
