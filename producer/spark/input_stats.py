"""The ``inputStatistics`` facet of a batch action's inputs: what its scans actually read.

Pure: the executed plan's leaves (:class:`~producer.spark.scans.Scan`, read after the action
finished) are matched to the analysed plan's leaves by an output attribute's id, which
Spark keeps from analysis to the physical scan. The numbers are the scans' SQL metrics, so
they are this action's reading, after partition pruning (static and dynamic) and file
skipping, not the dataset's size:

* ``fileCount``, ``size``: the files a file scan selected to read, after partition pruning
  and file skipping, and their total bytes on storage (``numFiles``, ``filesSize``, which
  Spark labels "number of files read", "size of files read"); set when Spark lists them, so
  an action that stops early (a ``limit``) may have opened fewer;
* ``rowCount``: the rows the scan produced (``numOutputRows``), before the query's own
  filters but after what the source skipped itself (Parquet/ORC row groups by pushed filters).

Only V1 file scans (``FileSourceScanExec``: parquet, orc, csv, json, text, Delta, catalog
tables over files) have all three; DataSourceV2, JDBC and Hive SerDe scans have ``rowCount``
only. A dataset read by several scans (a self-join, a table read twice) gets their sum, each
scan's reading counted (a scan Spark reuses is read once, counted once: a
``ReusedExchangeExec`` adds nothing, and only when every leaf under the exchange it reuses is
a counted scan seen in this plan; without adaptive execution, dynamic partition pruning can
leave the original exchange in its subquery, which is not seen).

Only for an action whose executed plan Spark built for this one run (:func:`counts_its_run`):
a write, or a read Spark plans anew each call (``head``: ``show()``; ``count``, ``isEmpty``,
``tail``). ``collect``, ``collectToPython`` (PySpark's ``collect``, ``take``, ``head``,
``first``), ``toLocalIterator``, ``toPandas``, ``foreach``, ``foreachPartition``, ``reduce``,
``rdd``... run the DataFrame's own plan, again at each call: its scans' metrics are the last
run's or zeros (Spark posts a file scan's file counts when it first plans it), or the next
run's, which resets them while the listener reads; and ``rdd`` is reported before its scan
runs.

Left out rather than guessed: a dataset any of whose plan leaves has no scan seen here (read
inside a subquery, from a cache, by a scan of another kind, behind a reused exchange whose
original was not seen), a leaf standing for several datasets, and every input of an action
with a counted scan that matches no leaf (a scan that outputs no column, e.g. for
``count()``, cannot be told apart).
"""

from __future__ import annotations

from collections.abc import Sequence

from producer.spark.scans import Scan

#: Scans whose metrics are one leaf's reading: facet field -> metric.
COUNTED: dict[str, dict[str, str]] = {
    "FileSourceScanExec": {"rowCount": "numOutputRows", "size": "filesSize", "fileCount": "numFiles"},
    "BatchScanExec": {"rowCount": "numOutputRows"},
    "RowDataSourceScanExec": {"rowCount": "numOutputRows"},
    "HiveTableScanExec": {"rowCount": "numOutputRows"},
}
#: A leaf that stands for an exchange made elsewhere, whose scans are counted there.
REUSED = "ReusedExchangeExec"
#: Read-only actions Spark plans anew at each call (``Dataset.head``, ``count``...); any
#: other read-only action may rerun a plan (see above).
OWN_PLAN_READS = frozenset({"head", "count", "isEmpty", "tail"})


def counts_its_run(func: str, writes: bool) -> bool:
    """Whether the scan metrics of action ``func`` (``writes``: its command writes) are this
    run's and read after it finished: a write command is planned for its one run."""
    return writes or func in OWN_PLAN_READS


def input_statistics(scans: Sequence[Scan], leaf_ids: Sequence[frozenset[int]],
                     leaf_datasets: Sequence[tuple[int, ...]]) -> dict[int, dict[str, int]]:
    """``inputStatistics`` bodies by input dataset index. ``leaf_ids``: each analysed-plan
    leaf's output attribute ids; ``leaf_datasets``: the input datasets each leaf stands for
    (in the same order). Datasets whose reading is not known exactly are absent."""
    mapped: dict[int, list[Scan]] = {}
    for scan in scans:
        leaves = [i for i, ids in enumerate(leaf_ids) if scan.expr_ids and scan.expr_ids <= ids]
        if len(leaves) == 1:
            mapped.setdefault(leaves[0], []).append(scan)
        elif scan.kind in COUNTED:
            return {}  # a reading that belongs to no leaf, or to any of several
    by_dataset: dict[int, list[int]] = {}
    for leaf, datasets in enumerate(leaf_datasets):
        for dataset in datasets:
            by_dataset.setdefault(dataset, []).append(leaf)
    counted_ids = {scan.identity for scan in scans if scan.kind in COUNTED and scan.identity is not None}
    out: dict[int, dict[str, int]] = {}
    for dataset, leaves in by_dataset.items():
        if any(len(leaf_datasets[leaf]) != 1 or not _fully_seen(mapped.get(leaf, []), counted_ids) for leaf in leaves):
            continue
        counted = [scan for leaf in leaves for scan in mapped[leaf] if scan.kind in COUNTED]
        stats = _summed(counted)
        if stats:
            out[dataset] = stats
    return out


def _fully_seen(scans: list[Scan], counted_ids: set[int]) -> bool:
    """Every physical leaf of a plan leaf is one whose reading is known: a counted scan, or a
    reused exchange all of whose original's leaves are counted scans of this plan."""
    return bool(scans) and all(scan.kind in COUNTED or (scan.kind == REUSED and scan.reuses
                                                        and scan.reuses <= counted_ids) for scan in scans)


def _summed(scans: list[Scan]) -> dict[str, int]:
    """Each facet field summed over ``scans``; a field some scan lacks is left out."""
    if not scans:
        return {}
    fields = set.intersection(*({f for f, metric in COUNTED[s.kind].items() if metric in s.metrics} for s in scans))
    return {f: sum(s.metrics[COUNTED[s.kind][f]] for s in scans)
            for f in ("rowCount", "size", "fileCount") if f in fields}
