"""Offline validation of OpenLineage events against the official JSON Schemas.

The schemas are the OpenLineage ``spec/`` folder: ``$OPENLINEAGE_SPEC_DIR`` when set, else
``../shared/openlineage-spec`` next to the repository when it exists, else the copy in
``tests/spec/openlineage-spec`` (so a clone on its own runs the tests): the core
``OpenLineage.json`` and one ``facets/*.json`` per standard facet, all JSON Schema
2020-12. Every file is registered under its ``$id`` in a :class:`referencing.Registry`, so
cross-file ``$ref`` resolve locally and nothing is ever fetched from the network. A missing
spec folder raises :class:`SpecUnavailable`: tests that rely on the spec fail, never skip.

What :meth:`OpenLineageValidator.validate` guarantees for an event:

* it matches exactly one of RunEvent / DatasetEvent / JobEvent (the core ``oneOf``);
* every facet in ``run.facets``, ``job.facets``, ``dataset.facets`` and each input or
  output dataset's ``facets`` / ``inputFacets`` / ``outputFacets`` satisfies its standard
  facet schema when its name is a standard facet for that place (the name-to-schema map
  is derived from the facet files, not listed here); any other (custom) facet satisfies
  the core ``BaseFacet`` (``_producer`` and ``_schemaURL``);
* ``date-time``, ``uri`` and ``uuid`` formats are checked (by the small checkers below,
  so the result does not depend on which optional format libraries are installed).

Not checked: that ``_schemaURL`` points at the facet's own schema (the spec's examples
do not do that either), and facets nested inside other facets beyond what their schema
says. A facet marked ``"_deleted": true`` is only held to the base facet schema.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from datetime import date, time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urldefrag

import orjson
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

SPEC_DIR_ENV = "OPENLINEAGE_SPEC_DIR"

#: Where a facet can sit in an event, named after the core schema's facet base types.
FacetSite = Literal["run", "job", "dataset", "input", "output"]
_SITE_BY_BASE: dict[str, FacetSite] = {
    "RunFacet": "run",
    "JobFacet": "job",
    "DatasetFacet": "dataset",
    "InputDatasetFacet": "input",
    "OutputDatasetFacet": "output",
}
_BASE_BY_SITE = {site: base for base, site in _SITE_BY_BASE.items()}

_MAX_MESSAGE = 240
_FACET_CACHE_SIZE = 8192
_CacheKey = tuple[str, str, bytes]


class SpecUnavailable(RuntimeError):
    """The OpenLineage spec folder (or a file in it) is missing or unreadable."""


class SpecViolation(AssertionError):
    """An event or facet does not satisfy the spec. ``errors`` lists ``"<json path>: <why>"``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {error}" for error in errors)
        super().__init__(f"OpenLineage spec violation ({len(errors)} error(s)):\n{lines}")


def default_spec_dir() -> Path:
    """``$OPENLINEAGE_SPEC_DIR``; else ``<repo>/../shared/openlineage-spec`` (the team's
    copy, next to the repository) when it exists; else the repository's own copy,
    ``tests/spec/openlineage-spec``. An explicit directory that does not exist is used as
    given, and fails: it is a mistake, not a reason to fall back."""
    explicit = os.environ.get(SPEC_DIR_ENV)
    if explicit:
        return Path(explicit)
    repo = Path(__file__).resolve().parents[2]
    shared = repo.parent / "shared" / "openlineage-spec"
    return shared if shared.is_dir() else repo / "tests" / "spec" / "openlineage-spec"


# --- formats -------------------------------------------------------------------------
# jsonschema silently accepts a format it has no checker for (date-time and uri need
# optional packages), so the three formats the spec uses get explicit checkers.

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-](\d{2}):(\d{2}))", re.ASCII
)
# RFC 3986: a scheme, then only unreserved / reserved characters and %-escapes.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")


def _is_uuid(value: object) -> bool:
    return not isinstance(value, str) or _UUID.fullmatch(value) is not None


def _is_date_time(value: object) -> bool:
    """RFC 3339 ``date-time``: a real calendar date and time with a mandatory offset."""
    if not isinstance(value, str):
        return True
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    if second > 60:
        return False
    try:
        date(year, month, day)
        time(hour, minute, min(second, 59))  # RFC 3339 allows a leap second (:60)
    except ValueError:
        return False
    offset_hours, offset_minutes = match.group(9, 10)
    return offset_hours is None or (int(offset_hours) <= 23 and int(offset_minutes) <= 59)


def _is_uri(value: object) -> bool:
    return not isinstance(value, str) or (_URI.fullmatch(value) is not None and value.count("#") <= 1)


def format_checker() -> FormatChecker:
    """jsonschema's default checkers, with ``uuid``, ``date-time`` and ``uri`` always enforced."""
    checker = FormatChecker()
    checker.checks("uuid")(_is_uuid)
    checker.checks("date-time")(_is_date_time)
    checker.checks("uri")(_is_uri)
    return checker


# --- loading -------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecUnavailable(f"cannot read OpenLineage schema {path}: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("$id"), str):
        raise SpecUnavailable(f"{path} is not a JSON Schema with an $id")
    return _cheap_keywords_first(doc)


# Keywords that fail fast, moved ahead of "properties"/"items" in every subschema. Keyword
# order does not change a result (jsonschema works out unevaluated* by itself), but the
# core oneOf tries every event type on every event, and a JobEvent attempt on a RunEvent
# would otherwise validate all its datasets before noticing "not: required run".
_CHEAP_FIRST = ("type", "const", "enum", "required", "not")


def _cheap_keywords_first(node: Any) -> Any:
    if isinstance(node, dict):
        node = {key: _cheap_keywords_first(value) for key, value in node.items()}
        return {**{key: node[key] for key in _CHEAP_FIRST if key in node}, **node}
    if isinstance(node, list):
        return [_cheap_keywords_first(item) for item in node]
    return node


def _local_refs(node: Mapping[str, Any]) -> Iterator[str]:
    """The ``$ref`` targets a facet property points at, looking through anyOf/oneOf."""
    if isinstance(node.get("$ref"), str):
        yield node["$ref"]
    for keyword in ("anyOf", "oneOf"):
        for branch in node.get(keyword, ()):
            yield from _local_refs(branch)


def _facet_defs(doc: dict[str, Any], ref: str, core_id: str) -> Iterator[tuple[FacetSite, str]]:
    """``(site, definition name)`` for each concrete facet definition ``ref`` leads to.

    A definition is concrete when its ``allOf`` extends one of the core facet base types
    (``RunFacet``, ``DatasetFacet``...); that base says where the facet sits. A definition
    that is only a choice (``BaseSubsetDatasetFacet`` = input or output subset) is followed.
    """
    prefix = "#/$defs/"
    if not ref.startswith(prefix):
        return
    name = ref[len(prefix) :]
    definition = doc.get("$defs", {}).get(name, {})
    for part in definition.get("allOf", ()):
        base_uri, fragment = urldefrag(part.get("$ref", ""))
        base = fragment.rpartition("/")[2]
        if base_uri == core_id and base in _SITE_BY_BASE:
            yield _SITE_BY_BASE[base], name
            return
    for inner in _local_refs({k: v for k, v in definition.items() if k in ("anyOf", "oneOf")}):
        yield from _facet_defs(doc, inner, core_id)


# --- validation ----------------------------------------------------------------------


def _json_path(parts: Iterable[str | int]) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def _message(error: ValidationError) -> str:
    message = error.message
    # jsonschema starts most messages with the offending value, which can be a whole event.
    shown = repr(error.instance)
    if len(shown) > 60 and message.startswith(shown):
        short = {dict: "{…}", list: "[…]"}.get(type(error.instance), shown[:59] + "…")
        message = short + message[len(shown) :]
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 1] + "…"


def _describe(error: ValidationError, prefix: tuple[str | int, ...]) -> str:
    return f"{_json_path((*prefix, *error.absolute_path))}: {_message(error)}"


def _discriminator_misses(errors: list[ValidationError], depth: int) -> int:
    return sum(1 for e in errors if len(e.absolute_path) == depth and e.validator in ("type", "const", "enum"))


def _leaves(error: ValidationError, preferred_branch: int | None = None) -> Iterator[ValidationError]:
    """Replace an anyOf/oneOf failure by the errors of its most plausible alternative.

    jsonschema reports "is not valid under any of the given schemas" at the parent; the
    useful errors (with their paths) are in ``error.context``. When every alternative
    failed, the one to explain is ``preferred_branch`` if given, else the one that failed
    least on discriminators (type/const/enum) at this level, then with fewest errors.
    A oneOf that failed because several alternatives matched is reported as it is.
    """
    if error.validator in ("anyOf", "oneOf") and error.context:
        by_branch: dict[int, list[ValidationError]] = defaultdict(list)
        for sub in error.context:
            by_branch[sub.relative_schema_path[0]].append(sub)
        if len(by_branch) == len(error.validator_value):
            depth = len(error.absolute_path)
            if preferred_branch in by_branch:
                branch = preferred_branch
            else:
                branch = min(
                    by_branch,
                    key=lambda i: (_discriminator_misses(by_branch[i], depth), len(by_branch[i])),
                )
            for sub in by_branch[branch]:
                yield from _leaves(sub)
            return
    yield error


class OpenLineageValidator:
    """Validates events and facets against one spec folder. Build once, reuse: see :func:`validator`."""

    def __init__(self, spec_dir: Path | None = None) -> None:
        self.spec_dir = Path(spec_dir) if spec_dir is not None else default_spec_dir()
        core_path = self.spec_dir / "OpenLineage.json"
        facet_dir = self.spec_dir / "facets"
        if not core_path.is_file() or not facet_dir.is_dir():
            raise SpecUnavailable(
                f"OpenLineage spec not found at {self.spec_dir} (need OpenLineage.json and facets/); "
                f"copy the OpenLineage repo's spec/ folder there or set ${SPEC_DIR_ENV}"
            )
        core = _load(core_path)
        self.core_id: str = core["$id"]
        facet_docs = [_load(path) for path in sorted(facet_dir.glob("*.json"))]
        if not facet_docs:
            raise SpecUnavailable(f"no facet schemas in {facet_dir}")

        resources = [(doc["$id"], Resource.from_contents(doc)) for doc in (core, *facet_docs)]
        registry: Registry = Registry().with_resources(resources).crawl()
        checker = format_checker()

        def compile_ref(uri: str) -> Draft202012Validator:
            return Draft202012Validator({"$ref": uri}, registry=registry, format_checker=checker)

        self._core = Draft202012Validator(core, registry=registry, format_checker=checker)
        # The core oneOf lists the event kinds; remember which alternative is which so a
        # broken RunEvent is explained as a RunEvent, not as "not a DatasetEvent either".
        self._event_kinds = [branch["$ref"].rpartition("/")[2] for branch in core["oneOf"]]
        self._site_bases = {site: compile_ref(f"{self.core_id}#/$defs/{b}") for site, b in _BASE_BY_SITE.items()}
        self._base_facet = compile_ref(f"{self.core_id}#/$defs/BaseFacet")

        #: ``(site, facet name) -> schema URI`` of every standard facet, from the facet files.
        self.facet_schemas: dict[tuple[FacetSite, str], str] = {}
        for doc in facet_docs:
            for facet_name, prop in doc.get("properties", {}).items():
                for ref in _local_refs(prop):
                    for site, definition in _facet_defs(doc, ref, self.core_id):
                        uri = f"{doc['$id']}#/$defs/{definition}"
                        known = self.facet_schemas.setdefault((site, facet_name), uri)
                        if known != uri:
                            raise SpecUnavailable(
                                f"two schemas for the {site} facet {facet_name!r}: {known} and {uri}"
                            )
        self._facets = {key: compile_ref(uri) for key, uri in self.facet_schemas.items()}
        self._facet_cache: dict[_CacheKey, tuple[tuple[tuple[Any, ...], str], ...]] = {}

    # -- events --

    def errors(self, event: Any) -> list[str]:
        """Every spec violation in ``event`` as ``"<json path>: <why>"``; empty when valid."""
        if not isinstance(event, dict):  # spare the reader every event type's complaints
            return [f"$: an OpenLineage event is a JSON object, not {type(event).__name__}"]
        found: list[str] = []
        kind = _event_kind(event)
        preferred = self._event_kinds.index(kind) if kind in self._event_kinds else None
        for error in self._core.iter_errors(event):
            at_root_one_of = not error.absolute_path and list(error.relative_schema_path) == ["oneOf"]
            for leaf in _leaves(error, preferred if at_root_one_of else None):
                found.append(_describe(leaf, ()))
        for path, site, name, facet in facets_in(event):
            found.extend(self._facet_errors(path, site, name, facet))
        return list(dict.fromkeys(found))  # core and facet schemas can report the same miss

    def validate(self, event: Any) -> None:
        """Raise :class:`SpecViolation` listing every error's JSON path, or return None."""
        found = self.errors(event)
        if found:
            raise SpecViolation(found)

    # -- facets --

    def facet_errors(self, name: str, facet: Any, site: FacetSite | None = None) -> list[str]:
        """Errors of one facet, paths rooted at ``$.<name>`` (the spec's example layout).

        With ``site`` the facet is checked as it would be at that place in an event. Without
        it the facet must fit one of the places its name is standard for (``subset`` is an
        input or an output facet); an unknown name is held to ``BaseFacet``.
        """
        sites: list[FacetSite | None] = [site] if site else [s for (s, n) in self.facet_schemas if n == name]
        attempts = [self._facet_errors((name,), s, name, facet) for s in sites or [None]]
        return min(attempts, key=len)

    def validate_facet(self, name: str, facet: Any, site: FacetSite | None = None) -> None:
        """Raise :class:`SpecViolation` unless :meth:`facet_errors` finds nothing."""
        found = self.facet_errors(name, facet, site)
        if found:
            raise SpecViolation(found)

    def _facet_errors(self, path: tuple[str | int, ...], site: FacetSite | None, name: str, facet: Any) -> list[str]:
        return [f"{_json_path((*path, *where))}: {why}" for where, why in self._facet_issues(site, name, facet)]

    def _facet_issues(self, site: FacetSite | None, name: str, facet: Any) -> tuple[tuple[tuple[Any, ...], str], ...]:
        """``(path inside the facet, message)`` pairs; ``site=None`` means "only BaseFacet"."""
        # A stream repeats the same facets (a dataset's schema in every event of a run),
        # so results are cached by content: validating facets is most of the cost.
        try:
            key: _CacheKey | None = (site or "", name, orjson.dumps(facet, option=orjson.OPT_SORT_KEYS))
        except TypeError:  # not JSON data: validate, but do not cache
            key = None
        if key is not None and key in self._facet_cache:
            return self._facet_cache[key]
        if site is None:
            compiled = self._base_facet
        elif isinstance(facet, dict) and facet.get("_deleted") is True:
            compiled = self._site_bases[site]
        else:
            compiled = self._facets.get((site, name), self._site_bases[site])
        leaves = (leaf for error in compiled.iter_errors(facet) for leaf in _leaves(error))
        issues = tuple(dict.fromkeys((tuple(leaf.absolute_path), _message(leaf)) for leaf in leaves))
        if key is not None:
            if len(self._facet_cache) >= _FACET_CACHE_SIZE:
                self._facet_cache.clear()
            self._facet_cache[key] = issues
        return issues


def _event_kind(event: dict[str, Any]) -> str:
    """Which event type ``event`` is trying to be, judged by its shape."""
    if "run" in event:
        return "RunEvent"
    if "dataset" in event:
        return "DatasetEvent"
    return "JobEvent"


def facets_in(event: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], FacetSite, str, Any]]:
    """``(path, site, name, facet)`` for every facet at a place the core schema defines."""

    def facets_at(holder: Any, path: tuple[str | int, ...], key: str, site: FacetSite):
        facets = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(facets, dict):
            for name, facet in facets.items():
                yield (*path, key, name), site, name, facet

    yield from facets_at(event.get("run"), ("run",), "facets", "run")
    yield from facets_at(event.get("job"), ("job",), "facets", "job")
    yield from facets_at(event.get("dataset"), ("dataset",), "facets", "dataset")
    for group, own_key, own_site in (("inputs", "inputFacets", "input"), ("outputs", "outputFacets", "output")):
        datasets = event.get(group)
        if isinstance(datasets, list):
            for index, dataset in enumerate(datasets):
                yield from facets_at(dataset, (group, index), "facets", "dataset")
                yield from facets_at(dataset, (group, index), own_key, own_site)


@functools.cache
def validator() -> OpenLineageValidator:
    """The validator for the default spec folder, built once per process."""
    return OpenLineageValidator()
