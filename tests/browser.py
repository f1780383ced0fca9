"""The Chromium the browser tests drive: $RUNNER_CHROMIUM, else Debian's, else playwright's own.

scripts/test.sh installs one where none is found; a missing browser fails the tests, never skips them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright_api
import pytest

DEBIAN_CHROMIUM = "/usr/bin/chromium"
# without the background-networking flags Chromium keeps dialling Google's hosts on a closed network
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """A Chromium binary to launch, or None for playwright's downloaded one."""
    chosen = os.environ.get("RUNNER_CHROMIUM")
    if chosen:
        return chosen
    return DEBIAN_CHROMIUM if Path(DEBIAN_CHROMIUM).exists() else None


@contextmanager
def launched_chromium() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        except playwright_api.Error as exc:
            pytest.fail(f"no Chromium to drive ({exc.message.splitlines()[0]}): run scripts/test.sh, which installs "
                        "one, or set RUNNER_CHROMIUM")
        try:
            yield browser
        finally:
            browser.close()
