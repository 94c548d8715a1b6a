"""The py4j ``QueryExecutionListener`` of a :class:`~producer.spark.listener.SparkLineage`,
and its registration with the session's ``ExecutionListenerManager``.

Guarantees:

* Nothing here raises into Spark: a callback that fails becomes a log line.
* A listener passes each finished action to its owner's ``on_action`` (on Spark's
  listener-bus thread), except a read-only action when read-only actions are off (decided
  from the action's name, before any py4j call) and a failed action whose statement never
  analysed (nothing to report). The Java objects a callback receives, and those the
  capture makes on its thread, are released together when it returns, in one py4j call
  (:func:`producer.spark.java_objects.released_together`).
* Without an owner (before :meth:`QueryExecutionListener.attach`, after
  :meth:`~QueryExecutionListener.detach`) a callback returns at once, whether or not the listener
  is registered: a streaming query's clone of the session keeps calling the listener it copied.
  The object stays in py4j's pool for the session's life (:mod:`producer.spark.session_listeners`).
* :func:`unregister_listener` removes exactly the Java proxy that :func:`java_proxy` made and
  :func:`register_listener` registered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from producer.spark import java_objects

if TYPE_CHECKING:
    from producer.spark.listener import SparkLineage

log = logging.getLogger("producer.spark")

# What Spark calls a statement that failed analysis (its QueryExecution has no analysed plan).
_ANALYSIS_FAILURE = "analyze"
# Names Spark gives Dataset actions that only read: with read-only actions off, these are
# dropped before a single py4j call (any other name costs one class lookup, ``jvm.command_of``).
_READ_FUNCS = frozenset({"collect", "collectToPython", "collectAsArrowToPython", "collectAsList", "count",
                         "head", "tail", "toPandas", "foreach", "foreachPartition", "toLocalIterator"})


def _never_analysed(gateway: Any, func: str, qe: Any, exception: Any) -> bool:
    """Whether a failed action has no analysed plan (its statement never analysed: a missing
    table, a bad column), so there is nothing to report. ``qe.analyzed()`` would throw the
    job's AnalysisException again, and PySpark logs every AnalysisException it converts at
    ERROR (the SQLQueryContextLogger): the job's error twice. Spark names such a failure
    ``analyze``; for other AnalysisExceptions the plan is asked by reflection, whose
    InvocationTargetException PySpark passes through unlogged."""
    if func == _ANALYSIS_FAILURE:
        return True
    from py4j.java_gateway import is_instance_of

    if not is_instance_of(gateway, exception, "org.apache.spark.sql.AnalysisException"):
        return False
    no_classes = gateway.new_array(gateway.jvm.java.lang.Class, 0)
    try:
        qe.getClass().getMethod("analyzed", no_classes).invoke(qe, gateway.new_array(gateway.jvm.java.lang.Object, 0))
    except Exception:  # noqa: BLE001 - the analysis failure itself
        return True
    return False


def _listener_method(manager: Any, name: str) -> Any:
    for method in manager.getClass().getMethods():
        if method.getName() == name and method.getParameterCount() == 1:
            return method
    raise LookupError(f"ExecutionListenerManager.{name}(QueryExecutionListener) not found")


def java_proxy(gateway: Any, listener: Any) -> Any:
    """A Java array holding ``listener``'s one Java proxy, for :func:`register_listener` and
    :func:`unregister_listener`.

    py4j makes a new Java proxy each time a Python object is passed to Java, so
    ``manager.unregister(listener)`` would look for a proxy that was never registered and
    leave the listener in place (every enable/disable cycle would then add one). The proxy
    is made once, kept in a Java array, and register/unregister are called by reflection
    with that array as their arguments, so it never comes back to Python."""
    proxies = gateway.jvm.java.util.ArrayList()
    proxies.add(listener)  # the one Java proxy
    return proxies.toArray()


def register_listener(manager: Any, proxy: Any) -> None:
    """Register the listener ``proxy`` (from :func:`java_proxy`) holds."""
    _listener_method(manager, "register").invoke(manager, proxy)


def unregister_listener(manager: Any, proxy: Any) -> None:
    """Unregister it. py4j's pool keeps the Python object: Java may still call it."""
    _listener_method(manager, "unregister").invoke(manager, proxy)


class QueryExecutionListener:
    """``org.apache.spark.sql.util.QueryExecutionListener`` implemented in Python via py4j."""

    def __init__(self, owner: SparkLineage | None, gateway: Any) -> None:
        self._owner: SparkLineage | None = owner
        self._gateway = gateway

    @property
    def owner(self) -> SparkLineage | None:
        return self._owner

    def attach(self, owner: SparkLineage) -> None:
        self._owner = owner

    def detach(self) -> None:
        self._owner = None

    # java.lang.Object's methods: py4j asks the Python side for them. Spark's listener list
    # compares the listener being removed with each registered one: without ``equals`` that
    # failed whenever another py4j listener was registered before ours (a job's own), and
    # ours stayed registered (detached, still called by py4j) at every disable_lineage.
    def equals(self, other: Any) -> bool:
        return other is self

    def hashCode(self) -> int:  # noqa: N802 - Java's name
        return id(self) & 0x7FFFFFFF

    def toString(self) -> str:  # noqa: N802 - Java's name
        return "lineage-relay QueryExecutionListener"

    def _owner_for(self, func_name: str) -> SparkLineage | None:
        """The lineage to tell of action ``func_name``: None once detached, or for a read-only
        action (``collect``, ``count``...) when those are not reported."""
        owner = self._owner
        if owner is None or (func_name in _READ_FUNCS and not owner.read_only_actions):
            return None
        return owner

    def onSuccess(self, func_name: str, qe: Any, duration_ns: int) -> None:  # noqa: N802 - Java interface
        if (owner := self._owner_for(func_name)) is None:
            return
        try:
            with java_objects.released_together(self._gateway):
                java_objects.adopt(qe)
                owner.on_action(self._gateway, func_name, qe, duration_ns, None)
        except Exception:  # noqa: BLE001
            log.exception("lineage: listener failed")

    def onFailure(self, func_name: str, qe: Any, exception: Any) -> None:  # noqa: N802 - Java interface
        if (owner := self._owner_for(func_name)) is None:
            return
        try:
            with java_objects.released_together(self._gateway):
                java_objects.adopt(qe)
                java_objects.adopt(exception)
                if _never_analysed(self._gateway, func_name, qe, exception):
                    log.debug("lineage: action %r failed before its plan was analysed; nothing to report",
                              func_name)
                    return
                owner.on_action(self._gateway, func_name, qe, None, exception)
        except Exception:  # noqa: BLE001
            log.exception("lineage: listener failed")

    class Java:
        implements = ["org.apache.spark.sql.util.QueryExecutionListener"]
