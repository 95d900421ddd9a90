"""A real headless Chromium for the console tests, driven by Playwright, never downloaded.

Debian's `chromium` (installed by the Makefile's test set-up where apt-get can run) is launched at
`CHROMIUM` with a fresh profile directory and no network features of its own (no sync, no
component updates, no background networking, no QUIC). `browser_or_skip` skips the test, naming
what is missing, where Playwright or the binary is not there.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TIMEOUT_MS = 15_000


def chromium_path() -> str:
    found = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if not found:
        pytest.skip("no Chromium: install Debian's chromium and chromium-driver (make test does where apt-get runs)")
    return found


@contextmanager
def browser_or_skip(profile_dir: Path) -> Iterator[Any]:
    """A Playwright browser context on a fresh profile; every dialog (confirm) is accepted."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright; no browser download needed)")
    executable = chromium_path()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile_dir), executable_path=executable, args=ARGS, headless=True,
            viewport={"width": 1280, "height": 800},
        )  # fmt: skip
        context.set_default_timeout(TIMEOUT_MS)
        context.on("page", lambda page: page.on("dialog", lambda dialog: dialog.accept()))
        try:
            yield context
        finally:
            context.close()
