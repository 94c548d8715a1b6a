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
* It never fails and never drops a batch: when the child dies or answers garbage, a new
  child decodes the batches it held, and the failure is logged. A child that dies decoding
  a chunk (a record whose parse takes more memory than the machine has: size limits do not
  bound that) makes its values go again one by one, each to a fresh child; a value that
  kills a child on its own is answered with a :data:`DECODER_CRASHED` rejection (a dead
  letter), never decoded in this process, where it would take the relay down with it, at
  every restart. After :data:`_MAX_FAILURES` children in a row that failed before any answer
  and not by a record's doing (a broken environment: a child that exits on its own before
  answering, one that cannot import the relay, or one that answers garbage), decoding stays
  in this process, and such a child's chunks go again whole. A death by a signal (the
  out-of-memory killer, a crash in a parse) or by an error escaping a parse
  (:data:`DIED_DECODING`) is a record's doing, however fresh the child: killing records
  that each come in a poll of their own, each to a fresh child, never make the relay
  decode in this process, where the next one would be parsed.
* Answers come on a pipe of their own, not the child's stdout: whatever else writes there
  (a ``sitecustomize``, an agent) goes to this process's stderr instead of into the answers.
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

What crosses the pipes, and how: :mod:`relay.stages.decode_pipe`; the child's side:
:mod:`relay.stages.decode_child`; what is kept in flight (each child, each batch):
:mod:`relay.stages.decode_inflight`.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from relay.events import LineageEvent, Rejection
from relay.logs import context_env, log_event
from relay.stages.decode import DECODER_CRASHED, decode_record
from relay.stages.decode_inflight import DecodeBatch, DecodeChild, answer_part
from relay.stages.decode_pipe import (
    Decoded,
    expand,
    frame_bound,
    grow_pipe,
    read_frame,
    write_values,
)

log = logging.getLogger("relay.decode_worker")

#: Children in a row that failed before any answer, not by a record's doing (see
#: ``_child_failed``), after which decoding stays in this process.
_MAX_FAILURES = 3
#: The exit status of a child that an error escaping a parse (MemoryError...) ended: the
#: record's doing, as a death by a signal is, not a broken environment's.
DIED_DECODING = 70
#: The child's scheduling priority, below the relay's: delivery is the latency-critical
#: path, and decoding runs ahead of it (a backlog of up to ``max_pending`` events), so it
#: can take the spare CPU rather than preempt the event loop (measured: +6-8% throughput
#: on a busy 2-core machine).
_NICE = 10
#: Priorities of the child: ``low`` is :data:`_NICE`; ``idle`` is Linux's SCHED_IDLE on top,
#: so that the child runs only on CPU nobody else wants and never delays the event loop
#: (where there is no SCHED_IDLE, ``idle`` is ``low``).
PRIORITIES = ("low", "idle")


def package_env() -> dict[str, str]:
    """This process's environment for a ``python -m relay...`` child (a decode child, a
    worker of :mod:`relay.workers`): ``PYTHONPATH`` starts at the ``relay`` package this
    process runs, so the child imports the same one, wherever it came from (a checkout, a
    worktree, an installed wheel), whatever the working directory."""
    package_root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}


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
        self._children: list[DecodeChild | None] = [None] * max(1, processes)
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
        batch = DecodeBatch(len(chunks), on_done)
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
    def _submit_chunk(self, chunk: Sequence[bytes | None], batch: DecodeBatch, index: int, alone: bool = False) -> None:
        """Send ``chunk`` to the next child (``alone``: a value suspected of killing one,
        sent by itself). From the consumer's thread, and from a reader's re-sending what its
        dead child held: a child's write lock keeps its pending list in the order written."""
        while True:
            with self._lock:
                child = None
                if not self.in_process or alone:  # a suspect is never decoded here: it would kill the relay
                    turn = self._turn
                    self._turn = (turn + 1) % len(self._children)
                    child = self._children[turn]
                    if child is None or child.dead:
                        child = self._children[turn] = self._spawn()
            if child is None:
                batch.part_done(index, self._decode_here(chunk))
                return
            with child.write_lock:
                with self._lock:
                    if child.dead:  # its reader has taken its batches back meanwhile
                        continue
                    child.pending.append((chunk, batch, index, alone))  # before the write: answers come at once
                try:
                    write_values(child.stdin, chunk)
                except (OSError, ValueError):
                    # The child is gone or going: its reader sends again what it held, this included.
                    child.kill()
            return

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

    def _spawn(self) -> DecodeChild:
        env = {**package_env(), **context_env()}  # its log lines are this process's: the same context
        answers_r, answers_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "relay.stages.decode_child", str(self._max_bytes), self.priority,
                 str(answers_w)],
                stdin=subprocess.PIPE, stdout=_stray_output(), env=env, close_fds=True, pass_fds=(answers_w,))
        except BaseException:
            os.close(answers_r)
            raise
        finally:
            os.close(answers_w)
        answers = os.fdopen(answers_r, "rb")
        for pipe in (proc.stdin, answers):
            grow_pipe(pipe)
        child = DecodeChild(proc, answers)
        child.reader = threading.Thread(target=self._read_answers, args=(child,), name="decode-worker-reader",
                                        daemon=True)
        child.reader.start()
        return child

    def _read_answers(self, child: DecodeChild) -> None:
        """The reader thread of one child: hand its answers over in order; when it dies or
        answers garbage, send what it held to a new child (see the module docstring)."""
        assert child.stdout is not None
        error: str | None = None
        died = False
        try:
            def limit() -> int:
                """Nothing longer than an answer to the oldest chunk sent can be one (it is
                pending before it is written): a garbage length is refused, not allocated."""
                with self._lock:
                    oldest = child.pending[0][0] if child.pending else ()
                return frame_bound(oldest)

            while True:
                try:
                    payload = read_frame(child.stdout, limit)
                except (OSError, EOFError) as err:
                    error, died = f"{type(err).__name__}: {err}", True
                    break
                with self._lock:
                    entry = child.pending.popleft() if child.pending else None
                if entry is None:
                    error = "ValueError: decode worker answered a batch it was never sent"
                    break
                values, batch, index, _alone = entry
                try:
                    answers = pickle.loads(payload)
                    if len(answers) != len(values):
                        raise ValueError(f"decode worker answered {len(answers)} results for {len(values)} values")
                    results = [expand(answer, value) for answer, value in zip(answers, values)]
                except Exception as err:  # noqa: BLE001 - garbage, whatever it raises
                    with self._lock:
                        child.pending.appendleft(entry)
                    error = f"{type(err).__name__}: {err}"
                    break
                self._failures = 0
                child.answered = True
                batch.part_done(index, results)
                # Hold nothing while waiting for the next answer: a batch's values can be large.
                del values, batch, results, answers, payload, entry
        except Exception as err:  # noqa: BLE001 - whatever it is, the batches held must be answered
            error = f"{type(err).__name__}: {err}"
        self._child_failed(child, error, died)

    def _child_failed(self, child: DecodeChild, error: str | None, died: bool) -> None:
        with self._lock:
            child.dead = True
            orphans = list(child.pending)
            child.pending.clear()
            closing = self._closed
            expected = closing and not orphans
        if not expected:
            child.kill(grace_s=_EXIT_GRACE_S if died else 0.0)
        child.reap()
        if expected:
            return
        exit_code = child.proc.returncode
        # A child that died by a signal (the out-of-memory killer, a crash in a parse) or of
        # an error escaping a parse died of what it was decoding, fresh or not: its chunk's
        # values go again alone. One that never answered and failed otherwise (exited on its
        # own, as one that cannot start does, or answered garbage) says the environment is
        # broken, unless it died on a value sent alone; its chunks go again whole.
        by_record = died and (child.answered or (exit_code is not None and (exit_code < 0 or
                                                                             exit_code == DIED_DECODING)))
        with self._lock:
            if not child.answered and not by_record and not (died and orphans and orphans[0][3]):
                self._failures += 1
            failures = self._failures
        log_event(log, logging.WARNING, "decode_worker_failed", error=error, exit_code=exit_code,
                  failures=failures, in_process=failures >= _MAX_FAILURES, batches=len(orphans))
        for n, (values, batch, index, alone) in enumerate(orphans):
            if n == 0 and died and alone:  # it died on this value alone, in a fresh child
                log_event(log, logging.ERROR, "decoder_crashed", bytes=len(values[0] or b""), exit_code=exit_code)
                batch.part_done(index, [Rejection(DECODER_CRASHED, _crash_detail(values[0], exit_code))])
            elif closing:  # no new child now: decoded here
                batch.part_done(index, self._decode_here(values))
            elif n == 0 and by_record:  # what it was decoding: each value again, alone
                part = DecodeBatch(len(values), partial(answer_part, batch, index))
                for i, value in enumerate(values):
                    self._submit_chunk([value], part, i, alone=True)
            else:
                self._submit_chunk(values, batch, index)


#: How long a child that closed its answers may take to exit before it is killed: its exit
#: status is then its own in ``decode_worker_failed`` (a traceback's 1, a signal's), not -9.
_EXIT_GRACE_S = 1.0


def _crash_detail(value: bytes | None, exit_code: int | None) -> str:
    how = f"killed by signal {-exit_code}" if exit_code is not None and exit_code < 0 else f"exit code {exit_code}"
    return (f"the decode worker died decoding this record alone ({how}; the out-of-memory killer?), after "
            f"dying on the batch that held it: its {len(value or b'')} bytes are under max_event_bytes, but "
            "parsing it takes more memory than the worker has. Decoded in the relay it would take the relay "
            "down, at every restart; give the relay more memory and redrive it, or drop it.")


def _stray_output() -> int:
    """Where the child's stdout goes: this process's stderr (never into the answers)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded, captured)
        return subprocess.DEVNULL
