"""What the decode worker keeps in flight: its children, and the batches they answer.

:class:`~relay.stages.decode_worker.DecodeWorker` decides which child gets which chunk and
what happens when one dies; these are what it keeps track of meanwhile:

* :class:`DecodeChild`: one decode process (``python -m relay.stages.decode_child``), its
  input and answers pipes, the reader thread that reads the answers, and the chunks
  written to it and not yet answered, oldest first. A chunk is pending before it is written
  (its answer can come at once); the worker's lock guards ``pending`` and ``dead``, and the
  child's ``write_lock`` keeps ``pending`` in the order the chunks were written.
* :class:`DecodeBatch`: one submitted batch, cut into chunks that several children may answer,
  in any order (a dead child's chunks go again to others). Its callback runs once, with
  all the answers in order, on the thread that brought the last part, and the batch holds
  none of them after (a batch's events can be large).
"""

from __future__ import annotations

import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO

from relay.stages.decode_pipe import Decoded

#: How long reap() waits for a killed child to be gone before it leaves it to be reaped later.
_REAP_AFTER_KILL_S = 10.0


def answer_part(batch: DecodeBatch, index: int, results: list[Decoded]) -> None:
    batch.part_done(index, results)


class DecodeBatch:
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


class DecodeChild:
    """One decode process, its pipes, its reader thread and the batches it holds (oldest
    first). Its stdout is the reader's alone: only the reader closes it."""

    def __init__(self, proc: subprocess.Popen[bytes], answers: IO[bytes]) -> None:
        self.proc = proc
        self.stdin = proc.stdin
        self.stdout = answers  # the child's answers (its own stdout goes elsewhere)
        self.pending: deque[tuple[Sequence[bytes | None], DecodeBatch, int, bool]] = deque()
        self.write_lock = threading.Lock()
        self.dead = False
        self.answered = False  # once: the environment works, a death is a record's doing
        self.reader: threading.Thread | None = None

    def kill(self, grace_s: float = 0.0) -> None:
        """Kill the process, unless it exits within ``grace_s`` (one that closed its answers
        is on its way out: its own exit status says why, not the SIGKILL that would follow)."""
        if grace_s > 0:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()

    def reap(self) -> None:
        """On the reader's thread, once it is done: the process gone, its pipes closed. Never
        raises: a child still not gone after SIGKILL is left with ``returncode`` None."""
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
            try:
                self.proc.wait(timeout=_REAP_AFTER_KILL_S)
            except subprocess.TimeoutExpired:
                # Killed but not yet gone (a machine this loaded can take that long): never
                # raise here, as the reader must still answer the batches the child held.
                # Its returncode stays None; subprocess reaps it later.
                pass

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
