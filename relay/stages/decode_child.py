"""The decode worker's child process (``python -m relay.stages.decode_child MAX_BYTES
PRIORITY ANSWERS_FD``): decodes each batch of values from its stdin and writes the answers
to ``ANSWERS_FD``, until its stdin closes. See :mod:`relay.stages.decode_worker`.

It ignores SIGINT and SIGTERM: the relay owns the stop. A Ctrl-C in a terminal, or a
SIGTERM to the whole process group or cgroup (systemd), reaches the child as well as the
relay; a child that died of it printed a plain-text ``KeyboardInterrupt`` traceback amid
the JSON log lines, and the relay, still draining, took it for a failed decoder. The relay
stops its children by closing their input, and a relay that dies closes it too."""

from __future__ import annotations

import signal

if __name__ == "__main__":  # first, before the imports below: a stop may come at once
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

import logging
import os
import pickle
import queue
import sys
import threading
from typing import IO

from relay.logs import inherit_log_context, setup_logging
from relay.memory import release_after, tune_malloc
from relay.stages.decode import decode_fields
from relay.stages.decode_pipe import Inbox, compact, read_values, write_frame
from relay.stages.decode_worker import _NICE, DIED_DECODING

log = logging.getLogger("relay.decode_child")

#: The child's GIL switch interval: its input thread waits at most this long for the GIL
#: after each read (the default 5 ms, per read of a 1 MiB pipe, starved the decoder).
_CHILD_SWITCH_S = 0.0002


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
        try:
            answers = [compact(decode_fields(v, max_bytes=max_bytes), v) for v in values]
        except BaseException as err:  # noqa: BLE001 - a parse that ran out of memory...: the record's doing
            _log_failure("decode_child_failed", err, exit_code=DIED_DECODING, values=len(values))
            os._exit(DIED_DECODING)  # the parent sends the chunk's values again alone
        largest = max((len(v) for v in values if v), default=0)
        del values, item
        free.put(index)
        write_frame(out, pickle.dumps(answers, protocol=5))
        release_after(largest)


def _log_failure(event: str, err: BaseException, **fields: object) -> None:
    """One JSON line on the relay's stderr (see the module docstring); never raises: out of
    memory, the line may not get written, the exit status still says what happened."""
    try:
        log.error(event, exc_info=err, extra={"fields": {"error": f"{type(err).__name__}: {err}",
                                                         "pid": os.getpid(), **fields}})
        for handler in logging.getLogger().handlers:
            handler.flush()
    except BaseException:  # noqa: BLE001, S110 - nothing more to say: the exit status says it
        pass


if __name__ == "__main__":
    import gc

    inherit_log_context()  # before anything is logged: the relay's worker index...
    setup_logging("warning")
    logging.raiseExceptions = False  # a line that cannot be written is lost, not printed as a traceback

    # Parsed events are acyclic and freed by reference counting (see relay.process.tune_gc).
    gc.set_threshold(20_000, 20, 20)
    # The input thread needs the GIL only between reads: hand it over quickly.
    sys.setswitchinterval(_CHILD_SWITCH_S)
    tune_malloc()
    os.nice(_NICE)
    if sys.argv[2] == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # not allowed here (a seccomp profile): stay at _NICE
            pass
    try:
        serve(int(sys.argv[1]), sys.stdin.buffer, os.fdopen(int(sys.argv[3]), "wb"))
    except BaseException as err:  # noqa: BLE001 - reading its input failed...: one JSON line, not a traceback
        _log_failure("decode_child_failed", err, exit_code=1)
        os._exit(1)  # as an uncaught error exits: not a record's doing
