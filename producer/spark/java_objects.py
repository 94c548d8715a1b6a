"""Java objects received over py4j, released once per action instead of one by one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# -- one release per action for the Java objects it made ---------------------------------
# Every Java object that crosses py4j is kept alive on the JVM's side until Python lets it
# go, which py4j does one object at a time: a "delete" round trip per object (measured: 86
# per action, more than the calls that made them). Inside ``released_together(gateway)``,
# the objects this thread receives are not finalised one by one; their ids are collected
# and removed from py4j's table in one call when the block ends. Other threads (the job's)
# are untouched.

_tracking = threading.local()
_PATCHED: list[bool] = []


def _install_tracking() -> None:
    """Wrap ``py4j.java_gateway.JavaObject.__init__`` once: inside a tracking block, a new
    object's finalizer is dropped (so py4j never deletes it alone) and its id kept."""
    if _PATCHED:
        return
    from py4j.java_gateway import JavaObject

    original = JavaObject.__init__

    def __init__(self: Any, target_id: str, gateway_client: Any) -> None:
        original(self, target_id, gateway_client)
        _take_over(gateway_client, target_id)

    JavaObject.__init__ = __init__
    _PATCHED.append(True)


def _take_over(client: Any, target_id: str) -> None:
    """Inside a tracking block: drop the object's py4j finalizer (its key as py4j builds
    it) and keep its id for the block's release."""
    ids = getattr(_tracking, "ids", None)
    if ids is None:
        return
    from py4j.finalizer import ThreadSafeFinalizer

    ThreadSafeFinalizer.remove_finalizer(f"{client.address}{client.port}{target_id}")
    ids.append(target_id)


def adopt(obj: Any) -> None:
    """Release ``obj`` (a Java object made before the block, e.g. a callback's argument)
    with the block's objects instead of on its own."""
    target_id = getattr(obj, "_target_id", None)
    client = getattr(obj, "_gateway_client", None)
    if target_id is not None and client is not None:
        _take_over(client, target_id)


@contextmanager
def untracked() -> Iterator[None]:
    """Objects made here are finalised by py4j as usual (for those kept across actions)."""
    ids = getattr(_tracking, "ids", None)
    _tracking.ids = None
    try:
        yield
    finally:
        _tracking.ids = ids


def compiled(gateway: Any, source: str, loader: Any = None) -> Any:
    """An instance of a class whose body is ``source`` (Java), compiled in the driver JVM with
    the Janino compiler Spark ships (no jar to install), its parent class loader ``loader``
    when given; kept by py4j across actions. Raises when it cannot be compiled."""
    with untracked():
        evaluator = gateway.jvm.org.codehaus.janino.ClassBodyEvaluator()
        if loader is not None:
            evaluator.setParentClassLoader(loader)
        evaluator.cook(source)
        cls = evaluator.getClazz()
        return cls.getDeclaredConstructor(gateway.new_array(gateway.jvm.java.lang.Class, 0)).newInstance(
            gateway.new_array(gateway.jvm.java.lang.Object, 0))


_REMOVER_SOURCE = """
public void removeAll(java.util.Set keys, String ids) {
    String[] each = ids.split(",");
    for (int i = 0; i < each.length; i++) keys.remove(each[i]);
}
"""


class _Bindings:
    """py4j's object table on the JVM's side and what removes many ids in one call."""

    def __init__(self, gateway: Any) -> None:
        with untracked():
            self.keys = gateway.java_gateway_server.getGateway().getBindings().keySet()
            self.tokenizer = gateway.jvm.java.util.StringTokenizer
            self.as_list = gateway.jvm.java.util.Collections.list
            try:  # one call per release; else three (a tokenizer and a list made each time)
                self.remover: Any = compiled(gateway, _REMOVER_SOURCE)
            except Exception:  # noqa: BLE001 - no Janino here: the tokenizer
                self.remover = None
        self.leftover: list[str] = []  # the last release's own tokenizer and list

    def release(self, ids: list[str]) -> None:
        ids = self.leftover + ids
        self.leftover = []
        if not ids:
            return
        if self.remover is not None:
            self.remover.removeAll(self.keys, ",".join(ids))
            return
        _tracking.ids = self.leftover  # the tokenizer and list made by this release go next time
        try:
            # py4j matches no varargs (Arrays.asList), hence a tokenizer, an Enumeration.
            self.keys.removeAll(self.as_list(self.tokenizer(",".join(ids), ",")))
        finally:
            _tracking.ids = None


_BINDINGS: dict[int, tuple[Any, _Bindings]] = {}


def per_gateway(cache: dict[int, tuple[Any, Any]], gateway: Any, build: Any) -> Any:
    """``build(gateway)``, made once per gateway. Keyed by identity: a py4j gateway answers
    any attribute, so nothing can be stored on it."""
    entry = cache.get(id(gateway))
    if entry is None or entry[0] is not gateway:
        entry = cache[id(gateway)] = (gateway, build(gateway))
    return entry[1]


@contextmanager
def released_together(gateway: Any) -> Iterator[None]:
    """See above. Nests (an inner block adds to the outer one). If the bulk release fails
    (another py4j), the ids are deleted one by one, as py4j would have."""
    if getattr(_tracking, "ids", None) is not None:
        yield
        return
    _install_tracking()
    ids: list[str] = []
    try:
        entry = per_gateway(_BINDINGS, gateway, _Bindings)
    except Exception:  # noqa: BLE001 - no bulk release here: py4j's own, object by object
        yield
        return
    _tracking.ids = ids
    try:
        yield
    finally:
        _tracking.ids = None
        try:
            entry.release(ids)
        except Exception:  # noqa: BLE001
            _BINDINGS.pop(id(gateway), None)
            client = gateway._gateway_client
            for target_id in ids + entry.leftover:
                client.garbage_collect_object(target_id)
