import os
import signal
import sys

# A worker of a supervisor (relay/workers.py) ignores SIGINT from the start, before the
# imports below: a terminal's Ctrl-C reaches the whole process group, and the supervisor
# stops its workers itself (SIGTERM), as relay/stages/decode_child.py's relay does its own.
if os.environ.get("LINEAGE_RELAY_WORKER"):  # relay.worker_link.WORKER_ENV
    signal.signal(signal.SIGINT, signal.SIG_IGN)

# Then, still before the imports, a stop during start-up exits at once (relay/entrypoint.py).
from relay.entrypoint import install_early_stop  # noqa: E402 - after the signal disposition above

install_early_stop()

from relay.cli import main  # noqa: E402 - after the signal dispositions above

sys.exit(main())
