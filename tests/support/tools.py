"""Command-line tools some tests need (headless Chromium, promtool) and ``./dev test``
installs as root: found on PATH, else the test skips, or fails under
``LINEAGE_RELAY_REQUIRE_ALL=1`` (CI), where every part must run."""

from __future__ import annotations

import os
import shutil

import pytest


def required_tool(names: tuple[str, ...], what: str, install: str) -> str:
    """The path of the first of ``names`` on PATH; otherwise skip (fail when required)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    message = f"{what} is not on PATH: `{install}` (./dev test does it as root)"
    if os.environ.get("LINEAGE_RELAY_REQUIRE_ALL") == "1":
        pytest.fail(message + " [LINEAGE_RELAY_REQUIRE_ALL=1]")
    pytest.skip(message)
