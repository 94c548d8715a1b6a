"""The decode worker's pipe: how values go to the child and answers come back.

To the child: a batch is a count, one signed 64-bit length per value (-1 for a null
value), then the values' bytes, written as they are (no copy; :func:`write_values`). The
child reads them into a reused buffer (:class:`Inbox`). From the child: an 8-byte length,
then a pickle of the compact answers (:func:`compact`, :func:`expand`; the child is our
own code, started by us: nothing untrusted is unpickled).
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

from relay.events import LineageEvent, Rejection
from relay.stages.decode import avro_body_bound, event_time_from_text

_HEADER = struct.Struct("!Q")
_COUNT = struct.Struct("=I")
#: Linux pipes hold 64 KiB by default; a bigger buffer means fewer wake-ups per batch.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
#: The child reads values below this size together with their neighbours (one read, then
#: cut up); a bigger one alone, so that it is not copied again.
JOIN_BELOW = 256 * 1024

Decoded = LineageEvent | Rejection
#: Bounds on an answer frame's length (see :func:`frame_bound`): per value, and per frame.
_ANSWER_SLACK = 4096
_FRAME_SLACK = 1 << 20


def frame_bound(values: Sequence[bytes | None]) -> int:
    """The longest frame the child can answer ``values`` with, so that a longer one is
    garbage, refused before anything is allocated for it. An answer holds strings cut from
    its value (pickled as UTF-8: no longer than it) and, for an Avro value only, its JSON
    ``body``, which decode keeps within :func:`~relay.stages.decode.avro_body_bound` (a
    string of control characters is 6x as long as JSON: an answer bounded by 4x its value
    alone was taken for garbage, the child killed, the chunk sent again, until decoding
    fell back to the relay's thread for good)."""
    size = _FRAME_SLACK
    for value in values:
        if value:
            n = len(value)
            size += _ANSWER_SLACK + 4 * n
            if value[0] == 0xC3 and value[1:2] == b"\x01":  # AVRO_MARKER (no JSON text starts with 0xC3)
                size += avro_body_bound(n)
        else:
            size += _ANSWER_SLACK
    return size


def compact(found: Rejection | tuple[Any, ...], value: bytes | None) -> tuple[Any, ...]:
    """What crosses the pipe for what :func:`decode_fields` found in ``value``: no parsed
    tree, no copy of ``value``, the event time as text (a datetime costs ~2 us to pickle,
    more than the rest of the answer). Decode's ``big_int`` mark is a bool: a byte of the
    pickle, set on the rebuilt event only when True (measured: ~15 ns per event each side)."""
    if type(found) is Rejection:
        return (found.reason, found.detail)
    _doc, body, kind, digest, _event_time, event_time_text, run_id, event_type, job_namespace, job_name, \
        parent_run_id, big_int = found
    return (kind, None if body is value else body, digest, event_time_text, run_id, event_type, job_namespace,
            job_name, parent_run_id, big_int)


def expand(answer: tuple[Any, ...], value: bytes | None) -> Decoded:
    if len(answer) == 2:
        return Rejection(*answer)
    kind, body, digest, event_time_text, run_id, event_type, job_namespace, job_name, parent_run_id, big_int = answer
    event = LineageEvent(kind, None, value if body is None else body, digest, event_time_from_text(event_time_text),
                         run_id, event_type, job_namespace, job_name, parent_run_id)
    if big_int:  # rare: an attribute set costs less than a keyword argument on every event
        event.big_int = True
    return event


def write_values(pipe: IO[bytes], values: Sequence[bytes | None]) -> None:
    # Written with writev, straight from the consumed records: no copy of the batch (joined,
    # 8000 records of 3.5 KB took ~5 ms under the GIL, the event loop's time), and the GIL
    # is released while the pipe drains. Where there is no writev, the same buffers go
    # through the pipe's own buffering.
    buffers: list[bytes | memoryview] = [
        _COUNT.pack(len(values)),
        struct.pack(f"={len(values)}q", *(-1 if v is None else len(v) for v in values)),
        *(v for v in values if v)]
    if _writev is not None:
        pipe.flush()
        _writev_all(pipe.fileno(), buffers)
        return
    for buffer in buffers:
        pipe.write(buffer)
    pipe.flush()


_writev = getattr(os, "writev", None)
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


def _writev_all(fd: int, buffers: list[bytes | memoryview]) -> None:
    """Write all of ``buffers`` to ``fd`` in order, whatever the kernel takes per call."""
    assert _writev is not None
    i, count = 0, len(buffers)
    while i < count:
        written = _writev(fd, buffers[i:i + _IOV_MAX])
        while i < count and written >= len(buffers[i]):
            written -= len(buffers[i])
            i += 1
        if written:  # a buffer went in part: the rest of it first
            buffers[i] = memoryview(buffers[i])[written:]


def read_values(pipe: IO[bytes], inbox: Inbox | None = None) -> list[bytes | memoryview | None]:
    """One batch of values, as :func:`_write_values` wrote it. With ``inbox``, the small
    values are memoryviews into its buffer, valid until the next call with it."""
    count = _COUNT.unpack(read_exactly(pipe, _COUNT.size))[0]
    if inbox is not None:
        inbox.begin()
    lengths = struct.unpack(f"={count}q", read_exactly(pipe, 8 * count))
    # A run of values below JOIN_BELOW is read in one call and cut up (one read per value
    # cost more than the copy); a large value is read alone, not copied again.
    values: list[bytes | memoryview | None] = []
    run_start = 0
    for i, n in enumerate(lengths):
        if n >= JOIN_BELOW:
            values.extend(_read_small(pipe, lengths[run_start:i], inbox))
            values.append(read_exactly(pipe, n))
            run_start = i + 1
    values.extend(_read_small(pipe, lengths[run_start:], inbox))
    return values


def _read_small(pipe: IO[bytes], lengths: Sequence[int], inbox: Inbox | None) -> list[bytes | memoryview | None]:
    size = sum(n for n in lengths if n > 0)
    data: bytes | memoryview = read_exactly(pipe, size) if inbox is None else inbox.read(pipe, size)
    values: list[bytes | memoryview | None] = []
    at = 0
    for n in lengths:
        if n < 0:
            values.append(None)
        else:
            values.append(data[at:at + n])
            at += n
    return values


class Inbox:
    """The child's input buffer, reused from batch to batch. A new buffer per batch and a
    copy per value cost ~3.5 us per 3.5 KB event (page faults and copies, measured), about
    a third of parsing it; a memoryview slice costs nothing like that.

    :meth:`begin` starts a batch; each :meth:`read` of it gets its own region, so the
    views of one batch never overlap. When a region does not fit, a new buffer takes over
    (the views already given keep the old one alive until they go). It grows to the small
    values of one chunk (``chunk_bytes``) and stays there; large values are read on their
    own, not into it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._used = 0

    def begin(self) -> None:
        self._used = 0

    def read(self, pipe: IO[bytes], size: int) -> memoryview:
        start = self._used
        if start + size > len(self._buffer):
            self._buffer = bytearray(max(size, len(self._buffer)))
            start = 0
        self._used = start + size
        view = memoryview(self._buffer)[start:start + size]
        got = 0
        while got < size:
            n = pipe.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                raise EOFError("the pipe closed mid-frame")
            got += n
        return view


def read_exactly(pipe: IO[bytes], size: int) -> bytes:
    data = pipe.read(size) if size else b""
    if len(data) < size:
        raise EOFError("the pipe closed mid-frame")
    return data


def write_frame(pipe: IO[bytes], payload: bytes) -> None:
    pipe.write(_HEADER.pack(len(payload)))
    pipe.write(payload)
    pipe.flush()


def read_frame(pipe: IO[bytes], max_size: Callable[[], int]) -> bytes:
    """One answer; ValueError when its length is over ``max_size()``, asked once the length
    came (not an answer: nothing that large is read or allocated)."""
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("decode worker closed its output")
    (size,) = _HEADER.unpack(header)
    max_size = max_size()
    if size > max_size:
        raise ValueError(f"decode worker answered a frame of {size} bytes, over the {max_size} its batch allows")
    payload = pipe.read(size)
    if len(payload) < size:
        raise EOFError("decode worker closed its output mid-frame")
    return payload


def grow_pipe(pipe: IO[bytes] | None) -> None:
    if pipe is None or not sys.platform.startswith("linux"):
        return
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # capped by /proc/sys/fs/pipe-max-size: the default size works, only slower
