"""The py4j callback object Spark calls on a streaming query's start, progress, idleness and
end (:class:`_QueryListener`): one per session, kept for its life and registered on its
``StreamingQueryManager`` by :mod:`producer.spark.session_listeners` for each
:class:`~producer.spark.streaming.StreamingLineage` that owns it in turn.

Each callback hands the Java event, as it is, to the :class:`~producer.spark.streaming.StreamingLineage`
that owns it; an ``Exception`` the owner raises is one log line (with its traceback), never
raised into the query. Once its owner detached it (``owner`` is None), a callback does nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.spark.streaming import StreamingLineage

log = logging.getLogger("producer.spark")


class _QueryListener:
    """``org.apache.spark.sql.streaming.PythonStreamingQueryListener`` via py4j: the Java
    event objects as they are (PySpark's own listener copies every field of every progress
    into Python, dozens of py4j calls per micro-batch)."""

    def __init__(self, owner: StreamingLineage) -> None:
        self.owner: StreamingLineage | None = owner

    def _call(self, method: str, jevent: Any) -> None:
        owner = self.owner
        if owner is None:
            return
        try:
            getattr(owner, method)(jevent)
        except Exception:  # noqa: BLE001 - never into the query
            log.exception("lineage: streaming listener failed in %s", method)

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Java interface
        self._call("on_started", jevent)

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self._call("on_progress", jevent)

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        self._call("on_idle", jevent)

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        self._call("on_terminated", jevent)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
