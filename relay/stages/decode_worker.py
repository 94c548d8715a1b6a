"""Run the decode stage in a child process, so that decoding uses another core.

Decoding (parse, validate, canonical digest) is the costliest thing the relay itself does
per event, and it holds the GIL: on the event loop's thread it competes with delivery.
:class:`DecodeWorker` hands batches of record values to ``python -m
relay.stages.decode_worker``, which runs :func:`~relay.stages.decode.decode_record` on them
and answers with what the relay needs (identity, digest, event time, rejections); the
parsed tree stays in the child.

Contract of :meth:`DecodeWorker.submit` (and :meth:`DecodeWorker.decode`, which waits):

* One result per value, in order: a :class:`LineageEvent` or :class:`Rejection` equal to
  what ``decode_record(value, max_bytes=...)`` returns in-process, except that
  ``event.doc`` is ``None`` (a stage that needs the tree parses ``event.body``) and
  ``event.source`` is left for the caller to set.
* It never fails and never drops a batch: when the child is missing, dies or answers
  garbage, the batches it held are decoded in this process, the failure is logged, and a
  new child serves the next batch. After :data:`_MAX_FAILURES` failures in a row it stays
  in-process.
* Pipelined: ``submit`` writes the batch to the child and returns; a reader thread answers
  the batches in order. Several batches can be in flight, so the consumer fetches the next
  one while the child decodes (measured on two cores: the pipeline alone 20.1k -> 21.6k
  events/s, to a batch collector 17.0k -> 19.1k, the child now busy ~90% of the time).
* Bounded memory: values go over in chunks of at most ``chunk_bytes`` (a bigger value
  goes alone); the child holds two chunks, the one it decodes (and its parsed trees) and
  the next, read ahead (their small values in two buffers it reuses, at most
  ``chunk_bytes`` each, see :class:`~relay.stages.decode_pipe.Inbox`), the pipe at most
  1 MiB, and a writer blocks when all are full. The values themselves are the caller's
  (the consumed records), counted by its back-pressure.
* The child exits when its input closes, so it never outlives the relay (kill -9 included).

What crosses the pipes, and how: :mod:`relay.stages.decode_pipe`.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from relay.events import LineageEvent
from relay.logs import log_event
from relay.memory import release_after, tune_malloc
from relay.stages.decode import decode_fields, decode_record
from relay.stages.decode_pipe import (
    Decoded,
    Inbox,
    compact,
    expand,
    grow_pipe,
    read_frame,
    read_values,
    write_frame,
    write_values,
)

log = logging.getLogger("relay.decode_worker")

#: Consecutive failures after which decoding stays in this process.
_MAX_FAILURES = 3
#: The child's scheduling priority, below the relay's: delivery is the latency-critical
#: path, and decoding runs ahead of it (a backlog of up to ``max_pending`` events), so it
#: can take the spare CPU rather than preempt the event loop (measured: +6-8% throughput
#: on a busy 2-core machine).
_NICE = 10
#: Priorities of the child: ``low`` is :data:`_NICE`; ``idle`` is Linux's SCHED_IDLE on top,
#: so that the child runs only on CPU nobody else wants and never delays the event loop
#: (where there is no SCHED_IDLE, ``idle`` is ``low``).
PRIORITIES = ("low", "idle")
#: The child's GIL switch interval: its input thread waits at most this long for the GIL
#: after each read (the default 5 ms, per read of a 1 MiB pipe, starved the decoder).
_CHILD_SWITCH_S = 0.0002


class DecodeWorker:
    """Decodes batches in a child process; see the module docstring.

    :meth:`submit` is called from one thread at a time (the relay's Kafka consumer thread,
    right after each poll) and returns at once; a reader thread hands each child's answers
    over in submission order. So the next batch is consumed while the child decodes this
    one, and the child decodes while the event loop handles the one before.
    """

    def __init__(self, *, max_bytes: int, chunk_bytes: int = 8 << 20, processes: int = 1,
                 priority: str = "low") -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        self.priority = priority
        self._max_bytes = max_bytes
        self._chunk_bytes = chunk_bytes
        #: Children, used in turn (a batch per child): on a machine with cores to spare,
        #: decoding scales with them.
        self._children: list[_Child | None] = [None] * max(1, processes)
        self._turn = 0
        self._failures = 0
        self._closed = False
        self._lock = threading.Lock()

    @property
    def in_process(self) -> bool:
        """True once the child was given up on: batches are decoded on the caller's thread."""
        return self._failures >= _MAX_FAILURES

    @property
    def pids(self) -> list[int]:
        """Process ids of the live children (for resource figures)."""
        with self._lock:
            return [c.proc.pid for c in self._children if c is not None and not c.dead]

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        """The process of the child that was used last (for tests)."""
        child = self._children[(self._turn - 1) % len(self._children)]
        return None if child is None else child.proc

    def start(self) -> None:
        with self._lock:
            self._closed = False
            for i, child in enumerate(self._children):
                if child is None:
                    self._children[i] = self._spawn()

    def submit(self, values: Sequence[bytes | None], on_done: Callable[[list[Decoded]], None]) -> None:
        """Start decoding ``values``; ``on_done`` gets one answer per value, in order, on the
        reader's thread (or this one). It always gets them: a failed child's batches are
        decoded in this process. No future and no closure cycle holds the answers after:
        a batch's events can be large, and the relay's garbage collector runs rarely."""
        chunks = self._chunks(values)
        if not chunks:
            on_done([])
            return
        batch = _Batch(len(chunks), on_done)
        for index, chunk in enumerate(chunks):
            self._submit_chunk(chunk, batch, index)

    def decode(self, values: Sequence[bytes | None], timeout_s: float | None = None) -> list[Decoded]:
        """:meth:`submit` and wait for the answers."""
        answered = threading.Event()
        box: list[list[Decoded]] = []
        self.submit(values, lambda results: (box.append(results), answered.set()))
        if not answered.wait(timeout_s):
            raise TimeoutError(f"no answer from the decode worker within {timeout_s} s")
        return box[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children, self._children = self._children, [None] * len(self._children)
        for child in children:
            if child is not None:
                child.shutdown()

    # -- helpers ---------------------------------------------------------------------
    def _submit_chunk(self, chunk: Sequence[bytes | None], batch: _Batch, index: int) -> None:
        with self._lock:
            child = None
            if not self.in_process:
                turn = self._turn
                self._turn = (turn + 1) % len(self._children)
                child = self._children[turn]
                if child is None or child.dead:
                    child = self._children[turn] = self._spawn()
                child.pending.append((chunk, batch, index))  # before the write: the reader may answer at once
        if child is None:
            batch.part_done(index, self._decode_here(chunk))
            return
        try:
            write_values(child.stdin, chunk)
        except (OSError, ValueError):
            # The child is gone or going: its reader decodes here what it held, this included.
            child.kill()

    def _chunks(self, values: Sequence[bytes | None]) -> list[Sequence[bytes | None]]:
        chunks, start, size = [], 0, 0
        for i, value in enumerate(values):
            n = len(value) if value else 0
            if size and size + n > self._chunk_bytes:
                chunks.append(values[start:i])
                start, size = i, 0
            size += n
        if start < len(values):
            chunks.append(values[start:])
        return chunks

    def _decode_here(self, values: Sequence[bytes | None]) -> list[Decoded]:
        results = [decode_record(v, max_bytes=self._max_bytes) for v in values]
        for result in results:
            if type(result) is LineageEvent:
                result.doc = None  # as from the child: the contract is the same either way
        return results

    def _spawn(self) -> _Child:
        # The child imports the same relay package as this process, wherever it came from.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root,
                                                                         os.environ.get("PYTHONPATH"))))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "relay.stages.decode_worker", str(self._max_bytes), self.priority],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        for pipe in (proc.stdin, proc.stdout):
            grow_pipe(pipe)
        child = _Child(proc)
        child.reader = threading.Thread(target=self._read_answers, args=(child,), name="decode-worker-reader",
                                        daemon=True)
        child.reader.start()
        return child

    def _read_answers(self, child: _Child) -> None:
        """The reader thread of one child: hand its answers over in order; when it dies or
        answers garbage, decode what it held here and let the next submission spawn anew."""
        assert child.stdout is not None
        error: str | None = None
        while error is None:
            try:
                payload = read_frame(child.stdout)
            except (OSError, EOFError, ValueError) as err:
                error = f"{type(err).__name__}: {err}"
                break
            with self._lock:
                values, batch, index = child.pending.popleft() if child.pending else (None, None, 0)
            if batch is None:
                error = "ValueError: decode worker answered a batch it was never sent"
                break
            try:
                answers = pickle.loads(payload)
                if len(answers) != len(values):
                    raise ValueError(f"decode worker answered {len(answers)} results for {len(values)} values")
                results = [expand(answer, value) for answer, value in zip(answers, values)]
            except (ValueError, TypeError, pickle.PickleError, struct.error) as err:
                child.pending.appendleft((values, batch, index))
                error = f"{type(err).__name__}: {err}"
                break
            self._failures = 0
            batch.part_done(index, results)
            # Hold nothing while waiting for the next answer: a batch's values can be large.
            del values, batch, results, answers, payload
        with self._lock:
            child.dead = True
            orphans = list(child.pending)
            child.pending.clear()
            expected = self._closed and not orphans
            if not expected:
                self._failures += 1
            failures = self._failures
        if not expected:
            child.kill()
        child.reap()
        if not expected:
            log_event(log, logging.WARNING, "decode_worker_failed", error=error, failures=failures,
                      in_process=failures >= _MAX_FAILURES, batches=len(orphans))
        for values, batch, index in orphans:
            batch.part_done(index, self._decode_here(values))


class _Batch:
    """One submitted batch, answered in parts (chunks) that may come from several children."""

    __slots__ = ("_parts", "_remaining", "_on_done", "_lock")

    def __init__(self, parts: int, on_done: Callable[[list[Decoded]], None]) -> None:
        self._parts: list[list[Decoded] | None] = [None] * parts
        self._remaining = parts
        self._on_done: Callable[[list[Decoded]], None] | None = on_done
        self._lock = threading.Lock()

    def part_done(self, index: int, results: list[Decoded]) -> None:
        with self._lock:
            self._parts[index] = results
            self._remaining -= 1
            if self._remaining:
                return
            parts, on_done = self._parts, self._on_done
            self._parts, self._on_done = [], None
        assert on_done is not None
        on_done(parts[0] if len(parts) == 1 else [r for part in parts for r in part])  # type: ignore[union-attr]


class _Child:
    """One decode process, its pipes, its reader thread and the batches it holds (oldest
    first). Its stdout is the reader's alone: only the reader closes it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.pending: deque[tuple[Sequence[bytes | None], _Batch, int]] = deque()
        self.dead = False
        self.reader: threading.Thread | None = None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def reap(self) -> None:
        """On the reader's thread, once it is done: the process gone, its pipes closed."""
        for pipe in (self.stdin, self.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def shutdown(self) -> None:
        """Close its input (its cue to exit) and wait for the reader to answer what it held."""
        try:
            if self.stdin is not None:
                self.stdin.close()
        except OSError:
            pass
        reader = self.reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=10)
            if reader.is_alive():  # a child that does not exit: make it
                self.kill()
                reader.join(timeout=5)


def serve(max_bytes: int, inp: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: decode each frame of values until the input closes.

    An input thread reads the next chunk while this one is decoded, into the other of two
    inboxes. The pipe holds 1 MiB at most (without privileges), a fraction of a chunk:
    reading only between chunks left the decoder waiting for its input and the parent's
    writer (the relay's consumer thread) blocked meanwhile, and the relay's pipeline alone
    ran ~25% idle (measured over 90,000 events: 61,000 -> 68,000 events/s with it)."""
    ready: queue.SimpleQueue[tuple[list[bytes | memoryview | None], int] | BaseException | None] = \
        queue.SimpleQueue()
    free: queue.SimpleQueue[int] = queue.SimpleQueue()  # inboxes no batch's views point into
    inboxes = (Inbox(), Inbox())
    for index in range(len(inboxes)):
        free.put(index)

    def read_ahead() -> None:
        try:
            while True:
                index = free.get()
                ready.put((read_values(inp, inboxes[index]), index))
        except EOFError:
            ready.put(None)
        except BaseException as err:  # noqa: BLE001 - handed over: the child exits with it
            ready.put(err)

    threading.Thread(target=read_ahead, name="decode-worker-input", daemon=True).start()
    while True:
        item = ready.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        values, index = item
        # No answer holds a value (a JSON body that is the value is sent as None): the views
        # into the inbox are gone before it is given back for another batch.
        answers = [compact(decode_fields(v, max_bytes=max_bytes), v) for v in values]
        largest = max((len(v) for v in values if v), default=0)
        del values, item
        free.put(index)
        write_frame(out, pickle.dumps(answers, protocol=5))
        release_after(largest)


if __name__ == "__main__":
    import gc

    # Parsed events are acyclic and freed by reference counting (see relay.process.tune_gc).
    gc.set_threshold(20_000, 20, 20)
    # The input thread needs the GIL only between reads: hand it over quickly.
    sys.setswitchinterval(_CHILD_SWITCH_S)
    tune_malloc()
    os.nice(_NICE)
    if sys.argv[2:] == ["idle"] and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # not allowed here (a seccomp profile): stay at _NICE
            pass
    serve(int(sys.argv[1]), sys.stdin.buffer, sys.stdout.buffer)
