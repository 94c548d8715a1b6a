"""``fork()`` and the producer (used by :mod:`producer.kafka`).

A child made by ``fork()`` (``multiprocessing``'s default start method on Linux before
Python 3.14, ``os.fork()``) inherits the producer object but not its threads: neither the
sender thread nor librdkafka's. Records given to the inherited instance would sit in
memory for ever, and its ``flush()`` would return at once with them pending: lost without
a word. So, in the child, every live producer is reset to fresh state by the fork hook
and started (a new librdkafka instance, a new sender thread, its own journal) on the
child's first ``emit``: a worker that emits nothing opens no connection. The parent keeps
sending what it had queued and keeps its journals, the one it adopted from a dead process
included; the child closes its copies of their file descriptors (and of any journal
``LOCK`` the parent's sender was just opening), so a child that outlives a crashed parent,
or a parent that released an adopted journal, does not keep the journal from being adopted.

A ``multiprocessing`` child (fork or forkserver) ends with ``os._exit``, which skips
``atexit``: its producers -- inherited and started, or built in the child -- are closed by
a ``multiprocessing`` finalizer instead, which that exit runs. At a forked child's exit,
Kafka gets :data:`_FIRST_ANSWER_S` to acknowledge something if it has acknowledged nothing
in the child yet, and none if it is known down: otherwise the records go to the child's
journal at once (the next producer on the journal directory sends them), so a pool of
short-lived workers does not wait ``close_timeout_s`` per worker during an outage. Once
Kafka has acknowledged something, the exit flushes for ``close_timeout_s`` as usual.

A thread of the parent inside ``getaddrinfo()`` at the fork (librdkafka resolving a broker
while it reconnects, or any other thread resolving a name) holds a glibc lock that no
fork handler releases (``__check_pf``'s, which every ``AI_ADDRCONFIG`` lookup takes, as
librdkafka's do): librdkafka's resolutions in the child then wait for ever, and so do its
close, purge and destroy. Before a process's first librdkafka instance,
:func:`resolver_usable` tries one resolution that takes that lock (numeric), for up to
:data:`_PROBE_S`; if it does not come back, the process's producers stay in journal mode
(``resolver_locked_at_fork``) with :class:`NoKafka` in librdkafka's place (their records
wait in the journal for the next producer on the journal directory), until the probe
answers after all (a process too loaded to answer in time: :func:`resolver_answered`).

A lock a thread of the parent held at the fork stays held in the child for ever: the
fork hook gives every producer the process built (closed and disabled ones too) new
locks, so a child's ``stats``, ``emit()`` or ``close()`` never waits for one; a close the
parent had deferred (:mod:`producer.deferred_close`) is the parent's to finish, and so is
one whose sender the parent's close() gave up on (:mod:`producer.closing`): the child's
exit never waits for a thread of the parent.

The producer's threads are never inside a log handler at the fork (:mod:`producer.log_gate`):
a handler's stream lock held there would stop the child's first log line for ever.

A librdkafka instance (a ``confluent_kafka`` client) the parent had left to its garbage
collector at the fork -- one in a reference cycle, the application's or a producer's --
must never be freed in the child: ``rd_kafka_destroy()`` joins librdkafka's main thread,
which stayed in the parent, through its thread descriptor, which sits on that thread's
stack; glibc reclaims the parent's thread stacks in the child and unmaps them once a thread
of the child ends (its stack cache cut back to 40 MiB): the child crashed (SIGSEGV) or, the
stack reused by a thread of the child, waited for that thread for ever. So in a process that
built a producer, the fork hook freezes the garbage collector's view of what the child
inherited (``gc.freeze()``, as Python's documentation recommends around ``fork()`` to keep
pages shared): the child's collector never visits, frees or finalizes an object of the
parent's; what the child allocates is collected as usual. An inherited cycle the child lets
go of stays in memory (it was in the parent's already); automatic collection is paused from
just before the fork until then, and resumed as it was. A child that calls ``gc.unfreeze()``
takes that risk back. The instances the producer itself inherited are kept referenced
(``_inherited``), so that nothing frees them by reference counting either.

A child killed (``Pool.terminate()``, which leaving a ``with Pool()`` block calls) loses
what it had not delivered, as any killed process does.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from producer.replacement import _DOWN_GRACE_S

#: In a forked child: what each producer held in the parent (its librdkafka instance,
#: journals, queues, locks). Kept referenced, never closed, used or freed: librdkafka's
#: destroy would wait for threads the child does not have, the journals are the parent's,
#: and freeing the parent's queues would write to every copy-on-write page they sit on.
_inherited: list[dict[str, Any]] = []
_exit_registered = False
_in_forked_child = False
#: A forked child's exit close: how long Kafka gets to acknowledge its first record in
#: this child before the child journals what it holds. A healthy broker takes ~0.5 s
#: (connection, producer id, linger), more over TLS to a distant cluster; what a child
#: journals waits for the next producer on the journal directory, so not too short either.
_FIRST_ANSWER_S = _DOWN_GRACE_S
#: How long a process's resolver probe may take (a netlink query: well under 1 ms).
_PROBE_S = 1.0
#: This process's resolver probe: set when it answered (None: not started); reset at fork.
_probe: threading.Event | None = None
_probe_deadline = 0.0


#: The forks under way that paused automatic garbage collection, by forking thread: whether it
#: is to be on again after them (it was before the first of them). Two threads may fork at once
#: (a "before" hook may wait: producer.log_gate): the last to finish turns it back on.
_paused: dict[int, bool] = {}


def pause_gc_for_fork(every: Iterable[Any]) -> None:
    """Before a fork (the parent): in a process that built a producer, no automatic garbage
    collection until the child froze what it inherited (:func:`freeze_inherited_in_child`)
    -- none in the child's first moments, before that hook runs -- nor, in the parent,
    until the fork returned. O(1)."""
    if every:
        _paused[threading.get_ident()] = gc.isenabled() or any(_paused.values())
        gc.disable()


def resume_gc_after_fork() -> None:
    """After a fork, in the parent: automatic collection as it was, once no fork pauses it."""
    if _paused.pop(threading.get_ident(), False) and not _paused:
        gc.enable()


def freeze_inherited_in_child() -> None:
    """After a fork, in the child (before the producer's other hooks): every object inherited
    goes to the collector's permanent generation, never visited, freed or finalized by this
    process's collector (module docstring); then automatic collection as in the parent."""
    if threading.get_ident() not in _paused:
        return   # the parent had no producer
    collecting = _paused.pop(threading.get_ident())
    _paused.clear()   # other threads' forks are the parent's
    gc.freeze()
    if collecting:
        gc.enable()


def reset_in_forked_children(live: Iterable[Any], close_all: Callable[[], None],
                             every: Iterable[Any] = (), unfinished: set[Any] | None = None) -> None:
    """The fork hook, in the child. It only builds locks and containers and closes fds: a
    lock a parent thread held at the fork would never be released in the child, so none is
    taken -- the producer's ``_fork_lock`` included: a producer still being started by a
    thread of the parent (itself a forked child) is reset like any other. ``every``: all the
    producers built (closed and disabled ones too): their locks are new ones as well, so
    their ``stats``, ``emit()`` (dropped) and ``close()`` do not wait for a parent thread.
    ``unfinished``: the producers whose close gave up on their sender (:mod:`producer.closing`),
    emptied: the child's exit is not to wait for those senders, threads of the parent."""
    global _exit_registered, _close_all, _in_forked_child, _probe
    _exit_registered = False
    _in_forked_child = True
    _probe = None
    _close_all = close_all
    for producer in list(every):
        _renew_locks(producer)
    for producer in list(live):
        if getattr(producer, "_forked", None) is None:
            continue
        if producer._closed:
            if not producer._stopped:   # a close deferred in the parent (producer.deferred_close)
                _inherited.append(dict(vars(producer)))
                producer._stopped = True   # nothing of it is the child's to finish
                producer._deferred = None  # no interrupted emit() of the parent's goes on here
            continue
        _inherited.append(dict(vars(producer)))
        # The journal a dead process left that the parent is sending (producer.replay) too:
        # the child must neither keep it locked nor send it.
        for journal in [*producer._journals, producer._own, producer._aside, producer._adopted]:
            if journal is not None:
                _close_inherited_fds(journal)
        _close_inherited_locks(producer.config.journal_path)
        kafka_down = producer._kafka_down   # the parent's news of an outage holds for the child
        producer._init_sender(producer.config.queue_max_events)
        producer._kafka_down = kafka_down
        producer._journals = []
        producer._fork_lock = threading.RLock()   # re-entrant: see start_in_forked_child
        producer._forked = True
        producer._closing = False
    if unfinished:
        _inherited.extend(dict(vars(producer)) for producer in unfinished)   # never freed here
        unfinished.clear()


def _renew_locks(producer: Any) -> None:
    # A parent thread may have held any of them at the fork (emit(), stats, the sender).
    # The old objects stay where a frame of this thread may still release them.
    state = vars(producer)
    for name in ("_lock", "_count_lock"):
        if name in state:
            state[name] = threading.RLock()
    if "_space" in state:
        state["_space"] = threading.Condition(state["_lock"])
    if "_progress" in state:
        state["_progress"] = threading.Condition()
    if "_emitting" in state:
        state["_emitting"] = {}   # the parent's threads are not this process's


def _close_inherited_fds(journal: Any) -> None:
    # os.close only: flock(LOCK_UN) would release the lock the parent still holds (a flock
    # belongs to the open file, shared by both processes), and the parent's writer must not
    # be fsync-ed or written from here. The journal objects stay untouched in _inherited.
    for fd in (journal._lock_fd, journal._writer):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    # The reader's file is left open: it holds no lock, and closing its file object would
    # take its buffer's lock, which the parent's sender may have held at the fork (a hang).


def _close_inherited_locks(journal_dir: Any) -> None:
    # A LOCK the parent's sender had opened but not yet handed to a journal object at the fork
    # (adopting an orphan, creating its own journal) is in no list above: any descriptor on a
    # journal's LOCK (<journal_dir>/<id>/LOCK, nothing deeper) is the parent's, the child
    # having made none yet. Linux's /proc only.
    try:
        root = os.path.realpath(journal_dir)
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if os.path.basename(target) in ("LOCK", "LOCK.new") and \
                    os.path.dirname(os.path.dirname(target)) == root:
                os.close(int(fd))
        except OSError:
            pass


def start_in_forked_child(producer: Any) -> None:
    """On a forked child's first emit: a new librdkafka instance and sender thread. A signal
    handler that interrupts the start (the resolver probe may take up to :data:`_PROBE_S`)
    never gets here: its emit() is held for the interrupted one, and its close() is
    deferred until that returns (:mod:`producer.deferred_close`)."""
    with producer._fork_lock:
        if not producer._forked:
            return
        producer._producer = producer._new_producer()
        producer._start_sender()
        producer._forked = False
    _close_at_multiprocessing_exit()


def resolver_usable() -> bool:
    """Whether librdkafka can resolve names in this process (module docstring): whether one
    resolution taking glibc's interface lock comes back within :data:`_PROBE_S` of this
    process's first call (later calls wait for what is left of it). The probe runs on a
    thread of its own: if the lock is held, that daemon thread waits for ever."""
    global _probe, _probe_deadline
    probe = _probe
    if probe is None:
        _probe = probe = threading.Event()
        _probe_deadline = time.monotonic() + _PROBE_S
        threading.Thread(target=_resolve_once, args=(probe,), name="lineage-producer-resolver-probe",
                         daemon=True).start()
    return probe.wait(max(0.0, _probe_deadline - time.monotonic()))


def resolver_answered() -> bool:
    """Non-blocking: the probe has answered (possibly after :data:`_PROBE_S`)."""
    probe = _probe
    return probe is not None and probe.is_set()


def _resolve_once(answered: threading.Event) -> None:
    try:
        socket.getaddrinfo("127.0.0.1", 9, 0, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG | socket.AI_NUMERICHOST)
    except Exception:  # noqa: BLE001 - an answer all the same (an error, a patched resolver): it did not hang
        pass
    finally:
        answered.set()


class NoKafka:
    """librdkafka's place in a process whose resolver a parent thread held at the fork
    (module docstring): it takes no record, so the producer keeps them in its journal."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("no Kafka client in this process: its resolver did not answer")

    def poll(self, timeout: float | None = None) -> int:
        time.sleep(max(timeout or 0.0, 0.1))   # the sender's loop: ten turns a second, not 200
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        pass


def register_in_multiprocessing_child(close_all: Callable[[], None]) -> None:
    """For a producer built in a ``multiprocessing`` child, which no fork hook saw (a
    worker's first ``lineage_job`` builds the default producer): its exit skips ``atexit``."""
    global _close_all
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        _close_all = close_all
        _close_at_multiprocessing_exit()


def close_at_exit(producer: Any) -> None:
    """Close ``producer`` at the process's exit; in a forked child, bounded (module docstring)."""
    producer._closing = True   # no late Kafka client from here on (kafka.py, _kafka_client_back)
    if _in_forked_child and not producer._forked and not producer._closed and producer._delivered == 0:
        if not producer._kafka_down:
            producer._wait(min(_FIRST_ANSWER_S, producer.config.close_timeout_s),
                           lambda: producer._delivered > 0 or producer._kafka_down or producer.pending == 0)
        if producer._delivered == 0 and producer.pending:
            # Kafka took nothing in this child: journal now, and (as while Kafka is down)
            # close() then waits only for the records to be in the journal.
            producer._kafka_down = True
            producer._want_journal = "child_exit_before_kafka_answered"
    producer.close()


def _close_nothing() -> None:
    pass


_close_all: Callable[[], None] = _close_nothing


def _close_at_multiprocessing_exit() -> None:
    global _exit_registered
    mp_util = sys.modules.get("multiprocessing.util")
    if _exit_registered or mp_util is None:
        return
    _exit_registered = True
    # Registered here, not in the fork hook: a multiprocessing child clears the finalizers
    # it inherited after the fork hooks ran. Priority >= 0: run before the child's exit.
    mp_util.Finalize(None, _close_all, exitpriority=100)
