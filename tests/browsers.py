"""The browser the UI and web-chat tests drive: Debian's Chromium, never a downloaded one
(``make browser`` installs it). The session fixtures that start it are in conftest.py."""

from __future__ import annotations

import os
import shutil

import pytest

WAIT_MS = 60_000  # generous: the machine running the suite may be busy


def system_chromium() -> str:
    """The system's Chromium: ``PYRULA_CHROMIUM``, else ``chromium`` on the PATH."""
    chosen = os.environ.get("PYRULA_CHROMIUM")
    for candidate in [chosen] if chosen else ["chromium", "chromium-browser"]:
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(
        "the UI browser test needs Chromium and found none: run `make browser` "
        "(as root it runs `apt-get install chromium`), or set PYRULA_CHROMIUM=/path/to/chromium"
    )
