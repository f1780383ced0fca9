"""Same request, same output: with --batch-invariant on, a greedy or seeded reply is the same cold,
with its prompt cached, and under 4 concurrent clients (other slots' rows in the same steps), on the real
model and server (the sources are probed in tests/runtime/test_reproducibility_sources.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

from server_process import ServerProcess

pytestmark = pytest.mark.model

TOPICS = ["the tides", "bread baking", "old maps", "bees", "glaciers", "chess openings", "river boats", "comets"]


def prompt(i: int, head: str) -> str:
    """Eight prompts of about 100 to 600 tokens, each its own (and each head's own: no prefix shared)."""
    sentence = f"Note {{}} about {TOPICS[i]}: people who study {TOPICS[i]} write down what they see each day. "
    return head + "".join(sentence.format(j) for j in range(4 + 4 * i)) + "In one sentence, what are these notes about?"


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "1024", "--batch-invariant", "on")


# (sampling, each prompt's head, how many prompts): seeded runs the four shorter ones, for time
GREEDY = ({"temperature": 0}, "Greedy. ", 8)
SEEDED = ({"temperature": 0.8, "seed": 7}, "Seeded. ", 4)


def reply(server: ServerProcess, i: int, mode: tuple[dict, str, int]) -> tuple[str, int, int]:
    sampling, head, _ = mode
    r = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt(i, head)}],
                                                  "max_tokens": 24, **sampling})
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    return body["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("mode", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_replies_are_the_same_cold_cached_and_under_load(server: ServerProcess, mode: tuple[dict, str, int]) -> None:
    """Greedy, and sampled with a seed (temperature 0.8): the seed means the same draws wherever
    the request runs."""
    same_three_ways(server, mode, mode[2])


def same_three_ways(server: ServerProcess, mode: tuple[dict, str, int], n_prompts: int) -> None:
    cold, cached = [], []
    for i in range(n_prompts):  # each prompt cold, then again at once (4 slots hold 4 prompts' KV)
        cold.append(reply(server, i, mode))
        cached.append(reply(server, i, mode))
    assert 90 <= min(n for _, n, _ in cold) and max(n for _, n, _ in cold) <= 650
    assert [n_cached for _, _, n_cached in cached] == [n - 1 for _, n, _ in cold]  # all but the last token reused
    with ThreadPoolExecutor(4) as pool:  # four clients: every step carries other slots' rows
        loaded = list(pool.map(lambda i: reply(server, i, mode), range(n_prompts)))
    assert [text for text, _, _ in cached] == [text for text, _, _ in cold]
    assert [text for text, _, _ in loaded] == [text for text, _, _ in cold]
    if mode is GREEDY:  # n choices fork from one computed prompt (KV copied to other slots): each the same reply
        sampling, head, _ = mode
        forked = server.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": prompt(0, head)}], "max_tokens": 24, "n": 3, **sampling})
        assert forked.status_code == 200, forked.text
        assert [c["message"]["content"] for c in forked.json()["choices"]] == [cold[0][0]] * 3


# the same guarantee with drafts in the rows (each verified against the target's own logits) and on F16
VARIANTS = {
    "ngram drafts": ("smollm2-135m-instruct", ("--draft", "ngram", "--spec", "on")),
    "a draft model": ("smollm2-135m-instruct", ("--draft", "smollm2-135m-instruct:q8_0", "--spec", "on")),
    "F16": ("smollm2-135m-instruct:f16", ()),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_replies_are_the_same_with_drafts_and_on_f16(variant: str, smollm2_path: Path, model_cache: Path) -> None:
    model, flags = VARIANTS[variant]
    server = ServerProcess(model, model_cache, "--parallel", "4", "--ctx-size", "1024", "--batch-invariant", "on",
                           *flags)
    try:
        same_three_ways(server, GREEDY, 4)
        if flags:
            metrics = server.get("/metrics").text
            proposed = [line for line in metrics.splitlines() if line.startswith("runner_draft_tokens_proposed_total{")]
            assert len(proposed) == 1 and float(proposed[0].split()[-1]) > 0  # drafts were in the rows
    finally:
        server.stop()
