"""A picture of what a :class:`LineageStore` holds: one self-contained HTML page.

``render_graph_html(store)`` returns a page with no external fetch (inline CSS and JS, the
graph embedded as JSON) that draws datasets and jobs left to right in longest-path
layers, each dataset with its columns, and the column lineage between them. Clicking a
dataset or a column highlights what feeds it and what it feeds; a query box answers
"what feeds X?" / "what breaks if X changes?" from the embedded data, with the same
rules as :meth:`LineageStore.upstream` / :meth:`LineageStore.downstream`. A URL fragment
``#upstream=X``, ``#downstream=X`` or ``#ask=what feeds X?`` asks on load.

Stable DOM for tests and scripts: ``<g class="node dataset" data-id="namespace/name">``,
``<g class="node job" data-id="namespace/name">``, ``<g class="column" data-dataset=..
data-column=..>``, ``<path class="edge" data-source="dataset:ID" data-target="job:ID">``,
``<path class="column-edge" ...>``, and ``#answer`` with one ``li.hop`` per thing reached.

``lineage-relay graph`` writes the page or prints query answers (:func:`add_parser`).
"""

from __future__ import annotations

import argparse
import html
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Hashable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import orjson

from relay.embedded.store import Lineage, LineageQueryError, LineageStore

DEFAULT_STORE = Path("demo-output/lineage.sqlite")
DEFAULT_OUT = Path("demo-output/lineage.html")
_DATA_TOKEN = "{{LINEAGE_DATA}}"
_TITLE_TOKEN = "{{TITLE}}"

N = TypeVar("N", bound=Hashable)


def layers(nodes: Iterable[N], edges: Iterable[tuple[N, N]]) -> dict[N, int]:
    """Longest-path layering: every node sits one layer right of its furthest predecessor.

    Nodes without predecessors move right to just before their nearest successor, so a
    source read only late in the pipeline is drawn next to its reader. Cycles are broken
    by ignoring the edges that close them. Deterministic for the same input.
    """
    order = list(dict.fromkeys(nodes))
    succ: dict[N, list[N]] = defaultdict(list)
    indeg = dict.fromkeys(order, 0)
    for a, b in dict.fromkeys(edges):
        if a in indeg and b in indeg and a != b:
            succ[a].append(b)
            indeg[b] += 1
    layer = dict.fromkeys(order, 0)
    remaining = set(order)
    ready = [n for n in order if indeg[n] == 0]
    while remaining:
        if not ready:  # a cycle: enter it at the node with the fewest unplaced predecessors
            ready = [min((n for n in order if n in remaining), key=lambda n: indeg[n])]
        node = ready.pop(0)
        if node not in remaining:
            continue
        remaining.discard(node)
        for nxt in succ[node]:
            if nxt in remaining:
                layer[nxt] = max(layer[nxt], layer[node] + 1)
                indeg[nxt] -= 1
                if indeg[nxt] == 0:
                    ready.append(nxt)
    has_pred = {b for a in succ for b in succ[a]}
    for node in order:
        if node not in has_pred and succ[node]:
            layer[node] = max(layer[node], min(layer[s] for s in succ[node]) - 1)
    return layer


def graph_data(store: LineageStore) -> dict[str, Any]:
    """The page's data: datasets and jobs with their layer, io edges and column edges."""
    datasets, jobs, io = store.datasets(), store.jobs(), store.edges()
    edges = [(f"dataset:{e.dataset}", f"job:{e.job}") if e.direction == "input"
             else (f"job:{e.job}", f"dataset:{e.dataset}") for e in io]
    keys = [f"dataset:{d.id}" for d in datasets] + [f"job:{j.id}" for j in jobs]
    layer = layers(keys, edges)
    return {
        "events": store.event_count(),
        "datasets": [{
            "id": d.id, "namespace": d.namespace, "name": d.name,
            "label": d.aliases[0][1] if len(d.aliases) == 1 else d.name,
            "aliases": [f"{ns}/{name}" for ns, name in d.aliases], "aliasNames": [name for _, name in d.aliases],
            "layer": layer[f"dataset:{d.id}"],
            "columns": [{"name": c.name, "type": c.type} for c in d.columns],
        } for d in datasets],
        "jobs": [{"id": j.id, "namespace": j.namespace, "name": j.name, "runs": j.runs, "state": j.last_state,
                  "layer": layer[f"job:{j.id}"]} for j in jobs],
        "edges": [{"source": a, "target": b} for a, b in edges],
        "columnEdges": [{"sd": e.source_dataset, "sf": e.source_field, "td": e.target_dataset,
                         "tf": e.target_field, "job": e.job, "type": e.type, "subtype": e.subtype}
                        for e in store.column_edges()],
    }


def render_graph_html(store: LineageStore, *, title: str = "lineage") -> str:
    """One self-contained HTML page drawing ``store``'s lineage graph (see the module doc)."""
    template = resources.files("relay.embedded").joinpath("graph_template.html").read_text(encoding="utf-8")
    data = orjson.dumps(graph_data(store)).decode()
    # Inside <script>, "</script>" or "<!--" in a dataset name must not end the element.
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return template.replace(_TITLE_TOKEN, html.escape(title)).replace(_DATA_TOKEN, data)


def short_name(store: LineageStore, dataset_id: str) -> str:
    """A short text :meth:`LineageStore.resolve` maps back to ``dataset_id``: a catalog alias
    (``gold.daily_revenue``) when it is unambiguous, else the shortest unambiguous suffix."""
    dataset = next(d for d in store.datasets() if d.id == dataset_id)
    aliases = sorted(name for _, name in dataset.aliases)
    names = [dataset.name, *aliases]
    candidates = {name[i + 1:] for name in names for i, ch in enumerate(name) if ch in "./"} | set(names)
    for text in [*aliases, *sorted(candidates, key=lambda t: (len(t), t))]:
        if text and not text.startswith((".", "/")):
            try:
                if store.resolve(text) == dataset_id:
                    return text
            except LineageQueryError:
                continue
    return dataset_id


def example_query(store: LineageStore) -> str | None:
    """A column worth asking about: one computed by the most jobs upstream, or None."""
    targets = sorted({(e.target_dataset, e.target_field) for e in store.column_edges() if e.target_field})
    if not targets:
        sinks = sorted({e.dataset for e in store.edges() if e.direction == "output"})
        return short_name(store, sinks[0]) if sinks else None
    best = max(targets, key=lambda t: (len(store.upstream(t[0], t[1], indirect=False).jobs), t))
    return f"{short_name(store, best[0])}.{best[1]}"


def format_lineage(answer: Lineage, asked: str) -> str:
    """The plain-text answer ``lineage-relay graph --upstream/--downstream`` prints."""
    target = answer.dataset + (f" column {answer.column}" if answer.column else "")
    question = f"what feeds {asked}" if answer.direction == "upstream" else f"what breaks if {asked} changes"
    lines = [f"{question}?  ({answer.direction} of {target})"]
    if not answer.hops:
        lines.append("  nothing: no lineage recorded in that direction")
    rows = [(str(h.depth), h.dataset + (f".{h.column}" if h.column else " (whole dataset)" if
             answer.column else ""), h.via, h.job or "-") for h in answer.hops]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    for depth, what, via, job in rows:
        lines.append(f"  {depth:>{widths[0]}}  {what:<{widths[1]}}  {via:<{widths[2]}}  via job {job}")
    lines.append(f"  datasets ({len(answer.datasets)}): {', '.join(answer.datasets) or '-'}")
    lines.append(f"  jobs ({len(answer.jobs)}): {', '.join(answer.jobs) or '-'}")
    return "\n".join(lines)


# -- CLI: lineage-relay graph -------------------------------------------------------------
def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("graph", help="draw the demo's lineage as one HTML page, or ask what feeds / breaks",
                              description="Draw the lineage store as one self-contained HTML page, or answer "
                                          "upstream/downstream questions about a dataset or dataset.column.")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"lineage store (default {DEFAULT_STORE})")
    p.add_argument("--out", type=Path,
                   help=f"HTML page to write (default {DEFAULT_OUT} unless a query flag is given)")
    p.add_argument("--upstream", action="append", metavar="X",
                   help="print what feeds X (dataset or dataset.column, short names allowed; repeatable)")
    p.add_argument("--downstream", action="append", metavar="X",
                   help="print what breaks if X changes (repeatable)")
    p.add_argument("--direct-only", action="store_true",
                   help="column level: ignore dataset-wide lineage (filters, joins, group by)")
    return p


def run(args: argparse.Namespace) -> int:
    if not args.store.is_file():
        print(f"lineage-relay graph: no lineage store at {args.store}: run `lineage-relay demo` first, "
              f"or pass --store PATH", file=sys.stderr)
        return 2
    queries = [("upstream", q) for q in args.upstream or []] + [("downstream", q) for q in args.downstream or []]
    try:
        return _answer(args, queries)
    except sqlite3.DatabaseError as err:
        print(f"lineage-relay graph: --store {args.store} is not a lineage store ({err}); fix: pass the "
              "lineage.sqlite a demo or the recording collector wrote", file=sys.stderr)
        return 2
    except BrokenPipeError:   # `graph ... | head`: the reader has what it wanted
        sys.stderr.close()
        return 0


def _answer(args: argparse.Namespace, queries: list[tuple[str, str]]) -> int:
    with LineageStore(args.store, read_only=True) as store:
        status = 0
        for direction, text in queries:
            walk = store.upstream if direction == "upstream" else store.downstream
            try:
                print(format_lineage(walk(text, indirect=not args.direct_only), text))
            except LineageQueryError as err:
                print(f"lineage-relay graph: {err}", file=sys.stderr)
                status = 2
        out = args.out if args.out is not None or queries else DEFAULT_OUT
        if out is not None:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(render_graph_html(store, title=f"lineage: {args.store.name}"), encoding="utf-8")
            except OSError as err:
                print(f"lineage-relay graph: cannot write --out {out}: {err.strerror or err}; fix: name a file "
                      "in a directory you can write", file=sys.stderr)
                return 2
            print(f"lineage graph: {out} ({len(store.jobs())} jobs, {len(store.datasets())} datasets)")
    return status
