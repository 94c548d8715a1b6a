"""The lineage page is what a demo user opens: rendered by a real browser (headless Chromium)
it must draw every dataset, job and edge of a bronze -> silver -> gold pipeline, answer
upstream/downstream questions exactly as the store does, need no network, and not be blank.

Without Chromium these tests skip, unless LINEAGE_RELAY_REQUIRE_ALL=1: then they fail.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest

from relay.cli import main as cli_main
from relay.embedded.graph import layers, render_graph_html
from relay.embedded.store import LineageStore
from tests.support.children import exit_status, run_in_child
from tests.support.pipeline_events import (
    BRONZE_ORDERS,
    GOLD_CUSTOMER_LTV,
    GOLD_DAILY_REVENUE,
    JOBS,
    SILVER_ORDERS,
    ds_id,
    job_id,
    pipeline_events,
)
from tests.support.tools import required_tool

SILVER_ID, DAILY_ID, LTV_ID = ds_id(SILVER_ORDERS), ds_id(GOLD_DAILY_REVENUE), ds_id(GOLD_CUSTOMER_LTV)


@pytest.fixture(scope="module")
def chromium() -> str:
    return required_tool(("chromium", "chromium-browser", "google-chrome"), "headless Chromium",
                         "apt-get install -y chromium")


@pytest.fixture(scope="module")
def store() -> LineageStore:
    with LineageStore() as s:
        for event in pipeline_events():
            s.add(event)
        yield s


@pytest.fixture(scope="module")
def page(store, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("graph") / "lineage.html"
    path.write_text(render_graph_html(store), encoding="utf-8")
    return path


def _browser(chromium: str, tmp: Path, *args: str) -> str:
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp}",
         *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class _Dom(HTMLParser):
    """Collects the stable attributes the page promises: nodes, edges, columns, answers."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def with_class(self, cls: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if cls in a.get("class", "").split()]


def _dom(chromium: str, tmp_path: Path, page: Path, fragment: str = "") -> _Dom:
    return _Dom(_browser(chromium, tmp_path / "profile", "--dump-dom", page.as_uri() + fragment))


def test_layers_are_longest_paths_and_sources_sit_next_to_their_reader():
    edges = [("a", "j1"), ("j1", "b"), ("b", "j2"), ("j2", "c"), ("late", "j2"), ("a", "j2")]
    assert layers(["a", "b", "c", "j1", "j2", "late"], edges) == {"a": 0, "j1": 1, "b": 2, "j2": 3, "c": 4,
                                                                  "late": 2}
    assert set(layers(["x", "y"], [("x", "y"), ("y", "x")]).values()) == {0, 1}  # a cycle is broken, not looped


def test_the_page_is_self_contained(page):
    text = page.read_text(encoding="utf-8")
    for external in ("<script src", "<link", "@import", "url(http", "fetch(", "XMLHttpRequest"):
        assert external not in text
    assert text.count("<script") == 2  # the data and the code, both inline


def test_chromium_draws_every_dataset_job_and_edge(chromium, page, store, tmp_path):
    dom = _dom(chromium, tmp_path, page)
    datasets = {a["data-id"] for a in dom.with_class("node") if "dataset" in a["class"].split()}
    jobs = {a["data-id"] for a in dom.with_class("node") if "job" in a["class"].split()}
    assert datasets == {d.id for d in store.datasets()} and len(datasets) == 7
    assert jobs == {job_id(j["name"]) for j in JOBS}
    edges = {(a["data-source"], a["data-target"]) for a in dom.with_class("edge")}
    expected = {(f"dataset:{ds_id(ds)}", f"job:{job_id(j['name'])}") for j in JOBS for ds in j["inputs"]}
    expected |= {(f"job:{job_id(j['name'])}", f"dataset:{ds_id(j['output'])}") for j in JOBS}
    assert edges == expected
    columns = {(a["data-dataset"], a["data-column"]) for a in dom.with_class("column")}
    assert (DAILY_ID, "total_revenue") in columns and (SILVER_ID, "amount_eur") in columns
    assert len(dom.with_class("column-edge")) == len(store.column_edges())


@pytest.mark.parametrize("fragment, direction, asked", [
    ("#upstream=gold.daily_revenue.total_revenue", "upstream", "gold.daily_revenue.total_revenue"),
    ("#ask=" + quote("what breaks if silver.orders changes?"), "downstream", "silver.orders"),
    ("#ask=" + quote("what feeds gold.customer_ltv?"), "upstream", "gold.customer_ltv"),
    ("#downstream=bronze.orders.status", "downstream", "bronze.orders.status"),
])
def test_the_query_box_answers_like_the_store(chromium, page, store, tmp_path, fragment, direction, asked):
    dom = _dom(chromium, tmp_path, page, fragment)
    (result,) = dom.with_class("result")
    expected = getattr(store, direction)(asked)
    assert (result["data-direction"], result["data-dataset"], result["data-column"]) == (
        direction, expected.dataset, expected.column or "")
    hops = {(a["data-dataset"], a["data-column"] or None, int(a["data-depth"]), a["data-job"] or None)
            for a in dom.with_class("hop")}
    assert hops == {(h.dataset, h.column, h.depth, h.job) for h in expected.hops}
    assert {a["data-job"] for a in dom.with_class("job-hop")} == set(expected.jobs)
    assert any(a.get("data-id") == expected.dataset for a in dom.with_class("focus"))


def test_an_unknown_name_gets_an_error_answer_not_a_broken_page(chromium, page, tmp_path):
    dom = _dom(chromium, tmp_path, page, "#upstream=orders")
    (answer,) = [a for tag, a in dom.elements if a.get("id") == "answer"]
    assert answer["data-status"] == "error"
    assert len(dom.with_class("node")) == 12


def test_dataset_names_cannot_break_out_of_the_embedded_data(chromium, tmp_path):
    nasty = "</script><script>document.body.innerHTML='pwned'</script><!--"
    with LineageStore() as s:
        s.add({"job": {"namespace": "ns", "name": "j"}, "inputs": [{"namespace": "ns", "name": nasty}],
               "outputs": [{"namespace": "ns", "name": "out & <b>"}]})
        path = tmp_path / "nasty.html"
        path.write_text(render_graph_html(s), encoding="utf-8")
    dom = _dom(chromium, tmp_path, path)
    assert {a["data-id"] for a in dom.with_class("dataset")} == {f"ns/{nasty}", "ns/out & <b>"}


def _png_pixels(path: Path) -> tuple[int, int, list[bytes], int]:
    """Width, height, unfiltered rows and bytes per pixel of an 8-bit RGB/RGBA PNG (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        header, idat = (chunk, idat) if kind == b"IHDR" else (header, idat + chunk if kind == b"IDAT" else idat)
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def test_the_screenshot_shows_a_graph(chromium, page, tmp_path):
    shot = tmp_path / "lineage.png"
    _browser(chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,900", page.as_uri())
    width, height, rows, bpp = _png_pixels(shot)
    assert (width, height) == (1400, 900)
    # The drawing area only: below the header bar, left of the side panel.
    pixels = [row[x * bpp:x * bpp + 3] for row in rows[60:] for x in range(0, 980)]
    colours = set(pixels)
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert len(colours) > 100, len(colours)
    assert non_white / len(pixels) > 0.03, non_white / len(pixels)
    dataset_head, job_fill = bytes((0xBF, 0xDB, 0xFE)), bytes((0xFD, 0xE6, 0x8A))
    assert pixels.count(dataset_head) > 7 * 500, "the dataset headers are not drawn"
    assert pixels.count(job_fill) > 5 * 500, "the job nodes are not drawn"


def test_cli_writes_the_page_and_prints_answers(store, tmp_path, capsys):
    db = tmp_path / "lineage.sqlite"
    with LineageStore(db) as s:
        for event in store.events():
            s.add(event)
    out = tmp_path / "page.html"
    assert cli_main(["graph", "--store", str(db), "--out", str(out), "--upstream", "gold.daily_revenue.total_revenue",
                     "--downstream", "silver.orders", "--direct-only"]) == 0
    text = capsys.readouterr().out
    assert "what feeds gold.daily_revenue.total_revenue?" in text
    assert f"{ds_id(BRONZE_ORDERS)}.amount" in text and "DIRECT/AGGREGATION" in text
    assert "what breaks if silver.orders changes?" in text and LTV_ID in text and DAILY_ID in text
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert cli_main(["graph", "--store", str(db), "--upstream", "orders"]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert cli_main(["graph", "--store", str(tmp_path / "missing.sqlite")]) == 2
    assert "lineage-relay demo" in capsys.readouterr().err


def test_a_store_that_is_not_one_or_an_out_that_cannot_be_written_is_named_with_the_fix(tmp_path, capsys):
    not_sqlite = tmp_path / "notes.sqlite"
    not_sqlite.write_text("not a database")
    assert cli_main(["graph", "--store", str(not_sqlite), "--upstream", "x"]) == 2
    err = capsys.readouterr().err
    assert "is not a lineage store" in err and "fix: " in err and "Traceback" not in err

    store_path = tmp_path / "lineage.sqlite"
    LineageStore(store_path).close()
    a_directory = tmp_path / "out"
    a_directory.mkdir()
    assert cli_main(["graph", "--store", str(store_path), "--out", str(a_directory)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write --out {a_directory}" in err and "fix: " in err


def test_graph_never_writes_to_the_store_and_names_the_tables_a_foreign_database_lacks(store, tmp_path, capsys):
    foreign = tmp_path / "app.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    before = foreign.read_bytes()
    assert cli_main(["graph", "--store", str(foreign), "--upstream", "x"]) == 2
    err = capsys.readouterr().err
    assert f"--store {foreign} is not a lineage store (it has no table column_edges, dataset_aliases" in err, err
    assert foreign.read_bytes() == before, "graph added its tables to someone else's database"
    with sqlite3.connect(foreign) as db:
        assert [name for (name,) in db.execute("SELECT name FROM sqlite_master")] == ["customers"]

    db_path = tmp_path / "lineage.sqlite"
    with LineageStore(db_path) as s:
        for event in store.events():
            s.add(event)
    db_path.chmod(0o444)   # a store one may only read (a colleague's, a mounted volume) answers
    before = db_path.read_bytes()
    assert cli_main(["graph", "--store", str(db_path), "--upstream", "gold.daily_revenue.total_revenue"]) == 0
    assert "what feeds gold.daily_revenue.total_revenue?" in capsys.readouterr().out
    assert db_path.read_bytes() == before


def test_a_store_left_with_a_hot_journal_by_a_killed_writer_still_answers(store, tmp_path, capsys):
    """A recording collector killed mid-transaction leaves a hot journal, which a read-only
    connection cannot roll back ("attempt to write a readonly database"): the store was
    refused as "not a lineage store"."""
    db_path = tmp_path / "lineage.sqlite"
    with LineageStore(db_path) as s:
        for event in store.events():
            s.add(event)
    def writer() -> int:   # a transaction bigger than its cache, then gone without a word
        db = sqlite3.connect(db_path, isolation_level=None)
        db.execute("PRAGMA cache_size=1")
        db.execute("BEGIN")
        for _ in range(3000):
            db.execute("INSERT INTO events (body) VALUES (?)", ("x" * 500,))
        return 0

    pid = os.fork()
    if pid == 0:
        run_in_child(writer)
    assert exit_status(pid, 60) == 0
    assert (tmp_path / "lineage.sqlite-journal").exists(), "no hot journal to test with"
    assert cli_main(["graph", "--store", str(db_path), "--upstream", "gold.daily_revenue.total_revenue"]) == 0
    assert "what feeds gold.daily_revenue.total_revenue?" in capsys.readouterr().out


def test_demo_arguments_and_an_output_path_taken_by_a_file_are_refused_clearly(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["demo", "--no-spark", "--runs", "-3"])
    assert exit_.value.code == 2 and "expected 1 or more" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo-output").write_text("a file, not a directory")
    assert cli_main(["demo", "--no-spark"]) == 2
    err = capsys.readouterr().err
    assert "cannot use demo-output as the output directory" in err and "fix: " in err
