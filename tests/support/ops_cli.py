"""``lineage-relay`` in a child process with the redrive lease timing of a test, for tests
that SIGKILL or SIGSTOP a redrive: ``python -m tests.support.ops_cli '<timing json>' dlq redrive ...``."""

from __future__ import annotations

import json
import sys

from relay.ops import redrive_lock


def main() -> int:
    redrive_lock.TIMING = redrive_lock.LeaseTiming(**json.loads(sys.argv[1]))
    from relay.cli import main as cli

    return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
