"""What a collector received, seen per run: for tests that compare runs' views."""

from __future__ import annotations

from collections import defaultdict

import orjson

TERMINAL = frozenset({"COMPLETE", "FAIL", "ABORT"})


def normalised(doc: dict) -> bytes:
    """Canonical JSON with datasets in name order (a merge keeps first-seen order)."""
    doc = dict(doc)
    for side in ("inputs", "outputs"):
        doc[side] = sorted(doc.get(side) or [], key=lambda d: (d["namespace"], d["name"]))
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def by_run(events: list[dict]) -> dict[str, list[dict]]:
    """RunEvents grouped by run id, in the order received."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        runs[event["run"]["runId"]].append(event)
    return runs


def finished_runs(events: list[dict]) -> int:
    """How many runs got a terminal event."""
    return len({e["run"]["runId"] for e in events if e.get("eventType") in TERMINAL})
