"""echo and prompt log-probabilities: every prompt token scored from the prefill's own logits
(chunked or not), checked against a direct llama.cpp evaluation; and /v1/completions' echo."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import pytest

from engines import load_tiny
from runner.runtime.llama import uses_extra_buffers
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from server_process import ServerProcess

MODEL = "smollm2-135m-instruct"


def reference_logprobs(path: Path, ids: list[int], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each token's logprob given the ones before it, from llama-cpp-python's own evaluation (flash
    attention on, as runner's contexts run)."""
    with monkeypatch.context() as patch:  # llama-cpp-python's defaults, with runner's choice of weight buffers
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def model_params() -> llama_cpp.llama_model_params:
            params = defaults()
            params.use_extra_bufts = uses_extra_buffers()
            return params

        patch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", model_params)
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=512, verbose=False, flash_attn=True)
    try:
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    top = scores.max(axis=1, keepdims=True)
    logprobs = scores - top - np.log(np.exp(scores - top).sum(axis=1, keepdims=True))
    return [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def test_prompt_logprobs_come_from_every_chunk_of_the_prefill(tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = tuple(range(30, 90))  # 60 tokens in chunks of 16
    loaded = load_tiny(tiny_gguf, 2, batch_size=16)
    try:
        warm: list[StreamEvent] = []  # the same prompt cached in a slot: a scoring request must not reuse it
        loaded.engine.submit(GenerationRequest("warm", prompt, max_tokens=1), warm.append)
        while loaded.engine.has_work:
            loaded.engine.step()
        events: list[StreamEvent] = []
        loaded.engine.submit(GenerationRequest("score", prompt, max_tokens=0, prompt_logprobs=2), events.append)
        while loaded.engine.has_work:
            loaded.engine.step()
    finally:
        loaded.close()
    (final,) = events  # nothing generated: one event, the end
    assert final.finish_reason is FinishReason.LENGTH and final.usage.completion_tokens == 0
    assert final.usage.cached_tokens == 0
    scored = final.prompt_logprobs
    assert [lp.token_id for lp in scored] == list(prompt[1:])
    assert all(len(lp.top) == 2 and lp.top[0][1] >= lp.logprob - 1e-9 for lp in scored)
    np.testing.assert_allclose([lp.logprob for lp in scored], reference_logprobs(tiny_gguf, list(prompt), monkeypatch), atol=1e-3)


def test_the_prompt_logprobs_ride_on_the_first_token(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 1)
    try:
        events: list[StreamEvent] = []
        loaded.engine.submit(GenerationRequest("s", (5, 6, 7, 8), max_tokens=3, ignore_eos=True, prompt_logprobs=0),
                             events.append)
        while loaded.engine.has_work:
            loaded.engine.step()
    finally:
        loaded.close()
    assert [len(e.prompt_logprobs) for e in events] == [3, 0, 0]
    assert sum(len(e.token_ids) for e in events) == 3


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "512")


@pytest.mark.model
def test_echo_scores_the_prompt_as_llama_cpp_does(server: ServerProcess, smollm2_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs, max_tokens 0."""
    text = "The quick brown fox jumps over the lazy dog"
    r = server.post("/v1/completions", json={"prompt": text, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert "".join(lp["tokens"]) == text and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    llm = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.close()
    assert len(lp["tokens"]) == len(ids) and r.json()["usage"]["completion_tokens"] == 0
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(sum(reference_logprobs(smollm2_path, ids, monkeypatch)), abs=1e-3)
    by_ids = server.post("/v1/completions", json={"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert by_ids.json()["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"]
    # each position's top includes the token that is there (OpenAI's: up to logprobs + 1 entries)
    assert all(lp["top_logprobs"][i][t] == lp["token_logprobs"][i] and len(lp["top_logprobs"][i]) <= 2
               for i, t in enumerate(lp["tokens"]) if i > 0)


@pytest.mark.model
def test_an_echoed_prompts_control_tokens_are_spelled_as_written(server: ServerProcess) -> None:
    """A plain prompt's '<|im_start|>' is the model's control token: its logprob entry spells it, so
    the tokens spell the echoed text and every offset is the text's (the first reply token's was 8, not 30)."""
    text = "<|im_start|>user\nhi<|im_end|>\n"
    r = server.post("/v1/completions", json={"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 2,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp, n_prompt = choice["logprobs"], r.json()["usage"]["prompt_tokens"]
    assert n_prompt == 6 and "".join(lp["tokens"][:n_prompt]) == text  # (<|im_start|>, user, \n, hi, <|im_end|>, \n)
    assert lp["text_offset"][n_prompt] == len(text) and choice["text"].startswith(text)


@pytest.mark.model
def test_echo_returns_the_prompt_before_the_completion(server: ServerProcess) -> None:
    body = {"prompt": "The quick brown fox", "echo": True, "max_tokens": 4, "temperature": 0}
    whole = server.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"][0]
    assert whole["text"].startswith("The quick brown fox") and len(whole["logprobs"]["tokens"]) == 4 + 4
    plain = server.post("/v1/completions", json={**body, "echo": False}).json()["choices"][0]
    assert whole["text"] == "The quick brown fox" + plain["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json={"model": MODEL, **body, "stream": True},
                      timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert '"text": "The quick brown fox"' in lines[0]


@pytest.mark.model
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1, "stream": True}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
])
def test_echo_misuse_names_the_field(server: ServerProcess, path: str, body: dict, param: str) -> None:
    r = server.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
