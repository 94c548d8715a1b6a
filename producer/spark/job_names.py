"""Job names as the official OpenLineage Spark integration (openlineage-spark) gives them, so
that a job keeps its name (and its history in Marquez) whichever of the two reports it.

* Application job: :func:`normalize` of ``spark.openlineage.appName``, else, on AWS Glue,
  the Glue job's name when Spark's app name is the one Glue generated, else
  ``spark.app.name`` (official: ``api/naming/ApplicationJobNameResolver`` and its providers).
* An action's job: ``<application job>.<node>.<suffix>`` (official: ``api/naming/JobNameBuilder``):
  ``<node>`` is :func:`normalize` of the executed plan's root node name (a
  ``WholeStageCodegen`` unwrapped to its child), left out when there is no executed plan;
  ``<suffix>`` names the output as the official visitor of the write command does (its
  ``jobNameSuffix``, see :func:`suffix`), dots replaced by ``_``; left out when the command
  has none or ``spark.openlineage.jobName.appendDatasetName`` is ``false``.
  ``spark.openlineage.jobName.replaceDotWithUnderscore`` also replaces dots in ``<node>``.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producer.spark.jvm import ActionSnapshot

#: The name of an application whose name cannot be found (as the official integration).
UNKNOWN_APP = "unknown"
#: The name of an application whose name normalizes to nothing (the official integration
#: would name it ``""``; a job needs a name).
EMPTY_APP = "spark_application"

# Python's \w is Unicode-aware; Java's (without UNICODE_CHARACTER_CLASS) is [a-zA-Z0-9_].
_LEADING = re.compile(r"^[^a-zA-Z0-9_]+")
_TRAILING = re.compile(r"[^a-zA-Z0-9_]+$")
_CAMEL = re.compile(r"([a-z])([A-Z])")
_ACRONYM = re.compile(r"(?<!^)([A-Z])([a-z])")
_DIGIT = re.compile(r"([0-9])(?=[^0-9])")  # Java's \d, \D: ASCII
_NOT_ALNUM = re.compile(r"[^a-zA-Z0-9]+")


def normalize(name: str) -> str:
    """A name in the official integration's ``snake_case`` (its ``NameNormalizer``):
    ``OrdersETL v2`` -> ``orders_etl_v2``, ``s3load`` -> ``s3_load``, ``café_etl`` ->
    ``cafe_etl``, ``Execute InsertIntoHadoopFsRelationCommand`` ->
    ``execute_insert_into_hadoop_fs_relation_command``. Underscores at the ends stay."""
    trimmed = _TRAILING.sub("", _LEADING.sub("", name))
    plain = "".join(c for c in unicodedata.normalize("NFKD", trimmed) if not unicodedata.category(c).startswith("M"))
    spaced = _DIGIT.sub(r"\1 ", _ACRONYM.sub(r" \1\2", _CAMEL.sub(r"\1 \2", plain)))
    return _NOT_ALNUM.sub("_", spaced.lower())


def application_name(conf: dict[str, str], override: str | None = None) -> str:
    """The application job's name from the Spark conf (``override``: ``enable_lineage``'s
    ``app_name``, which wins like ``spark.openlineage.appName``)."""
    name = override or conf.get("spark.openlineage.appName")
    if not name:
        app = conf.get("spark.app.name")
        if "spark.glue.GLUE_VERSION" in conf:
            glue_job = conf.get("spark.glue.JOB_NAME")
            generated = f"nativespark-{glue_job}-{conf.get('spark.glue.JOB_RUN_ID')}"
            name = glue_job if app is None or app == generated else app
        else:
            name = app if app and app.strip() else UNKNOWN_APP
    return normalize(name or UNKNOWN_APP) or EMPTY_APP


def trim_path(name: str) -> str:
    """A dataset name as a job-name suffix (the official ``trimPath``): a path's last two
    segments joined by ``_`` (``/lake/silver/orders`` -> ``silver_orders``), its only one
    (``a/`` -> ``a``); anything else (``orders``, ``/orders``) as it is."""
    if name.rfind("/") <= 0:
        return name
    parts = name.split("/")
    while parts and parts[-1] == "":
        parts.pop()  # Java's String.split drops trailing empty strings
    return "_".join(parts[-2:]) if len(parts) >= 2 else (parts[-1] if parts else name)


def _ident_suffix(name: str | None) -> str | None:
    """A catalog table's identifier as a suffix (``tableIdentifierToSuffix`` /
    ``identToSuffix``: its parts joined by ``_``; the dots become ``_`` when the name is
    built, so the dotted identifier serves)."""
    return name.replace("`", "") if name else None   # Identifier.toString quotes parts; identToSuffix does not


def suffix(snap: ActionSnapshot, output_name: str | None) -> str | None:
    """The output's job-name suffix as the official visitor of ``snap.command`` gives it
    (``output_name``: the output dataset's name; None: no suffix)."""
    from producer.spark import jvm

    out = snap.output
    command = snap.command
    if command in jvm.FILE_WRITES or command in jvm.TABLE_INSERTS:
        # InsertIntoHadoopFsRelationVisitor, InsertIntoHiveTableVisitor: trimPath of the
        # output dataset's name (a table by its location).
        return trim_path(output_name) if output_name else None
    if command == "CreateDataSourceTableAsSelectCommand":
        return _ident_suffix(out.table if out is not None else None)  # tableIdentifierToSuffix
    if command in jvm.SOURCE_SAVES:
        # SaveIntoDataSourceCommandVisitor: a Delta path as trimPath of the option as given;
        # a "table" option; a JDBC table (the option whose key holds "table": dbtable).
        return snap.output_suffix
    if out is not None and (out.v2_name or out.jdbc_url) and command not in jvm.TABLE_CREATES:
        # CreateReplaceDatasetBuilder (CTAS/RTAS), AppendData/WriteDelta via the V2 relation's
        # builder, the row-level commands via their target: the identifier's parts (a JDBC
        # catalog's table keeps its identifier as its JDBC table).
        return _ident_suffix(out.v2_name or out.jdbc_table)
    # Not found in the official source (Hive CTAS; a row-level command on a table that is
    # not a catalog V2 table): our own rule, the table name, else the path's last two segments.
    if out is not None and out.table:
        return out.table
    return trim_path(output_name) if output_name else None


def child_name(app: str, node: str | None, output_suffix: str | None, *, append_dataset_name: bool = True,
               replace_dot_with_underscore: bool = False) -> str:
    """``<app>.<node>.<suffix>`` with the official integration's options."""
    name = app
    if node:
        part = normalize(node)
        name += "." + (part.replace(".", "_") if replace_dot_with_underscore else part)
    if append_dataset_name and output_suffix:
        name += "." + output_suffix.replace(".", "_")
    return name
