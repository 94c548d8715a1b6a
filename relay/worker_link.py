"""A worker's side of :mod:`relay.workers`: what one relay process started by the
supervisor knows of it (its index, the pipe it reports its port on, its life-line), and
what it changes in its own configuration. Light on purpose: ``relay/__main__.py`` and
``relay.cli`` read it before anything heavy is imported, and a worker never loads the
supervisor."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relay.logs import log_event

if TYPE_CHECKING:
    from relay.config import RelayConfig

log = logging.getLogger("relay.workers")

#: Set in a worker's environment: its index, then the report and life-line pipes' fds.
WORKER_ENV = "LINEAGE_RELAY_WORKER"
#: Set in a worker's environment when the supervisor's ``--config`` can be read only once (a
#: pipe, ``/dev/stdin``, a FIFO, ``<(envsubst < relay.yaml)``): the copy the workers read instead.
CONFIG_COPY_ENV = "LINEAGE_RELAY_CONFIG_COPY"
#: The librdkafka property of static group membership: one per member, kept across restarts.
GROUP_INSTANCE_ID = "group.instance.id"


@dataclass(frozen=True)
class WorkerLink:
    """A worker's side: its index, the pipe it reports its port on, its life-line."""

    index: int
    report_fd: int
    lifeline_fd: int

    @classmethod
    def from_env(cls) -> WorkerLink | None:
        """This process's link when it runs as a worker, else None."""
        value = os.environ.get(WORKER_ENV)
        if not value:
            return None
        index, report_fd, lifeline_fd = (int(part) for part in value.split(","))
        return cls(index, report_fd, lifeline_fd)

    def relay_config(self, config: RelayConfig) -> RelayConfig:
        """This worker's configuration: ``config`` with a ``group.instance.id`` of
        ``kafka.consumer_properties`` suffixed ``-<index>``. The workers of a pod share one
        configuration, and two members with the same instance id fence each other (the
        broker lets the newer one in and the older one fails): the index keeps each its own,
        the same across the pod's restarts. Without the property, or with it blank (a suffix
        would turn static membership on): ``config`` unchanged."""
        props = config.kafka.consumer_properties
        if not str(props.get(GROUP_INSTANCE_ID, "")).strip():  # blank: no static membership, keep it off
            return config
        own = {**props, GROUP_INSTANCE_ID: f"{props[GROUP_INSTANCE_ID]}-{self.index}"}
        return config.model_copy(update={"kafka": config.kafka.model_copy(update={"consumer_properties": own})})

    def report_port(self, port: int) -> bool:
        """Tell the supervisor the port; False when it is gone (killed before it read it:
        the life-line stops this worker, which is no failure of its own)."""
        try:
            os.write(self.report_fd, f"{port}\n".encode())
        except (BrokenPipeError, OSError):
            return False
        finally:
            with suppress(OSError):
                os.close(self.report_fd)
        return True

    def watch_lifeline(self, loop: asyncio.AbstractEventLoop, on_parent_gone: Callable[[], None]) -> None:
        """Call ``on_parent_gone()`` once the supervisor is gone (the life-line reads EOF)."""
        def readable() -> None:
            try:
                data = os.read(self.lifeline_fd, 64)
            except BlockingIOError:
                return
            if not data:
                loop.remove_reader(self.lifeline_fd)
                log_event(log, logging.WARNING, "supervisor_gone", action="stopping")
                on_parent_gone()

        os.set_blocking(self.lifeline_fd, False)
        loop.add_reader(self.lifeline_fd, readable)


def read_once(path: str | None) -> bytes | None:
    """The content of a ``--config`` that can be read only once (anything but a regular
    file: a pipe, ``/dev/stdin``, a FIFO), read now for this process and its workers; None
    for a regular file, or a path that cannot be read (the configuration's reader says why)."""
    if not path:
        return None
    try:
        # /dev/stdin, /dev/fd/N, /proc/self/fd/N name this process's descriptors, which workers
        # do not have (their stdin is /dev/null): read once even when a regular file is behind
        # (`--config /dev/stdin < relay.yaml`).
        own_descriptor = os.path.abspath(path).startswith(("/dev/", "/proc/"))
        if stat.S_ISREG(os.stat(path).st_mode) and not own_descriptor:
            return None
        return Path(path).read_bytes()
    except OSError:
        return None


@contextmanager
def config_copy(content: bytes | None) -> Iterator[None]:
    """While inside, workers started find ``content`` (a ``--config`` read once, see
    :func:`read_once`) at the path :data:`CONFIG_COPY_ENV` names: a file only this user may
    read, removed on leaving. Nothing when ``content`` is None."""
    if content is None:
        yield
        return
    fd, path = tempfile.mkstemp(prefix="lineage-relay-config-", suffix=".yaml")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.environ[CONFIG_COPY_ENV] = path
        yield
    finally:
        os.environ.pop(CONFIG_COPY_ENV, None)
        with suppress(OSError):
            os.unlink(path)
