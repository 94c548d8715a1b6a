"""Run the decode stage in a child process, so that decoding uses another core.

Decoding (parse, validate, canonical digest) is the costliest thing the relay itself does
per event, and it holds the GIL: on the event loop's thread it competes with delivery.
:class:`DecodeWorker` hands batches of record values to ``python -m
relay.stages.decode_worker``, which runs :func:`~relay.stages.decode.decode_record` on them
and answers with what the relay needs (identity, digest, event time, rejections); the
parsed tree stays in the child.

Contract of :meth:`DecodeWorker.decode`:

* One result per value, in order: a :class:`LineageEvent` or :class:`Rejection` equal to
  what ``decode_record(value, max_bytes=...)`` returns in-process, except that
  ``event.doc`` is ``None`` (a stage that needs the tree parses ``event.body``) and
  ``event.source`` is left for the caller to set.
* It never fails and never drops a batch: when the child is missing, dies or answers
  garbage, that batch is decoded in this process, the failure is logged, and a new child
  serves the next batch. After :data:`_MAX_FAILURES` failures in a row it stays in-process.
* Bounded memory: values go over in chunks of at most ``chunk_bytes`` (a bigger value
  goes alone), one chunk in flight; the child holds one chunk and its parsed trees.
* The child exits when its input closes, so it never outlives the relay (kill -9 included).

To the child: a batch is a count, one signed 64-bit length per value (-1 for a null
value), then the values' bytes, written as they are (no copy). From the child: an 8-byte
length, then a pickle of the compact results (the child is our own code, started by us:
nothing untrusted is unpickled).
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from relay.events import LineageEvent, Rejection
from relay.logs import log_event
from relay.memory import release_after
from relay.stages.decode import decode_record

log = logging.getLogger("relay.decode_worker")

_HEADER = struct.Struct("!Q")
_COUNT = struct.Struct("=I")
#: Consecutive failures after which decoding stays in this process.
_MAX_FAILURES = 3
#: The child's scheduling priority, below the relay's: delivery is the latency-critical
#: path, and decoding runs ahead of it (a backlog of up to ``max_pending`` events), so it
#: can take the spare CPU rather than preempt the event loop (measured: +6-8% throughput
#: on a busy 2-core machine).
_NICE = 10
#: Linux pipes hold 64 KiB by default; a bigger buffer means fewer wake-ups per batch.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031

Decoded = LineageEvent | Rejection


class DecodeWorker:
    """Decodes batches in a child process; see the module docstring.

    Blocking, and confined to one thread at a time: the relay calls it from its Kafka
    consumer's thread, right after each poll, so that a batch is decoded while the event
    loop handles the previous one.
    """

    def __init__(self, *, max_bytes: int, chunk_bytes: int = 8 << 20) -> None:
        self._max_bytes = max_bytes
        self._chunk_bytes = chunk_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        self._failures = 0

    @property
    def in_process(self) -> bool:
        """True once the child was given up on: batches are decoded on the caller's thread."""
        return self._failures >= _MAX_FAILURES

    def start(self) -> None:
        self._spawn()

    def decode(self, values: Sequence[bytes | None]) -> list[Decoded]:
        out: list[Decoded] = []
        for chunk in self._chunks(values):
            if self.in_process:
                out.extend(self._decode_here(chunk))
                continue
            try:
                out.extend(self._exchange(chunk))
                self._failures = 0
            except (OSError, EOFError, ValueError, pickle.PickleError, struct.error) as err:
                self._failures += 1
                log_event(log, logging.WARNING, "decode_worker_failed", error=f"{type(err).__name__}: {err}",
                          failures=self._failures, in_process=self.in_process)
                self._stop_child()
                out.extend(self._decode_here(chunk))
        return out

    def close(self) -> None:
        self._stop_child()

    # -- helpers ---------------------------------------------------------------------
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

    def _spawn(self) -> None:
        # The child imports the same relay package as this process, wherever it came from.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root,
                                                                         os.environ.get("PYTHONPATH"))))}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "relay.stages.decode_worker", str(self._max_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        for pipe in (self._proc.stdin, self._proc.stdout):
            _grow_pipe(pipe)

    def _exchange(self, values: Sequence[bytes | None]) -> list[Decoded]:
        if self._proc is None:
            self._spawn()
        elif self._proc.poll() is not None:
            raise EOFError(f"decode worker exited with status {self._proc.returncode}")
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        _write_values(proc.stdin, values)
        answers = pickle.loads(_read_frame(proc.stdout))
        if len(answers) != len(values):
            raise ValueError(f"decode worker answered {len(answers)} results for {len(values)} values")
        return [_expand(answer, value) for answer, value in zip(answers, values)]

    def _stop_child(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the child's cue to exit
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def _compact(result: Decoded, value: bytes | None) -> tuple[Any, ...]:
    """What crosses the pipe for one result: no parsed tree, no copy of ``value``."""
    if type(result) is Rejection:
        return (result.reason, result.detail)
    e = result
    return (e.kind, None if e.body is value else e.body, e.digest, e.event_time, e.run_id, e.event_type,
            e.job_namespace, e.job_name, e.parent_run_id)


def _expand(answer: tuple[Any, ...], value: bytes | None) -> Decoded:
    if len(answer) == 2:
        return Rejection(*answer)
    kind, body, digest, event_time, run_id, event_type, job_namespace, job_name, parent_run_id = answer
    return LineageEvent(kind, None, value if body is None else body, digest, event_time, run_id, event_type,
                        job_namespace, job_name, parent_run_id)


def _write_values(pipe: IO[bytes], values: Sequence[bytes | None]) -> None:
    pipe.write(_COUNT.pack(len(values)))
    pipe.write(struct.pack(f"={len(values)}q", *(-1 if v is None else len(v) for v in values)))
    for value in values:
        if value:
            pipe.write(value)
    pipe.flush()


def _read_values(pipe: IO[bytes]) -> list[bytes | None]:
    count = _COUNT.unpack(_read_exactly(pipe, _COUNT.size))[0]
    lengths = struct.unpack(f"={count}q", _read_exactly(pipe, 8 * count))
    return [None if n < 0 else _read_exactly(pipe, n) for n in lengths]


def _read_exactly(pipe: IO[bytes], size: int) -> bytes:
    data = pipe.read(size) if size else b""
    if len(data) < size:
        raise EOFError("the pipe closed mid-frame")
    return data


def _write_frame(pipe: IO[bytes], payload: bytes) -> None:
    pipe.write(_HEADER.pack(len(payload)))
    pipe.write(payload)
    pipe.flush()


def _read_frame(pipe: IO[bytes]) -> bytes:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("decode worker closed its output")
    (size,) = _HEADER.unpack(header)
    payload = pipe.read(size)
    if len(payload) < size:
        raise EOFError("decode worker closed its output mid-frame")
    return payload


def _grow_pipe(pipe: IO[bytes] | None) -> None:
    if pipe is None or not sys.platform.startswith("linux"):
        return
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # capped by /proc/sys/fs/pipe-max-size: the default size works, only slower


def serve(max_bytes: int, inp: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: decode each frame of values until the input closes."""
    while True:
        try:
            values = _read_values(inp)
        except EOFError:
            return
        answers = [_compact(decode_record(v, max_bytes=max_bytes), v) for v in values]
        largest = max((len(v) for v in values if v), default=0)
        del values
        _write_frame(out, pickle.dumps(answers, protocol=5))
        release_after(largest)


if __name__ == "__main__":
    import gc

    # Parsed events are acyclic and freed by reference counting (see relay.app.tune_gc).
    gc.set_threshold(20_000, 20, 20)
    os.nice(_NICE)
    serve(int(sys.argv[1]), sys.stdin.buffer, sys.stdout.buffer)
