"""A SQLite store of received OpenLineage events and the lineage graph they describe.

Every event added is kept verbatim (table ``events``); the graph is derived from it as
events arrive (:mod:`relay.embedded.event_rows` reads each one): jobs, datasets and their
columns (``schema`` facet and column lineage), run -> job, job -> input/output dataset
edges, and column lineage edges from the ``columnLineage`` facet of outputs
(``fields.<col>.inputFields[]``, one edge per transformation; the facet's dataset-wide
``dataset[]`` entries become edges whose target column is ``None``, meaning "every column
of the output").

Ids are ``namespace/name`` for datasets and jobs. Queries accept an id, a name, a
``symlinks`` alias, or a suffix of any of them that starts at a ``.``, ``/`` or ``:``
boundary (``gold.daily_revenue`` finds ``hive://metastore/lake.gold.daily_revenue``) as long
as exactly one dataset matches; otherwise :class:`LineageQueryError` names the candidates.

Thread-safety: one connection behind a lock, so one writer (the collector's thread) and
any number of reader threads may share a store. :meth:`LineageStore.add` never raises
for a JSON object whose parts are not lineage-shaped; those parts are skipped.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

from relay.embedded.event_rows import WHOLE_DATASET, extract
from relay.errors import RelayError
from relay.stages.json_bytes import dumps

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY, event_time TEXT, event_type TEXT, run_id TEXT, job_id TEXT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL);
-- last_event_time: the eventTime in UTC, always with six fraction digits, so that text order
-- is time order (see _sortable_time).
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, last_event_type TEXT, last_event_time TEXT);
CREATE TABLE IF NOT EXISTS datasets (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dataset_aliases (dataset_id TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
  PRIMARY KEY (dataset_id, namespace, name));
CREATE TABLE IF NOT EXISTS dataset_columns (dataset_id TEXT NOT NULL, name TEXT NOT NULL, type TEXT,
  position INTEGER, PRIMARY KEY (dataset_id, name));
CREATE TABLE IF NOT EXISTS io_edges (job_id TEXT NOT NULL, dataset_id TEXT NOT NULL,
  direction TEXT NOT NULL CHECK (direction IN ('input', 'output')), PRIMARY KEY (job_id, dataset_id, direction));
CREATE TABLE IF NOT EXISTS column_edges (
  source_dataset TEXT NOT NULL, source_field TEXT NOT NULL, target_dataset TEXT NOT NULL,
  target_field TEXT NOT NULL, job_id TEXT NOT NULL, type TEXT NOT NULL, subtype TEXT NOT NULL,
  description TEXT,
  PRIMARY KEY (source_dataset, source_field, target_dataset, target_field, job_id, type, subtype));
CREATE INDEX IF NOT EXISTS column_edges_by_target ON column_edges (target_dataset, target_field);
"""
_BOUNDARIES = "./:"


class LineageQueryError(RelayError, LookupError):
    """A query named no dataset or column in the store, or more than one. The message says which."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str | None = None


@dataclass(frozen=True)
class Dataset:
    id: str
    namespace: str
    name: str
    columns: tuple[Column, ...] = ()
    #: ``(namespace, name)`` of each ``symlinks`` identifier (e.g. the catalog table).
    aliases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Job:
    id: str
    namespace: str
    name: str
    runs: int = 0
    #: eventType of the newest event of the newest run (None for jobs only seen in JobEvents).
    last_state: str | None = None


@dataclass(frozen=True)
class IoEdge:
    job: str
    dataset: str
    direction: Literal["input", "output"]


@dataclass(frozen=True)
class ColumnEdge:
    source_dataset: str
    source_field: str
    target_dataset: str
    #: None: the source field affects the whole target (filter, join, group by, sort...).
    target_field: str | None
    job: str | None
    type: str = ""
    subtype: str = ""
    description: str | None = None


@dataclass(frozen=True)
class Hop:
    """One thing reached by a traversal: ``depth`` is the number of jobs crossed to reach it."""

    depth: int
    dataset: str
    column: str | None
    job: str | None
    via: str


@dataclass(frozen=True)
class Lineage:
    """The answer to :meth:`LineageStore.upstream` / :meth:`LineageStore.downstream`.

    ``hops`` are in breadth-first order (nearest first), each thing reached once, at its
    smallest depth. ``jobs`` are every job crossed, nearest first.
    """

    direction: Literal["upstream", "downstream"]
    dataset: str
    column: str | None
    hops: tuple[Hop, ...] = ()
    jobs: tuple[str, ...] = ()

    @property
    def datasets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.dataset for h in self.hops))

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        return tuple(dict.fromkeys((h.dataset, h.column) for h in self.hops if h.column is not None))


# -- the store --------------------------------------------------------------------------
_TABLES = frozenset(("events", "jobs", "runs", "datasets", "dataset_aliases", "dataset_columns", "io_edges",
                     "column_edges"))


class LineageStore:
    """The store at ``path`` (made when missing). ``read_only``: an existing store, opened
    for queries alone: nothing is ever written to the file, and a SQLite database without
    the store's tables raises :class:`sqlite3.DatabaseError` naming those it lacks."""

    def __init__(self, path: str | Path = ":memory:", *, read_only: bool = False) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        if read_only:
            uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            try:
                try:
                    have = self._tables()
                except sqlite3.OperationalError as err:
                    if "readonly" not in str(err):
                        raise
                    # A hot journal (a writer stopped mid-transaction) needs a connection that
                    # may roll it back, as any SQLite reader does; still no table is created.
                    self._db.close()
                    self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                    have = self._tables()
                if missing := sorted(_TABLES - have):
                    raise sqlite3.DatabaseError(f"it has no table {', '.join(missing)}")
            except BaseException:
                self._db.close()
                raise
            return
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.executescript(_SCHEMA)

    def _tables(self) -> set[str]:
        return {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> LineageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, event: dict[str, Any]) -> None:
        """Keep ``event`` and fold it into the graph (in one transaction)."""
        rows = extract(event)
        run = event.get("run") if isinstance(event.get("run"), dict) else {}
        run_id = run.get("runId") if isinstance(run.get("runId"), str) else None
        event_time = event.get("eventTime") if isinstance(event.get("eventTime"), str) else None
        event_type = event.get("eventType") if isinstance(event.get("eventType"), str) else None
        job_id = rows.jobs[0][0] if rows.jobs else None
        with self._lock, self._db:
            db = self._db
            db.execute("BEGIN")
            db.execute("INSERT INTO events (event_time, event_type, run_id, job_id, body) VALUES (?, ?, ?, ?, ?)",
                       (event_time, event_type, run_id, job_id, dumps(event).decode()))
            db.executemany("INSERT OR IGNORE INTO jobs VALUES (?, ?, ?)", rows.jobs)
            db.executemany("INSERT OR IGNORE INTO datasets VALUES (?, ?, ?)", rows.datasets)
            db.executemany("INSERT OR IGNORE INTO dataset_aliases VALUES (?, ?, ?)", rows.aliases)
            # A schema facet's type and position win over a column only seen in column lineage.
            db.executemany("INSERT INTO dataset_columns VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                           "type = coalesce(excluded.type, type), position = coalesce(excluded.position, position)",
                           rows.columns)
            db.executemany("INSERT OR IGNORE INTO io_edges VALUES (?, ?, ?)", rows.io)
            db.executemany("INSERT OR IGNORE INTO column_edges VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows.column_edges)
            if run_id and job_id:
                # Events may arrive out of order: the newest eventTime decides the run's state.
                db.execute("INSERT INTO runs VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                           "last_event_type = excluded.last_event_type, last_event_time = excluded.last_event_time "
                           "WHERE coalesce(excluded.last_event_time, '') >= coalesce(last_event_time, '')",
                           (run_id, job_id, event_type, _sortable_time(event_time)))

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    # -- reading the graph --------------------------------------------------------------
    def event_count(self) -> int:
        return self._query("SELECT count(*) FROM events")[0][0]

    def events(self) -> Iterator[dict[str, Any]]:
        for (body,) in self._query("SELECT body FROM events ORDER BY seq"):
            yield orjson.loads(body)

    def jobs(self) -> list[Job]:
        rows = self._query(
            "SELECT j.id, j.namespace, j.name, count(r.run_id), "
            "(SELECT last_event_type FROM runs WHERE job_id = j.id ORDER BY last_event_time DESC LIMIT 1) "
            "FROM jobs j LEFT JOIN runs r ON r.job_id = j.id GROUP BY j.id ORDER BY j.id")
        return [Job(*row) for row in rows]

    def datasets(self) -> list[Dataset]:
        columns: dict[str, list[Column]] = {}
        for ds, name, typ in self._query("SELECT dataset_id, name, type FROM dataset_columns "
                                         "ORDER BY dataset_id, position IS NULL, position, rowid"):
            columns.setdefault(ds, []).append(Column(name, typ))
        aliases: dict[str, list[tuple[str, str]]] = {}
        for ds, namespace, name in self._query("SELECT * FROM dataset_aliases ORDER BY namespace, name"):
            aliases.setdefault(ds, []).append((namespace, name))
        return [Dataset(i, ns, n, tuple(columns.get(i, ())), tuple(aliases.get(i, ())))
                for i, ns, n in self._query("SELECT id, namespace, name FROM datasets ORDER BY id")]

    def edges(self) -> list[IoEdge]:
        return [IoEdge(*row) for row in self._query(
            "SELECT job_id, dataset_id, direction FROM io_edges ORDER BY direction, job_id, dataset_id")]

    def column_edges(self) -> list[ColumnEdge]:
        return [_column_edge(row) for row in self._query(
            "SELECT * FROM column_edges ORDER BY target_dataset, target_field, source_dataset, source_field")]

    # -- resolving names ------------------------------------------------------------------
    def resolve(self, text: str) -> str:
        """The id of the one dataset ``text`` names (id, name, alias, or a boundary suffix)."""
        found = self._matches(text)
        if len(found) == 1:
            return found[0]
        if not found:
            raise LineageQueryError(f"no dataset matches {text!r}; known datasets: {self._known()}")
        raise LineageQueryError(f"{text!r} is ambiguous: it matches {', '.join(found)}; give more of the name")

    def resolve_target(self, text: str) -> tuple[str, str | None]:
        """``(dataset id, column)`` for ``dataset`` or ``dataset.column`` (the dataset reading wins)."""
        text = text.strip()
        if self._matches(text):
            return self.resolve(text), None
        head, dot, column = text.rpartition(".")
        if dot and head and self._matches(head):
            dataset = self.resolve(head)
            return dataset, self._column(dataset, column)
        return self.resolve(text), None

    def _column(self, dataset: str, column: str) -> str:
        known = [c for (c,) in self._query("SELECT name FROM dataset_columns WHERE dataset_id = ? ORDER BY "
                                           "position IS NULL, position, rowid", (dataset,))]
        if column not in known:
            raise LineageQueryError(f"{dataset} has no column {column!r}; its columns: {', '.join(known) or '-'}")
        return column

    def _matches(self, text: str) -> list[str]:
        candidates = self._query("SELECT id, id, name FROM datasets UNION ALL "
                                 "SELECT dataset_id, namespace || '/' || name, name FROM dataset_aliases")
        exact = sorted({ds for ds, full, name in candidates if text in (full, name)})
        if exact or not text:
            return exact
        return sorted({ds for ds, full, name in candidates
                       if any(_suffix(s, text) for s in (full, name))})

    def _known(self) -> str:
        names = [name for (name,) in self._query("SELECT name FROM datasets ORDER BY name LIMIT 20")]
        return ", ".join(names) or "none (the store is empty)"

    # -- traversals -------------------------------------------------------------------------
    def upstream(self, dataset: str, column: str | None = None, *, indirect: bool = True) -> Lineage:
        """What feeds ``dataset`` (or ``dataset.column``), transitively, and the jobs on the way.

        At column level, ``indirect`` also follows the facet's dataset-wide entries (the
        columns a filter, join or group by read), which feed every column of the output.
        """
        return self._walk("upstream", dataset, column, indirect)

    def downstream(self, dataset: str, column: str | None = None, *, indirect: bool = True) -> Lineage:
        """What is derived from ``dataset`` (or ``dataset.column``): what breaks if it changes.

        A column that feeds a whole dataset (``indirect``) reaches every column of it, so the
        walk continues from all of that dataset's columns.
        """
        return self._walk("downstream", dataset, column, indirect)

    def _walk(self, direction: Literal["upstream", "downstream"], text: str, column: str | None,
              indirect: bool) -> Lineage:
        if column is None:
            dataset, column = self.resolve_target(text)
        else:
            dataset = self.resolve(text)
            column = self._column(dataset, column)
        up = direction == "upstream"
        step = self._column_step if column is not None else self._dataset_step
        start = (dataset, column)
        seen = {start}
        frontier = [start]
        hops: list[Hop] = []
        jobs: dict[str, None] = {}
        depth = 0
        while frontier:
            depth += 1
            following = []
            for node in frontier:
                for job, reached, via in step(node, up, indirect):
                    if job:
                        jobs.setdefault(job)
                    if reached not in seen:
                        seen.add(reached)
                        following.append(reached)
                        hops.append(Hop(depth, reached[0], reached[1], job or None, via))
            frontier = following
        return Lineage(direction, dataset, column, tuple(hops), tuple(jobs))

    def _dataset_step(self, node: tuple[str, str | None], up: bool, _indirect: bool):
        near, far = ("output", "input") if up else ("input", "output")
        rows = self._query("SELECT a.job_id, b.dataset_id FROM io_edges a LEFT JOIN io_edges b "
                           "ON b.job_id = a.job_id AND b.direction = ? "
                           "WHERE a.dataset_id = ? AND a.direction = ? ORDER BY a.job_id, b.dataset_id",
                           (far, node[0], near))
        for job, ds in rows:
            yield job, (ds, None) if ds else (node[0], None), far

    def _column_step(self, node: tuple[str, str | None], up: bool, indirect: bool):
        ds, col = node
        if up:
            wanted = [col, WHOLE_DATASET] if indirect and col is not None else [col]
            rows = self._query(
                f"SELECT * FROM column_edges WHERE target_dataset = ? AND target_field IN "
                f"({','.join('?' * len(wanted))}) ORDER BY source_dataset, source_field", (ds, *wanted))
        elif col is None:  # the whole dataset is affected: continue from every one of its columns
            rows = self._query("SELECT * FROM column_edges WHERE source_dataset = ? "
                               "ORDER BY target_dataset, target_field", (ds,))
        else:
            rows = self._query("SELECT * FROM column_edges WHERE source_dataset = ? AND source_field = ? "
                               "ORDER BY target_dataset, target_field", (ds, col))
        for row in rows:
            edge = _column_edge(row)
            if not indirect and edge.target_field is None:
                continue
            via = "/".join(p for p in (edge.type, edge.subtype) if p) or "-"
            reached = (edge.source_dataset, edge.source_field) if up else (edge.target_dataset, edge.target_field)
            yield edge.job, reached, via


def _column_edge(row: tuple[Any, ...]) -> ColumnEdge:
    src_ds, src_field, dst_ds, dst_field, job, typ, subtype, desc = row
    return ColumnEdge(src_ds, src_field, dst_ds, dst_field or None, job or None, typ, subtype, desc)


def _suffix(full: str, text: str) -> bool:
    return full.endswith(text) and len(full) > len(text) and (
        full[-len(text) - 1] in _BOUNDARIES or text[0] in _BOUNDARIES)


def _sortable_time(event_time: str | None) -> str | None:
    """``event_time`` (ISO 8601) in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, whose text order is
    time order: as written, ``10:00:00Z`` would sort after ``10:00:00.250Z`` (``.`` < ``Z``)
    and an offset would not count. A time without an offset is taken to be UTC; digits past
    the microsecond are dropped. None when it is not a time: such a run's state follows the
    order events arrive in, and it never replaces one with a time."""
    if event_time is None:
        return None
    try:
        moment = datetime.fromisoformat(event_time)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
    except (ValueError, OverflowError):  # not a time, or out of datetime's range in UTC
        return None
