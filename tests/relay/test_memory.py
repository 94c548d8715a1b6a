"""relay.memory.tune_malloc: a huge buffer, freed, gives its memory back at once.

glibc raises its mapping threshold each time a mapped block is freed, so without the
tuning the second 20 MB buffer of a process comes from the heap and its pages stay
resident after it is freed (the relay's peak then grew by a 20 MB event now and then,
in tests/relay/test_relay_oversize.py). Each case runs in a fresh interpreter: the
setting is process-wide and the threshold's history matters. Linux with glibc, as the relay's
image and the embedded broker need: elsewhere this fails rather than skips.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from relay.memory import tune_malloc
if {tuned}:
    tune_malloc()

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

MB = 1_000_000
base = rss()
for _ in range(3):  # the first block moves glibc's threshold; the later ones show where they came from
    block = bytearray(20 * MB)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    del block
print(rss() - base)
"""


def grown_after_freeing(tuned: bool) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), tuned=tuned)],
                         capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_freed_huge_buffers_leave_nothing_resident_once_tuned():
    untuned, tuned = grown_after_freeing(False), grown_after_freeing(True)
    # Without the tuning a freed 20 MB block stays resident (what this guards against);
    # with it, what stays is the interpreter's noise.
    assert untuned > 15_000_000, untuned
    assert tuned < 5_000_000, tuned
