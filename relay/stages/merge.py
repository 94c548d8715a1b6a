"""Merge the events of one OpenLineage run into one view (the spec's additive semantics).

OpenLineage spreads a run's metadata over several events: the START usually names the
inputs, the COMPLETE the outputs, RUNNING and OTHER events add facets in between. A
consumer is meant to accumulate them. A facet is identified by its name at its place
(the run, the job, one input or output dataset) and a newer value replaces an older one.
:class:`RunMerger` keeps that accumulated view for one run and builds whole events from
it: the consolidated terminal event, a merged RUNNING event, a START made up from what
has been seen.

Contract:

* Precedence is by ``eventTime``, not by arrival: a facet from an event with a later
  eventTime replaces the same-named facet at the same place; on equal eventTimes the
  event added later wins. An event with an older eventTime that arrives late only fills
  in facets that no newer event has set, so out-of-order delivery cannot roll a facet back.
* Inputs and outputs are keyed by ``(namespace, name)``, separately (a dataset that is
  read and written appears in both). Each dataset's ``facets`` and its ``inputFacets`` /
  ``outputFacets`` merge by facet name with the same rule. Datasets keep first-seen order.
* Facet values are kept as given; a ``{"_deleted": true}`` marker is a facet like any
  other (a newer marker replaces, an older one is replaced) and is passed on for the
  collector to interpret. Malformed parts (a facets value that is not an object, a
  dataset without a string namespace and name) are skipped, never raised on.
* Only RunEvents belong here. The caller passes DatasetEvents and JobEvents through.
* Nothing here mutates a document it is given, nor keeps its objects: each facet is held
  as its JSON text, interned, so that a run costs little more than its facets' JSON and
  runs with identical facets (the same table's schema...) share one copy. Built events
  get freshly parsed facets.
* :meth:`RunMerger.to_state` returns JSON data for ``orjson.dumps`` (facet values and
  event bases are embedded as ``orjson.Fragment``); ``RunMerger.from_state(loads(
  orjson.dumps(m.to_state())))`` behaves exactly like ``m`` for every later ``add`` and every build
  (``loads`` from :mod:`relay.stages.json_bytes`: ``orjson.loads`` would read an integer
  beyond 64 bits in a facet as a float).
* Integers beyond 64 bits in the documents added are kept exactly (as long as the
  documents hold them as integers: orjson reads one as the nearest float).
* :attr:`RunMerger.size_bytes` approximates the JSON size of what is held (facets, bases,
  dataset keys); it is kept up to date on every ``add`` at the cost of encoding each new
  facet once.

Pure and synchronous: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from relay.events import TERMINAL_TYPES, LineageEvent
from relay.stages.interning import intern as _intern
from relay.stages.json_bytes import dumps, loads

STATE_VERSION = 1

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Keys of an event that the merger merges; every other top-level key is the event's "base".
_MERGED_KEYS = frozenset({"run", "job", "inputs", "outputs"})
# Rough per-entry cost of a stored facet or dataset key beyond its JSON text.
_ENTRY_OVERHEAD = 16

# A stored facet: (eventTime in epoch microseconds, facet JSON text, interned); its size
# (see _facet_size) is not stored: an open run holds many of them.
_Entry = tuple
_Facets = dict  # facet name -> _Entry
# A stored dataset: [facets, inputFacets or outputFacets].
_Dataset = list


def epoch_micros(moment: datetime) -> int:
    """``moment`` as integer microseconds since the Unix epoch; naive means UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def _json_size(value: Any) -> int:
    try:
        return len(dumps(value))
    except (TypeError, orjson.JSONEncodeError):  # not JSON data: a rough guess will do
        return len(repr(value))




def _json_text(value: Any) -> str:
    """``value`` as interned JSON text: equal facets of many runs share one string (freed
    with its last user: see :func:`interning_is_mortal`)."""
    try:
        text = dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # not JSON data (a set...): keep what can be kept
        text = json.dumps(value, default=repr)
    return _intern(text)


def _intern_strings(base: dict[str, Any]) -> dict[str, Any]:
    # producer and schemaURL repeat in every event of a producer.
    return {k: _intern(v) if type(v) is str and k != "eventTime" else v for k, v in base.items()}


class RunMerger:
    """The accumulated view of one run; see the module docstring for the contract."""

    __slots__ = (
        "run_id", "job_namespace", "job_name", "event_count", "size_bytes",
        "_run", "_job", "_inputs", "_outputs", "_earliest", "_latest", "_terminal",
    )

    def __init__(self) -> None:
        #: ``run.runId`` as the first added event spelled it; None until the first add.
        self.run_id: str | None = None
        self.job_namespace: str | None = None
        self.job_name: str | None = None
        #: Events added so far.
        self.event_count = 0
        #: Approximate JSON size of everything held, in bytes.
        self.size_bytes = 0
        self._run: _Facets = {}
        self._job: _Facets = {}
        self._inputs: dict[tuple[str, str], _Dataset] = {}
        self._outputs: dict[tuple[str, str], _Dataset] = {}
        # [micros, base, size]: base = the event's top-level keys except run/job/inputs/outputs.
        self._earliest: list | None = None
        self._latest: list | None = None
        self._terminal: list | None = None

    # -- adding ---------------------------------------------------------------------

    def add(self, doc: Mapping[str, Any], event_time: datetime | int) -> None:
        """Merge one RunEvent document. ``event_time`` is its parsed ``eventTime``, as a
        datetime or as epoch microseconds (:func:`epoch_micros`)."""
        at = event_time if isinstance(event_time, int) else epoch_micros(event_time)
        run = doc.get("run") if isinstance(doc.get("run"), dict) else {}
        job = doc.get("job") if isinstance(doc.get("job"), dict) else {}
        if self.run_id is None:
            self.run_id = run.get("runId")
            self.job_namespace = job.get("namespace")
            self.job_name = job.get("name")
        delta = _merge_facets(self._run, run.get("facets"), at)
        delta += _merge_facets(self._job, job.get("facets"), at)
        delta += _merge_datasets(self._inputs, doc.get("inputs"), "inputFacets", at)
        delta += _merge_datasets(self._outputs, doc.get("outputs"), "outputFacets", at)

        base = _intern_strings({key: value for key, value in doc.items() if key not in _MERGED_KEYS})
        entry = [at, base, _json_size(base) + _ENTRY_OVERHEAD]
        # Each slot is sized on its own, even when two slots hold the same base, so that
        # a state that went through JSON (which unshares them) counts the same.
        if self._earliest is None or at < self._earliest[0]:  # ties: the first stays earliest
            delta += entry[2] - (self._earliest[2] if self._earliest else 0)
            self._earliest = entry
        if self._latest is None or at >= self._latest[0]:
            delta += entry[2] - (self._latest[2] if self._latest else 0)
            self._latest = entry
        if doc.get("eventType") in TERMINAL_TYPES and (self._terminal is None or at >= self._terminal[0]):
            delta += entry[2] - (self._terminal[2] if self._terminal else 0)
            self._terminal = entry
        self.size_bytes += delta
        self.event_count += 1

    def add_event(self, event: LineageEvent) -> None:
        """Merge a decoded RunEvent (``event.doc`` at ``event.event_time``)."""
        self.add(event.doc, event.event_time)

    # -- what is known --------------------------------------------------------------

    @property
    def has_terminal(self) -> bool:
        """Whether a COMPLETE, FAIL or ABORT has been added."""
        return self._terminal is not None

    @property
    def earliest_micros(self) -> int | None:
        """The earliest eventTime added, in epoch microseconds; None while empty."""
        return self._earliest[0] if self._earliest else None

    @property
    def latest_micros(self) -> int | None:
        """The latest eventTime added, in epoch microseconds; None while empty."""
        return self._latest[0] if self._latest else None

    # -- building events -------------------------------------------------------------

    def consolidated_event(self) -> dict[str, Any]:
        """The run as one terminal event: the terminal with the latest eventTime (its
        eventType, eventTime, producer, schemaURL and any other top-level keys) carrying
        the union of every run facet, job facet, input and output. Raises ValueError if
        no terminal event has been added."""
        if self._terminal is None:
            raise ValueError(f"run {self.run_id}: no COMPLETE/FAIL/ABORT merged, cannot consolidate")
        return self._build(self._terminal[1], None)

    def running_event(self) -> dict[str, Any]:
        """The merged view as a RUNNING event based on the latest event added (its
        eventTime, producer, schemaURL). Fed only RUNNING events, this is those events
        coalesced into one. Raises ValueError while empty."""
        return self._build(self._base("_latest"), "RUNNING")

    def start_event(
        self,
        *,
        run_facets: Mapping[str, Any] | None = None,
        omit_run_facets: Iterable[str] = (),
    ) -> dict[str, Any]:
        """A START made up from the merged view: the earliest event's eventTime, producer
        and schemaURL; the run and job facets and inputs known so far, no outputs.
        ``omit_run_facets`` leaves out run facets that describe an outcome (e.g.
        ``errorMessage``); ``run_facets`` are added (they win over merged ones). Raises
        ValueError while empty."""
        return self._build(
            self._base("_earliest"), "START", outputs=False, extra=run_facets, omit=frozenset(omit_run_facets)
        )

    def _base(self, slot: str) -> dict[str, Any]:
        entry = getattr(self, slot)
        if entry is None:
            raise ValueError("no event merged yet, nothing to build from")
        return entry[1]

    def _build(
        self,
        base: Mapping[str, Any],
        event_type: str | None,
        *,
        outputs: bool = True,
        extra: Mapping[str, Any] | None = None,
        omit: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        doc = dict(base)
        if event_type is not None:
            doc["eventType"] = event_type
        facets = {name: loads(entry[1]) for name, entry in self._run.items() if name not in omit}
        if extra:
            facets.update(extra)
        doc["run"] = {"runId": self.run_id, "facets": facets}
        doc["job"] = {
            "namespace": self.job_namespace,
            "name": self.job_name,
            "facets": _facets_doc(self._job),
        }
        doc["inputs"] = [_dataset_doc(key, ds, "inputFacets") for key, ds in self._inputs.items()]
        doc["outputs"] = (
            [_dataset_doc(key, ds, "outputFacets") for key, ds in self._outputs.items()] if outputs else []
        )
        return doc

    # -- persistence -----------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """The merged view as JSON data for ``orjson.dumps`` (see the module contract);
        serialise it, do not mutate it."""
        return {
            "v": STATE_VERSION,
            "runId": self.run_id,
            "job": [self.job_namespace, self.job_name],
            "events": self.event_count,
            "run": _facets_state(self._run),
            "jobFacets": _facets_state(self._job),
            "inputs": [[ns, name, _facets_state(ds[0]), _facets_state(ds[1])]
                       for (ns, name), ds in self._inputs.items()],
            "outputs": [[ns, name, _facets_state(ds[0]), _facets_state(ds[1])]
                        for (ns, name), ds in self._outputs.items()],
            # Bases as Fragments too, written by dumps: orjson writes 254 levels, decode
            # accepts more (see RunRecord.to_state).
            "earliest": _entry_state(self._earliest),
            "latest": _entry_state(self._latest),
            "terminal": _entry_state(self._terminal),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RunMerger:
        """Rebuild a merger from :meth:`to_state` output read back from its JSON.
        Raises ValueError for another state version or a malformed state."""
        if not isinstance(state, Mapping) or state.get("v") != STATE_VERSION:
            version = state.get("v") if isinstance(state, Mapping) else None
            raise ValueError(f"unsupported run-merge state version {version!r}; expected {STATE_VERSION}")
        try:
            merger = cls()
            merger.run_id = state["runId"]
            merger.job_namespace, merger.job_name = state["job"]
            merger.event_count = int(state["events"])
            merger._run = _facets_from_state(state["run"])
            merger._job = _facets_from_state(state["jobFacets"])
            for target, rows in ((merger._inputs, state["inputs"]), (merger._outputs, state["outputs"])):
                for ns, name, facets, own in rows:
                    target[(ns, name)] = [_facets_from_state(facets), _facets_from_state(own)]
            for slot in ("earliest", "latest", "terminal"):
                entry = state[slot]
                if entry is not None:
                    entry = [entry[0], _intern_strings(entry[1]), entry[2]]
                setattr(merger, f"_{slot}", entry)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"malformed run-merge state: {err!r}") from err
        merger.size_bytes = merger._recount()
        return merger

    def _recount(self) -> int:
        size = sum(_facet_size(name, entry) for store in (self._run, self._job) for name, entry in store.items())
        for store in (self._inputs, self._outputs):
            for (ns, name), (facets, own) in store.items():
                size += len(ns) + len(name) + _ENTRY_OVERHEAD
                size += sum(_facet_size(n, entry) for part in (facets, own) for n, entry in part.items())
        return size + sum(e[2] for e in (self._earliest, self._latest, self._terminal) if e is not None)


def state_without_facets(state: Mapping[str, Any]) -> dict[str, Any]:
    """A :meth:`RunMerger.to_state` output with every facet left out (its datasets kept by
    name, its bases kept): what a run's state record keeps of the merged view when the
    whole one is too large to write. Restored, it builds events without the facets merged
    before."""
    return {**state, "run": {}, "jobFacets": {},
            "inputs": [[ns, name, {}, {}] for ns, name, *_ in state["inputs"]],
            "outputs": [[ns, name, {}, {}] for ns, name, *_ in state["outputs"]]}


def _facet_size(name: str, entry: _Entry) -> int:
    return len(name) + len(entry[1]) + _ENTRY_OVERHEAD


def _merge_facets(store: _Facets, facets: Any, at: int) -> int:
    """Merge ``facets`` stamped ``at`` into ``store``; return the change in size."""
    if not isinstance(facets, dict):
        return 0
    delta = 0
    for name, facet in facets.items():
        old = store.get(name)
        if old is not None and old[0] > at:
            continue  # a newer event already set this facet
        entry = store[name] = (at, _json_text(facet))
        delta += _facet_size(name, entry) - (_facet_size(name, old) if old is not None else 0)
    return delta


def _entry_state(entry: list | None) -> list | None:
    return None if entry is None else [entry[0], orjson.Fragment(dumps(entry[1])), entry[2]]


def _facets_doc(store: _Facets) -> dict[str, Any]:
    return {name: loads(entry[1]) for name, entry in store.items()}


def _facets_state(store: _Facets) -> dict[str, list]:
    return {name: [entry[0], orjson.Fragment(entry[1]), _facet_size(name, entry)] for name, entry in store.items()}


def _facets_from_state(facets: Mapping[str, Any]) -> _Facets:
    return {name: (int(entry[0]), _json_text(entry[1])) for name, entry in facets.items()}


def _merge_datasets(store: dict[tuple[str, str], _Dataset], datasets: Any, own_key: str, at: int) -> int:
    if not isinstance(datasets, list):
        return 0
    delta = 0
    for dataset in datasets:
        if not isinstance(dataset, dict):
            continue
        namespace, name = dataset.get("namespace"), dataset.get("name")
        if not (isinstance(namespace, str) and isinstance(name, str)):
            continue
        entry = store.get((namespace, name))
        if entry is None:
            entry = store[(namespace, name)] = [{}, {}]
            delta += len(namespace) + len(name) + _ENTRY_OVERHEAD
        delta += _merge_facets(entry[0], dataset.get("facets"), at)
        delta += _merge_facets(entry[1], dataset.get(own_key), at)
    return delta


def _dataset_doc(key: tuple[str, str], dataset: _Dataset, own_key: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "namespace": key[0],
        "name": key[1],
        "facets": _facets_doc(dataset[0]),
    }
    if dataset[1]:
        doc[own_key] = _facets_doc(dataset[1])
    return doc


# -- whole-set helpers -----------------------------------------------------------------


def merge_events(events: Iterable[LineageEvent]) -> RunMerger:
    """A merger holding ``events`` (RunEvents of one run), added in the given order."""
    merger = RunMerger()
    for event in events:
        merger.add_event(event)
    return merger


def consolidate(events: Iterable[LineageEvent]) -> dict[str, Any]:
    """``events`` of one run as one terminal event; see :meth:`RunMerger.consolidated_event`."""
    return merge_events(events).consolidated_event()


def merge_running(events: Iterable[LineageEvent]) -> dict[str, Any]:
    """RUNNING ``events`` of one run as one RUNNING event; see :meth:`RunMerger.running_event`."""
    return merge_events(events).running_event()
