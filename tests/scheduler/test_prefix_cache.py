"""Prefix cache across slots with a real server: a long system prompt is computed once."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from runner.prompt.chat_template import Message
from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.scheduler.slots import common_prefix_len
from server_process import ServerProcess

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
SYSTEM = " ".join(
    f"Rule {i}: when asked about topic {i}, answer politely, briefly and truthfully, citing the handbook."
    for i in range(1, 45)
)
QUESTIONS = ["What is rule 3 about?", "Summarise rule 10.", "How should I answer about topic 7?"]
COUNTING = "1, 2, 3, 4, 5, 6, 7,"


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "2048")


@pytest.fixture(scope="module")
def prefix_len(smollm2_path: Path) -> int:
    loaded = LoadedModel(smollm2_path, EngineOptions(parallel=1, ctx_size=256), log=lambda _: None)
    try:
        a, b = (loaded.chat_prompt_ids([Message("system", SYSTEM), Message("user", q)]) for q in QUESTIONS[:2])
    finally:
        loaded.close()
    return common_prefix_len(a, b)


def chat(server: ServerProcess, question: str) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 24}
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


class Streamer:
    """A client holding a slot busy with a long streamed reply until closed."""

    def __init__(self, server: ServerProcess, path: str, body: dict) -> None:
        self._cm = httpx.stream("POST", server.url + path, json={"model": server.model, **body, "stream": True},
                                timeout=120)
        self._lines = self._cm.__enter__().iter_lines()  # kept: dropping it would disconnect
        data = (line for line in self._lines if line.startswith("data: {"))
        while '"role"' in next(data):  # a chat stream opens with a role-only chunk; wait for a token
            pass

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def test_long_system_prompt_is_computed_once_whatever_slot_a_request_lands_on(server: ServerProcess,
                                                                                prefix_len: int) -> None:
    assert prefix_len >= 1000
    cold = chat(server, QUESTIONS[0])
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    busy = [Streamer(server, "/v1/completions", {"prompt": COUNTING, "max_tokens": 1500, "temperature": 0})
            for _ in range(2)]
    # a long reply under the same system prompt keeps the slot holding the prefix busy
    holder = Streamer(server, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Write a long essay."}],
        "max_tokens": 1000, "temperature": 0, "ignore_eos": True})
    try:
        slots = server.get("/slots").json()
        assert [s["state"] for s in slots].count("generating") == 3
        assert max(s["n_prompt_reused"] for s in slots) >= prefix_len  # the holder reused the cold slot
        warm = [chat(server, q) for q in QUESTIONS[1:] + QUESTIONS[:1]]
    finally:
        for s in [*busy, holder]:
            s.close()
    for r in warm:
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= prefix_len
    assert warm[-1]["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    metrics = server.get("/metrics").text
    copied = int(re.search(r"^runner_prompt_tokens_copied_total (\d+)", metrics, re.M).group(1))
    # the first warm request copied the prefix from the busy holder; the next ones found it in their own slot
    assert prefix_len <= copied < 2 * prefix_len
    assert [s["state"] for s in server.wait_all_idle()] == ["idle"] * 4
