"""The ``rewrite:`` settings of one collector: what to change in the events it receives.

:class:`~relay.stages.rewrite.Rewriter` applies them (the order of the steps, what
redaction catches and what the size limit keeps are in :mod:`relay.stages.rewrite`).
Validated once, when the configuration loads: a setting that could have no effect
(``shrink_order`` without ``max_event_bytes``, ``secret_query_params`` without
``redact_credentials``, ``map_dataset_namespaces`` without ``namespace_map``) is refused
rather than silently ignored: whoever wrote it expected something that would not happen.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator, model_validator

from relay.frozen import Frozen
from relay.stages.redact import DEFAULT_SECRET_QUERY_PARAMS
from relay.stages.route import glob_problem

#: Facets the size limit keeps unless ``shrink_order`` names them exactly: lineage and identity.
ESSENTIAL_FACETS = frozenset({"schema", "columnLineage", "parent", "dataSource", "jobType", "processing_engine"})


class NamespaceMapping(Frozen):
    """``from`` (an exact namespace or an fnmatch glob, case-sensitive) becomes ``to``. An
    exact namespace with an IPv6 host in brackets is text; in a glob, write ``[[]`` for a
    literal ``[``; any other ``[...]`` is a character class (see
    :func:`relay.stages.route.compile_glob`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    from_: str = Field(alias="from", min_length=1)
    to: str = Field(min_length=1)

    @field_validator("from_")
    @classmethod
    def _glob(cls, v: str) -> str:
        problem = glob_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class RewriteConfig(Frozen):
    """What to change in events for one collector. The default changes nothing."""

    #: Ordered; the first matching entry wins. Applies to job namespaces (also in ``parent``).
    namespace_map: tuple[NamespaceMapping, ...] = ()
    #: Also map dataset namespaces (inputs, outputs, DatasetEvent, ``columnLineage`` sources,
    #: ``symlinks`` identifiers, ``lineage`` datasets, ``lifecycleStateChange.previousIdentifier``).
    #: Job references (``parent``, ``jobDependencies``, ``lineage`` jobs) are mapped as the
    #: event's job always.
    map_dataset_namespaces: bool = False
    redact_credentials: bool = False
    #: Replaces the default list; names are case-insensitive.
    secret_query_params: tuple[str, ...] = DEFAULT_SECRET_QUERY_PARAMS
    #: Facet names (globs) removed from run, job, dataset, input and output facets.
    drop_facets: tuple[str, ...] = ()
    #: Keys (case-insensitive globs) whose values become "***" anywhere inside facets (an
    #: object's or a list's: each string and number inside); also ``{"name": <key>, "value":
    #: ...}`` pairs (the environmentVariables facet shape). Never a column's name (the keys of
    #: ``columnLineage.fields``, ``dataQualityMetrics.columnMetrics``, ``lineage.fields``).
    mask_keys: tuple[str, ...] = ()
    max_event_bytes: int | None = Field(None, ge=1024)
    #: Facet-name globs tried in order; within an entry the largest facets go first.
    #: ESSENTIAL_FACETS are only dropped when an entry is exactly their name.
    shrink_order: tuple[str, ...] = ("*",)

    @field_validator("secret_query_params", "drop_facets", "mask_keys", "shrink_order")
    @classmethod
    def _no_blank(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not item for item in v):
            raise ValueError("entries must be non-empty strings")
        return v

    @model_validator(mode="after")
    def _meaningful(self) -> RewriteConfig:
        if "shrink_order" in self.model_fields_set and self.max_event_bytes is None:
            raise ValueError("shrink_order only applies with max_event_bytes; set max_event_bytes or remove it")
        if "secret_query_params" in self.model_fields_set and not self.redact_credentials:
            raise ValueError("secret_query_params only applies with redact_credentials: true")
        if self.map_dataset_namespaces and not self.namespace_map:
            raise ValueError("map_dataset_namespaces needs namespace_map entries")
        return self
