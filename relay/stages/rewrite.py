"""Rewrite an event for one collector: namespace mapping, redaction, facet removal, size limit.

A :class:`Rewriter` is built once per collector from its :class:`RewriteConfig`
(:mod:`relay.stages.rewrite_config`); :meth:`Rewriter.apply` turns the shared parsed event
into the bytes that collector receives, or a rejection. It is pure and synchronous (no
I/O, no clock). The copy-on-write walks over the event's facet paths are in
:mod:`relay.stages.event_paths`, those over a facet's values (redaction, ``mask_keys``)
in :mod:`relay.stages.scrub`.

Contract of :meth:`Rewriter.apply`:

* The input document is never mutated (several collectors share it). The rewritten tree
  shares every subtree it did not change with the input, so a rewrite costs memory in
  proportion to what it changes, plus the encoded output. With ``max_event_bytes``, an
  event whose ``original`` bytes are over the limit is never encoded whole to measure it:
  each facet is encoded once (one at a time) and the rest as a skeleton; without
  ``original`` there is at most one trial encoding, released before the final one.
* Steps, in order: credentials are redacted, configured facets are dropped, keys are
  masked, namespaces are mapped (the ``from`` patterns see redacted namespaces), then the
  size limit is applied.
* A facet is only ever removed whole, and ``inputs``/``outputs`` are never touched by the
  size limit, so the output stays valid against the OpenLineage spec if the input was
  (masking a typed field of a *standard* facet, e.g. a number, is the one way to break it).
* ``mask_keys`` masks values, never structure: under a matching key a string or a number
  becomes ``"***"``, an object or a list keeps its shape with each string and number inside
  masked (a ``"secrets": {...}`` object of a custom facet loses every value), a boolean or
  null is kept. The keys of the standard facets' maps keyed by column names
  (``columnLineage.fields``, ``dataQualityMetrics.columnMetrics``, ``lineage.fields``) are
  names, not settings: never matched (a column ``password_hash`` keeps its lineage).
* An event still over ``max_event_bytes`` after every facet ``shrink_order`` allows is
  dropped is rejected with :data:`TOO_LARGE_FOR_COLLECTOR` and a detail naming the sizes.

Redaction (``redact_credentials``) works on substrings of every string in the event's job,
datasets and facets (JDBC URLs inside an error message included), and in its ``producer``
and ``schemaURL`` (a facet's ``_producer`` and ``_schemaURL`` too, which ``mask_keys``
never masks: a producer's URL may hold a token):

* ``scheme://user:password@host`` loses ``user:password@``, whatever follows the host (user
  and password may hold ``@``, ``/``, ``'`` and ``://``; see :mod:`relay.stages.redact`), and Oracle's
  ``jdbc:oracle:thin:user/password@host`` loses ``user/password``. Userinfo without a
  password is kept (the naming conventions use it for Azure:
  ``abfss://container@account.dfs...``), except over http(s), where
  ``https://<token>@github.com`` is a credential.
* Query, fragment or ``;`` parameters named in ``secret_query_params`` (case-insensitive
  globs: by default any name holding password, pwd, secret, token, signature...) are
  removed (a value runs past a ``'`` unless it can close a quoted URL), e.g.
  ``?sv=...&sig=...`` (Azure SAS: its short names only beside a ``sig``),
  ``X-Amz-Signature``, JDBC ``password=`` (braced values too), ``#access_token=``; only the
  query or fragment a parameter was removed from is tidied up.
* Not caught: secrets in dict keys, URL-encoded separators, credentials without a URI shape.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from relay.stages.event_paths import facet_sites, map_job_dependencies, map_lineage, map_paths, without_facets
from relay.stages.json_bytes import dumps, exact, may_hold_big_int
from relay.stages.redact import Redactor
from relay.stages.rewrite_config import ESSENTIAL_FACETS, RewriteConfig
from relay.stages.route import compile_glob
from relay.stages.scrub import Scrubber

#: Rejection reason: the event cannot be made to fit this collector's ``max_event_bytes``.
TOO_LARGE_FOR_COLLECTOR = "too_large_for_collector"


@dataclass(frozen=True, slots=True)
class RewriteResult:
    """``body`` to send, or ``None`` with ``rejection = (reason, detail)``. ``dropped`` names
    each facet removed to fit ``max_event_bytes`` (one entry per instance; empty on
    rejection, since nothing was sent), for the ``facets_dropped_for_size`` counter."""

    body: bytes | None
    dropped: list[str] = field(default_factory=list)
    rejection: tuple[str, str] | None = None


class Rewriter:
    """Applies one collector's :class:`RewriteConfig`; see the module docstring."""

    __slots__ = ("_ns_map", "_map_datasets", "_redact", "_redactor", "_drop", "_mask", "_scrubber",
                 "_touch_facets", "_max", "_shrink_order")

    def __init__(self, config: RewriteConfig) -> None:
        self._ns_map = tuple((compile_glob(m.from_), m.to) for m in config.namespace_map)
        self._map_datasets = config.map_dataset_namespaces
        self._redact = config.redact_credentials
        self._redactor = Redactor(config.secret_query_params) if config.redact_credentials else None
        self._drop = _any_glob(config.drop_facets, re.NOFLAG)
        self._mask = _any_glob(config.mask_keys, re.IGNORECASE)
        #: Scrubs facets (redaction, mask_keys); None when neither is on.
        self._scrubber = Scrubber(self._redactor, self._mask) if self._redact or self._mask is not None else None
        self._touch_facets = self._scrubber is not None or self._drop is not None or bool(self._ns_map)
        self._max = config.max_event_bytes
        self._shrink_order = tuple(_shrink_entry(entry) for entry in config.shrink_order)

    @property
    def is_noop(self) -> bool:
        """True when :meth:`apply` would change nothing: the caller may skip it."""
        return not (self._ns_map or self._redact or self._drop or self._mask or self._max is not None)

    def apply(self, event_doc: dict[str, Any], *, original: bytes | None = None,
              big_int: bool = True) -> RewriteResult:
        """Rewrite ``event_doc`` (never mutated) for this collector.

        ``original``, the bytes ``event_doc`` was parsed from, is returned as the body when
        nothing changes, so such events are forwarded byte-for-byte. A rebuilt event keeps
        the integers beyond 64 bits of ``original`` exactly, though ``event_doc`` came from
        orjson, which reads one as the nearest float (without ``original``, as ``event_doc`` has it);
        ``max_event_bytes`` applies to that exact event (facets dropped, or refused, by its size).
        ``big_int`` False (the event's :attr:`~relay.events.LineageEvent.big_int` from decode)
        says ``original`` holds none: nothing is checked for one.
        """
        result = self._apply(event_doc, original)
        body = result.body
        if original is None or body is original or not big_int:
            return result
        # Rare: a float of 9.2e18 or more was written, or the float document did not fit (an
        # integer of 20 digits is 22 bytes as a float: the exact event may fit, or drop less).
        if body is None or result.dropped or may_hold_big_int(body):
            exact_doc = exact(original)  # None (a scan of the bytes) unless it holds one
            if exact_doc is not None:
                return self._apply(exact_doc, original)
        return result

    def _apply(self, event_doc: dict[str, Any], original: bytes | None) -> RewriteResult:
        doc = self._rewrite(event_doc) if not self.is_noop else event_doc
        limit = self._max
        if original is not None and limit is not None and len(original) > limit:
            # Known to be large: measure by parts rather than encode it whole to find out.
            return self._fit(doc)
        body = original if (doc is event_doc and original is not None) else dumps(doc)
        if limit is None or len(body) <= limit:
            return RewriteResult(body)
        del body  # the fitted encoding replaces it; never hold two
        return self._fit(doc)

    # -- redaction, dropping, masking (relay.stages.scrub), mapping (copy-on-write) --

    def _rewrite(self, doc: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        if self._redactor is not None:
            # URIs by the spec, and a producer's may hold a token (https://<token>@github.com/...).
            for key in ("producer", "schemaURL"):
                value = doc.get(key)
                if isinstance(value, str) and (new := self._redactor.text(value)) is not value:
                    changes[key] = new
        run = doc.get("run")
        if isinstance(run, dict):
            facets = self._facets(run.get("facets"))
            if facets is not run.get("facets"):
                changes["run"] = {**run, "facets": facets}
        job = doc.get("job")
        if isinstance(job, dict):
            new_job = self._holder(job, ("facets",), self._map_job)
            if new_job is not job:
                changes["job"] = new_job
        dataset = doc.get("dataset")
        if isinstance(dataset, dict):
            new_dataset = self._holder(dataset, ("facets",), self._map_dataset)
            if new_dataset is not dataset:
                changes["dataset"] = new_dataset
        for group, own in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
            items = doc.get(group)
            if isinstance(items, list):
                new_items = [
                    self._holder(item, ("facets", own), self._map_dataset) if isinstance(item, dict) else item
                    for item in items
                ]
                if any(new is not old for new, old in zip(new_items, items)):
                    changes[group] = new_items
        return {**doc, **changes} if changes else doc

    def _holder(self, obj: dict[str, Any], facet_keys: tuple[str, ...], map_ns: Callable[[str], str]) -> dict[str, Any]:
        """A job or dataset: its namespace, name and facets."""
        changes: dict[str, Any] = {}
        for key in ("namespace", "name"):
            value = obj.get(key)
            if isinstance(value, str):
                new = self._redactor.text(value) if self._redactor is not None else value
                if key == "namespace":
                    new = map_ns(new)
                if new != value:
                    changes[key] = new
        for key in facet_keys:
            facets = obj.get(key)
            new_facets = self._facets(facets)
            if new_facets is not facets:
                changes[key] = new_facets
        return {**obj, **changes} if changes else obj

    def _facets(self, facets: Any) -> Any:
        if not self._touch_facets or not isinstance(facets, dict) or not facets:
            return facets
        out: dict[str, Any] = {}
        changed = False
        for name, facet in facets.items():
            if self._drop is not None and self._drop(name):
                changed = True
                continue
            new = self._scrubber.facet(name, facet) if self._scrubber is not None else facet
            if name == "parent" and self._ns_map:
                new = map_paths(new, (("job",), ("root", "job")), self._map_job)
            elif name == "columnLineage" and self._map_datasets:
                new = self._map_column_lineage(new)
            elif name == "symlinks" and self._map_datasets:
                new = map_paths(new, (), self._map_dataset, list_key="identifiers")
            elif name == "jobDependencies" and self._ns_map:
                # The upstream and downstream jobs, mapped as the event's job is.
                new = map_job_dependencies(new, self._map_job)
            elif name == "lifecycleStateChange" and self._map_datasets:
                new = map_paths(new, (("previousIdentifier",),), self._map_dataset)
            elif name == "lineage" and self._ns_map:
                # The jobs it names are mapped as the event's job is; its datasets only with
                # map_dataset_namespaces (_map_dataset).
                new = map_lineage(new, self._map_job, self._map_dataset)
            changed = changed or new is not facet
            out[name] = new
        return out if changed else facets

    def _map_job(self, namespace: str) -> str:
        for matches, target in self._ns_map:
            if matches(namespace):
                return target
        return namespace

    def _map_dataset(self, namespace: str) -> str:
        return self._map_job(namespace) if self._map_datasets else namespace

    def _map_column_lineage(self, facet: Any) -> Any:
        if not isinstance(facet, dict):
            return facet
        changes: dict[str, Any] = {}
        fields = facet.get("fields")
        if isinstance(fields, dict):
            new_fields = {name: map_paths(spec, (), self._map_dataset, list_key="inputFields")
                          for name, spec in fields.items()}
            if any(new_fields[name] is not spec for name, spec in fields.items()):
                changes["fields"] = new_fields
        dataset_wide = facet.get("dataset")
        if isinstance(dataset_wide, list):
            new_wide = [map_paths(item, ((),), self._map_dataset) for item in dataset_wide]
            if any(n is not o for n, o in zip(new_wide, dataset_wide)):
                changes["dataset"] = new_wide
        return {**facet, **changes} if changes else facet

    # -- size limit --

    def _fit(self, doc: dict[str, Any]) -> RewriteResult:
        """Encode ``doc`` within ``max_event_bytes``, dropping facets per ``shrink_order``.

        Sizes are exact without encoding the whole event: each facet is encoded once (one
        at a time) and the rest as a skeleton with every facets object emptied; compact
        JSON adds ``"name":`` and one comma per extra member. Only the output is encoded whole.
        """
        limit = self._max
        assert limit is not None
        sites = list(facet_sites(doc))
        # Bytes a facet takes in its object: "name":<facet>, plus one comma while it has siblings.
        candidates = [
            (len(orjson.dumps(name)) + 1 + len(dumps(facet)), name, site)
            for site, (_path, facets) in enumerate(sites)
            for name, facet in facets.items()
        ]
        start_size = len(dumps(without_facets(doc, {path: None for path, _facets in sites})))
        start_size += sum(size for size, _name, _site in candidates)
        start_size += sum(len(facets) - 1 for _path, facets in sites if facets)
        members = [len(facets) for _path, facets in sites]
        taken: list[int] = []
        taken_set: set[int] = set()
        size = start_size
        for matches in self._shrink_order:
            if size <= limit:
                break
            order = sorted(
                (i for i, (_, name, _) in enumerate(candidates) if i not in taken_set and matches(name)),
                key=lambda i: -candidates[i][0],
            )
            for i in order:
                if size <= limit:
                    break
                member_size, _name, site = candidates[i]
                size -= member_size + (1 if members[site] > 1 else 0)
                members[site] -= 1
                taken.append(i)
                taken_set.add(i)
        names = [candidates[i][1] for i in taken]
        if size > limit:
            return self._too_large(start_size, size, names)
        drops: dict[tuple[Any, ...], set[str] | None] = {}
        for i in taken:
            drops.setdefault(sites[candidates[i][2]][0], set()).add(candidates[i][1])
        body = dumps(without_facets(doc, drops))
        if len(body) > limit:  # the arithmetic above is exact; this is the re-measurement
            return self._too_large(start_size, len(body), names)
        return RewriteResult(body, names)

    def _too_large(self, start: int, end: int, names: list[str]) -> RewriteResult:
        shown = ", ".join(dict.fromkeys(names)) or "none allowed by shrink_order"
        if len(shown) > 200:
            shown = shown[:197] + "..."
        detail = (f"event is {start} bytes, over this collector's max_event_bytes of {self._max}; "
                  f"still {end} bytes after dropping {len(names)} facet(s) ({shown})")
        return RewriteResult(None, [], (TOO_LARGE_FOR_COLLECTOR, detail))


def _any_glob(patterns: tuple[str, ...], flags: re.RegexFlag) -> Callable[[str], bool] | None:
    if not patterns:
        return None
    match = re.compile("|".join(fnmatch.translate(p) for p in patterns), flags).match
    return lambda value: match(value) is not None


def _shrink_entry(entry: str) -> Callable[[str], bool]:
    matches = compile_glob(entry)
    return lambda name: name == entry if name in ESSENTIAL_FACETS else matches(name)
