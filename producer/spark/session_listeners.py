"""The py4j callback objects of each Spark session, made once and kept while its SparkContext runs.

Spark may call a listener after capture unregistered it: a running streaming query works in a
clone of its session, which copied the session's execution listeners when the query started,
and Spark's listener bus delivers what it already took. py4j answers a call to an object no
longer in its pool "Object ID unknown" without reading the rest of the call; the lines left
over are read as commands, and the replies on that connection (the listener bus thread's) stop
matching its requests: every later callback on it is lost or garbled, for the session's life.

Guarantees:

* A session (per py4j gateway and JVM session) has one
  :class:`~producer.spark.execution_listener.QueryExecutionListener` and one streaming listener
  (:class:`~producer.spark.streaming_listener._QueryListener`), each with its one Java proxy,
  made at its first capture. They stay in py4j's pool while the session's SparkContext runs.
* Detaching (capture stops, the application ends) unregisters them from Spark (best effort: a
  clone keeps calling what it copied) and detaches their owner: a call then returns at once.
  Attaching again gives the same objects their new owner and registers the same proxies again,
  once: never two registrations of one listener.
* Bounded: one entry per session. The entries of sessions whose SparkContext stopped (its
  listener bus stopped, so nothing calls them any more) are dropped, and their objects let go
  of in py4j's pool, when an entry is made for another session.

Not guaranteed: two live sessions whose JVM identity hashes collide would share an entry.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from producer.spark.execution_listener import (
    QueryExecutionListener,
    java_proxy,
    register_listener,
    unregister_listener,
)
from producer.spark.streaming_listener import _QueryListener

log = logging.getLogger("producer.spark")


def session_key(spark: Any) -> int:
    """The JVM session's identity: PySpark can wrap one session in several Python objects,
    each with its own py4j handle (``SparkSession.getActiveSession()`` on another thread makes
    a new one), and capture must stay one per session (two would report every run twice)."""
    try:
        return int(spark.sparkContext._jvm.System.identityHashCode(spark._jsparkSession))
    except Exception:  # noqa: BLE001 - a session without a JVM view: its handle's identity
        return id(getattr(spark, "_jsparkSession", None))


class SessionListeners:
    """The two py4j listeners of one session and whether each is registered with Spark; get it
    with :func:`of_session`."""

    def __init__(self, gateway: Any, context: Any) -> None:
        self._gateway, self._context = gateway, context
        self._lock = threading.Lock()
        self.actions = QueryExecutionListener(None, gateway)
        self._actions_proxy: Any = None    # a Java array holding its one Java proxy
        self._actions_registered = False
        self.streams = _QueryListener(None)
        self._streams_wrapper: Any = None  # Spark's PythonStreamingQueryListenerWrapper around its proxy
        self._streams_registered = False

    @property
    def stopped(self) -> bool:
        """Whether the session's SparkContext stopped (PySpark clears ``_jsc`` once it has)."""
        return getattr(self._context, "_jsc", None) is None

    # -- the QueryExecutionListener ------------------------------------------------------------
    def attach_actions(self, owner: Any, jsession: Any) -> None:
        """``owner`` (a SparkLineage) gets the session's actions; raises when the listener cannot
        be registered (then it has no owner)."""
        with self._lock:
            self.actions.attach(owner)
            try:
                if self._actions_proxy is None:
                    self._actions_proxy = java_proxy(self._gateway, self.actions)
                if not self._actions_registered:
                    register_listener(jsession.listenerManager(), self._actions_proxy)
                    self._actions_registered = True
            except BaseException:
                self.actions.detach()
                raise

    def detach_actions(self, owner: Any, jsession: Any) -> None:
        """``owner`` gets no more actions (a no-op if another owner attached since); the listener
        is unregistered, or, when that fails (a stopped session), stays registered and idle."""
        with self._lock:
            if self.actions.owner is not owner:
                return
            self.actions.detach()
            if self._actions_registered:
                try:
                    unregister_listener(jsession.listenerManager(), self._actions_proxy)
                    self._actions_registered = False
                except Exception as err:  # noqa: BLE001 - the session may be stopped already
                    log.debug("lineage: could not unregister the listener: %s", err)

    # -- the StreamingQueryListener ------------------------------------------------------------
    def attach_streams(self, owner: Any, jsession: Any) -> None:
        """``owner`` (a StreamingLineage) gets the session's streaming queries' callbacks;
        raises when the listener cannot be registered (Spark before 3.4: then it has no owner)."""
        with self._lock:
            self.streams.owner = owner
            try:
                if self._streams_wrapper is None:
                    wrapper = self._gateway.jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
                    self._streams_wrapper = wrapper(self.streams)
                if not self._streams_registered:
                    jsession.streams().addListener(self._streams_wrapper)
                    self._streams_registered = True
            except BaseException:
                self.streams.owner = None
                raise

    def detach_streams(self, owner: Any, jsession: Any) -> None:
        with self._lock:
            if self.streams.owner is not owner:
                return
            self.streams.owner = None
            if self._streams_registered:
                try:
                    jsession.streams().removeListener(self._streams_wrapper)
                    self._streams_registered = False
                except Exception as err:  # noqa: BLE001 - the session may be stopped already
                    log.debug("lineage: could not remove the streaming listener: %s", err)

    def _forget(self) -> None:
        """Let py4j's pool go of both objects (only once the SparkContext stopped)."""
        pool = getattr(getattr(self._gateway, "gateway_property", None), "pool", None)
        if pool is None:
            return
        with pool.lock:
            for key in [k for k, v in pool.dict.items() if v is self.actions or v is self.streams]:
                del pool.dict[key]
        self._actions_proxy = self._streams_wrapper = None


_SESSIONS: dict[tuple[int, int], SessionListeners] = {}
_SESSIONS_LOCK = threading.Lock()


def of_session(spark: Any) -> SessionListeners:
    """The listeners of ``spark``'s session, made on first use."""
    gateway = spark.sparkContext._gateway
    key = (id(gateway), session_key(spark))
    with _SESSIONS_LOCK:
        entry = _SESSIONS.get(key)
        if entry is not None and entry._gateway is gateway and not entry.stopped:
            return entry
        for stale in [k for k, e in _SESSIONS.items() if e.stopped]:
            _SESSIONS.pop(stale)._forget()
        entry = _SESSIONS[key] = SessionListeners(gateway, spark.sparkContext)
        return entry
