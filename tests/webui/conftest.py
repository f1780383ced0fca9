"""The chat page's fixtures: one SmolLM2 server and one Chromium per test module, a fresh page (and
browser profile: empty localStorage) per test."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from browser import launched_chromium
from server_process import ServerProcess


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "2048")


@pytest.fixture(scope="module")
def browser():
    with launched_chromium() as b:
        yield b


@pytest.fixture
def page(browser, server: ServerProcess):
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    pg = context.new_page()
    pg.goto(server.url + "/")
    yield pg
    context.close()
