"""Operations commands: ``lineage-relay replay`` and ``lineage-relay dlq list|redrive``.

They run beside a live relay without disturbing it: they read topics with ``assign()``
(never joining the relay's consumer group) and deliver through the same decoder, route,
rewrite and HTTP collector code the relay uses. :func:`add_subcommands` registers them on
the CLI's sub-parsers; each sub-command's ``ops_handler(args)`` returns the exit code.
"""

from __future__ import annotations

import argparse

from relay.errors import RelayError


class OpsError(RelayError):
    """An operations command cannot proceed; the message says why and what to do."""


def kafka_error_text(err: BaseException) -> str:
    """The librdkafka error behind a KafkaException, as one line."""
    inner = err.args[0] if err.args else None
    return inner.str() if hasattr(inner, "str") else str(err)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add ``replay`` and ``dlq`` (with ``list``/``redrive``) to the CLI."""
    from relay.ops import dlq, replay

    replay.add_parser(sub)
    dlq.add_parser(sub)
