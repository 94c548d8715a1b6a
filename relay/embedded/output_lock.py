"""One demo at a time per output directory: the demo deletes and rewrites what is in
``demo-output/`` (its lineage database, the Spark job's inputs), which would pull the files
from under another demo running there."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relay.errors import RelayError

LOCK_NAME = "demo.lock"


class DemoBusy(RelayError):
    """Another demo holds the output directory."""


@contextmanager
def hold_output_dir(out: Path) -> Iterator[None]:
    """Holds ``out``'s lock file (an exclusive ``flock``, released when this process ends
    however it ends) for the block; raises :class:`DemoBusy` at once, naming the holder's
    pid when it wrote one, if another process holds it."""
    path = out / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise DemoBusy(f"another demo{who} is running in {out.resolve()}; wait for it to end, or run the demo "
                           "from another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
