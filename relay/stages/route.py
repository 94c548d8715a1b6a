"""Decide which collectors an event goes to.

Each collector has a :class:`RouteConfig` of ``include`` and ``exclude`` rules. An event is
routed to the collector when (there are no include rules, or at least one include rule
matches) and no exclude rule matches. :class:`Router` answers that question for one
collector; it is pure, synchronous and cheap enough for the per-event hot path.

A rule matches when every field it gives matches (an absent field matches anything):

* ``job_namespace`` / ``job_name``: a glob (:mod:`fnmatch` syntax, case-sensitive, ``*``
  also crosses ``/`` and ``.``) on the event's job. A DatasetEvent has no job, so a rule
  naming a job field never matches one (with ``kinds`` leaving out run and job it is
  refused). Brackets holding an IPv6 host (``postgres://[fd00::1]:5432``) are text: such
  a pattern without ``*``/``?`` compares exactly, a glob around one is refused (write
  ``[[]`` for a literal ``[``); any other ``[...]`` is a character class.
* ``dataset_namespace``: a glob on the namespaces of the input and output datasets. For a
  DatasetEvent (its dataset) or a JobEvent it is judged on the event itself. For a RunEvent
  it is a property of the run: it matches once the run has named a matching dataset in any
  event (a START often names none, its COMPLETE the outputs); the relay routes such runs
  whole (:mod:`relay.stages.run_route`, with :meth:`Router.learn` and :meth:`Router.judge`).
  :meth:`Router.accepts` judges one event alone (replay, redrive).
* ``event_types``: the RunEvent ``eventType`` is one of these (``START``, ``COMPLETE``...);
  an event without an ``eventType`` (every DatasetEvent and JobEvent) never matches.
* ``kinds``: the event is one of these kinds (``run``, ``dataset``, ``job``).

Rules see the event as its producer sent it, before any per-collector rewrite.

Before any rule, an event of a kind the collector does not take (its ``event_kinds``,
which its collector kind defaults) is refused with :data:`UNSUPPORTED_EVENT_KIND`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any, Literal

import orjson
from pydantic import field_validator, model_validator

from relay.events import EVENT_TYPES, LineageEvent
from relay.frozen import Frozen

#: The reason an event is not forwarded to a collector whose routes exclude it
#: (a metric label; the event is not dead-lettered, it was simply not meant for it).
NOT_ROUTED = "not_routed"
#: The reason an event is not forwarded to a collector that does not take its kind (e.g.
#: a DatasetEvent to a collector that only takes RunEvents; see ``event_kinds``).
UNSUPPORTED_EVENT_KIND = "unsupported_event_kind"
#: :meth:`Router.judge`: not routed yet, but routed once the event's run names a dataset
#: that an include rule's ``dataset_namespace`` matches (an event without a run: not routed).
UNDECIDED = "undecided"
_ALL_KINDS = frozenset({"run", "dataset", "job"})

_GLOB_MAGIC = frozenset("*?[")


def kinds_list(v: Any, if_empty: str) -> Any:
    """An event-kinds setting as written (``run`` or ``[run, job]``), before validation: a
    single kind becomes a list of one; an empty list is refused with ``if_empty``."""
    if isinstance(v, str):
        v = (v,)
    if isinstance(v, (list, tuple)) and not v:
        raise ValueError(if_empty)
    return v


class RouteRule(Frozen):
    """One rule; see the module docstring for how its fields combine."""

    job_namespace: str | None = None
    job_name: str | None = None
    dataset_namespace: str | None = None
    event_types: tuple[str, ...] | None = None
    kinds: tuple[Literal["run", "dataset", "job"], ...] | None = None

    @field_validator("job_namespace", "job_name", "dataset_namespace")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("must be a non-empty glob pattern such as 'spark-*' (or leave the key out)")
        problem = glob_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("event_types", mode="before")
    @classmethod
    def _event_types(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = (v,)
        if isinstance(v, (list, tuple)):
            out = []
            for item in v:
                name = item.upper() if isinstance(item, str) else item
                if name not in EVENT_TYPES:
                    raise ValueError(f"entry {len(out) + 1} is not an event type; use some of "
                                     f"{', '.join(sorted(EVENT_TYPES))}")
                out.append(name)
            if not out:
                raise ValueError("must list at least one event type (or leave the key out)")
            return tuple(out)
        return v

    @field_validator("kinds", mode="before")
    @classmethod
    def _kinds(cls, v: Any) -> Any:
        return kinds_list(v, "must list at least one of run, dataset, job (or leave the key out)")

    @model_validator(mode="after")
    def _not_empty(self) -> RouteRule:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError(
                "a rule needs at least one of job_namespace, job_name, dataset_namespace, event_types, kinds"
            )
        if self.event_types is not None and self.kinds is not None and "run" not in self.kinds:
            raise ValueError(
                f"event_types: only RunEvents have an eventType, and kinds names only {', '.join(self.kinds)}, "
                "so this rule never matches; fix: add run to kinds, or remove event_types (or kinds)")
        if self.kinds is not None and not {"run", "job"} & set(self.kinds):
            for key in ("job_namespace", "job_name"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key}: only RunEvents and JobEvents have a job, and kinds names only "
                        f"{', '.join(self.kinds)}, so this rule never matches; fix: add run (or job) to kinds, "
                        f"or remove {key} (or kinds)")
        return self


class RouteConfig(Frozen):
    """``include``/``exclude`` rules for one collector; the default routes everything."""

    include: tuple[RouteRule, ...] = ()
    exclude: tuple[RouteRule, ...] = ()


def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A case-sensitive fnmatch predicate, compiled once; ``*`` alone matches everything.

    Each pattern has one meaning, never two. Brackets holding an IPv6 host
    (:func:`ipv6_host`: ``postgres://[fd00::1]:5432``, per the naming spec) are text: a
    pattern with one and without ``*``/``?`` is an exact comparison (one with ``*``, ``?``
    or another class too is refused by the config, :func:`glob_problem`). Any other
    ``[...]`` is an fnmatch character class (``db[12]`` matches ``db1`` and ``db2``, not the
    text ``db[12]``); ``[[]`` is a literal ``[``. A pattern without ``*?[`` is an exact comparison."""
    if pattern == "*":
        return lambda _value: True
    if _GLOB_MAGIC.isdisjoint(pattern) or ("*" not in pattern and "?" not in pattern and ipv6_host(pattern)):
        return pattern.__eq__
    match = re.compile(fnmatch.translate(pattern)).match
    return lambda value: match(value) is not None


#: An fnmatch character class: ``[``, an optional ``!``, a first ``]`` taken as a member,
#: up to the closing ``]``.
_CLASS = re.compile(r"\[!?\]?[^\]]*\]")
#: The inside of brackets around an IPv6 host: hex digits, ``.`` (an embedded IPv4
#: address), at least two ``:`` (every IPv6 address has them; a class never needs ``:``
#: twice), an optional ``%zone``.
_IPV6 = re.compile(r"(?=[^:]*:[^:]*:)[0-9A-Fa-f:.]+(%[\w.-]+)?")


def ipv6_host(pattern: str) -> str | None:
    """The first ``[...]`` of ``pattern`` (as fnmatch reads its classes) that holds an IPv6
    host, such as ``[fd00::1]``, or None."""
    for found in _CLASS.finditer(pattern):
        if _IPV6.fullmatch(found.group()[1:-1]):
            return found.group()
    return None


def glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` (a namespace glob) cannot mean what it says, or None: an IPv6 host in
    brackets (``[fd00::1]``) together with a glob's ``*`` or ``?`` (``postgres://[fd00::1]:*``)
    or with another ``[...]`` class (``postgres://[fd00::1]:543[12]``). Either way the pattern
    would be text and a glob at once: fnmatch would read the host as one character (f, d, 0,
    : or 1), matching nothing the user meant, silently. A pattern whose only brackets hold
    IPv6 hosts is fine: it compares as text (:func:`compile_glob`); so is ``[[]``, a literal
    ``[``, and any other class (``[!:]``, ``[12]``) without an IPv6 host."""
    text = ipv6_host(pattern)
    if text is None:
        return None
    others = [found.group() for found in _CLASS.finditer(pattern) if not _IPV6.fullmatch(found.group()[1:-1])]
    if others:
        besides = f"the character class {others[0]}"
    elif "*" in pattern or "?" in pattern:
        besides = "* or ?"
    else:
        return None
    return (f"{text} is read as a character class (one character of {text[1:-1]}), not as the text "
            f"{text}, since the pattern also has {besides}; write [[] for a literal [ "
            f"(such as {'[[]' + text[1:]})")


class _CompiledRule:
    __slots__ = ("kinds", "event_types", "job_namespace", "job_name", "dataset_namespace", "bit")

    def __init__(self, rule: RouteRule, bit: int = 0) -> None:
        #: This rule's bit in a run's ``touched`` mask (see Router.learn); 0 without a
        #: ``dataset_namespace``.
        self.bit = bit
        self.kinds = frozenset(rule.kinds) if rule.kinds is not None else None
        self.event_types = frozenset(rule.event_types) if rule.event_types is not None else None
        self.job_namespace = compile_glob(rule.job_namespace) if rule.job_namespace is not None else None
        self.job_name = compile_glob(rule.job_name) if rule.job_name is not None else None
        self.dataset_namespace = (
            compile_glob(rule.dataset_namespace) if rule.dataset_namespace is not None else None
        )

    def matches_job(self, event: LineageEvent) -> bool:
        """Every field except ``dataset_namespace`` (the only one that may need a parse)."""
        if self.event_types is not None and event.event_type not in self.event_types:
            return False
        return self.matches_run(event)

    def matches_run(self, event: LineageEvent) -> bool:
        """The fields every event of a run shares: ``kinds``, ``job_namespace``, ``job_name``."""
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if self.job_namespace is not None:
            if event.job_namespace is None or not self.job_namespace(event.job_namespace):
                return False
        if self.job_name is not None:
            if event.job_name is None or not self.job_name(event.job_name):
                return False
        return True


class Router:
    """Routing decision for one collector, built once from its :class:`RouteConfig`.

    Guarantees: :meth:`accepts` never raises for an event ``decode_record`` produced, does
    no I/O, and reads the event body only when a rule that got as far as its
    ``dataset_namespace`` needs the dataset namespaces and ``event.doc`` is ``None``
    (then ``event.body`` is parsed once per call). Patterns are compiled here, not per event.
    """

    __slots__ = ("_include", "_exclude", "_kinds", "_by_dataset")

    def __init__(self, config: RouteConfig, event_kinds: tuple[str, ...] | None = None) -> None:
        rules = (*config.include, *config.exclude)
        bits = [1 << i if rule.dataset_namespace is not None else 0 for i, rule in enumerate(rules)]
        compiled = [_CompiledRule(rule, bit) for rule, bit in zip(rules, bits)]
        self._include = tuple(compiled[:len(config.include)])
        self._exclude = tuple(compiled[len(config.include):])
        #: The rules naming a dataset_namespace, include and exclude (see learn).
        self._by_dataset = tuple(rule for rule in compiled if rule.bit)
        kinds = frozenset(event_kinds) if event_kinds is not None else _ALL_KINDS
        #: The event kinds the collector takes, or None when it takes them all.
        self._kinds = None if kinds >= _ALL_KINDS else kinds

    @property
    def routes_everything(self) -> bool:
        """True when there are no rules and every event kind is taken: the caller may skip
        :meth:`accepts`."""
        return not self._include and not self._exclude and self._kinds is None

    @property
    def by_run(self) -> bool:
        """True when a rule names ``dataset_namespace``: RunEvents are then routed by run
        (:mod:`relay.stages.run_route`), with :meth:`learn` and :meth:`judge`."""
        return bool(self._by_dataset)

    def learn(self, event: LineageEvent, touched: int) -> int:
        """``touched`` (what the earlier events of ``event``'s run named: one bit per rule
        with a ``dataset_namespace``, 0 at first) with what ``event`` names: the bit of each
        rule whose job fields and kinds match the event (every event of a run shares them)
        and whose pattern matches one of its dataset namespaces. Whatever the event type:
        a run that wrote to ``s3://warehouse`` in a RUNNING event touches it. Reads the
        datasets only for rules whose bit is not set yet and whose job fields match."""
        namespaces: list[str] | None = None
        for rule in self._by_dataset:
            if not touched & rule.bit and rule.matches_run(event):
                if namespaces is None:
                    namespaces = dataset_namespaces(event)
                if any(map(rule.dataset_namespace, namespaces)):
                    touched |= rule.bit
        return touched

    def judge(self, event: LineageEvent, touched: int) -> str | None:
        """:meth:`accepts` for an event of a run whose events named what ``touched`` says
        (see :meth:`learn`, which must have seen ``event`` itself): a rule's
        ``dataset_namespace`` matches when its bit is set. Returns :data:`UNDECIDED` when
        no include rule matches yet but one would once the run sets its bit (its other
        fields match the event) and no exclude rule matches. Bits are only ever added: an
        event routed (or excluded) stays so, an undecided one may be routed or excluded
        later."""
        if self._kinds is not None and event.kind not in self._kinds:
            return UNSUPPORTED_EVENT_KIND
        verdict: str | None = None
        if self._include:
            verdict = NOT_ROUTED
            for rule in self._include:
                if rule.matches_job(event):
                    if not rule.bit or touched & rule.bit:
                        verdict = None
                        break
                    verdict = UNDECIDED
            if verdict is NOT_ROUTED:
                return verdict
        for rule in self._exclude:
            if (not rule.bit or touched & rule.bit) and rule.matches_job(event):
                return NOT_ROUTED
        return verdict

    def may_route(self, event: LineageEvent) -> bool:
        """Whether ``event`` is routed, or may have been: it is no terminal and its run may
        name a dataset an include rule wants (:data:`UNDECIDED` by what the event names
        alone; a terminal ends its run's hold undecided). Pure."""
        verdict = self.judge(event, self.learn(event, 0))
        return verdict is None or (verdict is UNDECIDED and event.run_id is not None and not event.is_terminal)

    def accepts(self, event: LineageEvent) -> str | None:
        """``None`` when ``event`` is routed to this collector, else the reason:
        ``unsupported_event_kind`` (the collector does not take its kind) or ``not_routed``.
        Judges ``dataset_namespace`` on the event alone (as for DatasetEvents and JobEvents;
        a RunEvent's run is judged by :mod:`relay.stages.run_route` where the relay routes)."""
        if self._kinds is not None and event.kind not in self._kinds:
            return UNSUPPORTED_EVENT_KIND
        namespaces: list[str] | None = None
        if self._include:
            for rule in self._include:
                if rule.matches_job(event):
                    if rule.dataset_namespace is None:
                        break
                    if namespaces is None:
                        namespaces = dataset_namespaces(event)
                    if any(map(rule.dataset_namespace, namespaces)):
                        break
            else:
                return NOT_ROUTED
        for rule in self._exclude:
            if rule.matches_job(event):
                if rule.dataset_namespace is None:
                    return NOT_ROUTED
                if namespaces is None:
                    namespaces = dataset_namespaces(event)
                if any(map(rule.dataset_namespace, namespaces)):
                    return NOT_ROUTED
        return None


def dataset_namespaces(event: LineageEvent) -> list[str]:
    """Namespaces of the event's input and output datasets, or of a DatasetEvent's dataset.

    Reads ``event.doc``, or parses ``event.body`` when the pipeline has dropped the parsed
    tree. Entries that are not objects with a string ``namespace`` are skipped.
    """
    doc = event.doc
    if doc is None:
        try:
            doc = orjson.loads(event.body)
        except orjson.JSONDecodeError:
            return []  # decode_record accepted the body, so this is not expected
        if not isinstance(doc, dict):
            return []
    found: list[str] = []
    dataset = doc.get("dataset")
    if isinstance(dataset, dict):
        namespace = dataset.get("namespace")
        if isinstance(namespace, str):
            found.append(namespace)
    for group in ("inputs", "outputs"):
        datasets = doc.get(group)
        if isinstance(datasets, list):
            for item in datasets:
                if isinstance(item, dict):
                    namespace = item.get("namespace")
                    if isinstance(namespace, str):
                        found.append(namespace)
    return found


def start_router(config: RouteConfig, event_kinds: tuple[str, ...] | None = None) -> Router | None:
    """The route with ``event_types`` taken out: which events it would route but for their
    event type. A START that this router may route (:meth:`Router.may_route`) and the
    collector's route leaves out is left out by its type alone (``event_types: [COMPLETE]``,
    OpenMetadata's), so it still begins its run for the ordering; one it does not route is
    left out with its whole run (another job namespace), which must not be tracked. None
    when no rule names ``event_types`` (every START left out is its whole run's)."""
    if all(rule.event_types is None for rule in (*config.include, *config.exclude)):
        return None
    include: list[RouteRule] = []
    for rule in config.include:
        rest = rule.model_copy(update={"event_types": None})
        if all(getattr(rest, name) is None for name in RouteRule.model_fields):
            include = []  # a rule of event_types alone: any event but for its type
            break
        include.append(rest)
    # An exclude rule naming event_types excludes events by their type (with its other
    # fields): it never leaves a START out by anything but its type.
    exclude = tuple(rule for rule in config.exclude if rule.event_types is None)
    return Router(RouteConfig.model_construct(include=tuple(include), exclude=exclude), event_kinds)
