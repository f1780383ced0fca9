"""A request's n choices (and best_of) on the slot engine: the prompt computed once, the other choices
forked from its KV; on the tiny model, then over HTTP on SmolLM2 with the openai SDK."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from engines import load_tiny, submit_all, token_ids
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.scheduler import QueueFullError
from server_process import ServerProcess

PROMPT = tuple(range(40, 100))


def _group(engine, requests: list[GenerationRequest]) -> list[list[StreamEvent]]:
    out: list[list[StreamEvent]] = [[] for _ in requests]
    engine.submit_group(requests, [events.append for events in out])
    while engine.has_work:
        engine.step()
    return out


def test_greedy_choices_equal_the_single_reply_and_the_prompt_is_computed_once(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 4)
    try:
        greedy = SamplingParams(temperature=0)
        single = token_ids(submit_all(loaded.engine, [GenerationRequest("one", PROMPT, greedy, max_tokens=12)])[0])
        for slot in loaded.engine.scheduler.pool.slots:  # forget it: the group below starts cold
            slot.truncate(0)
            loaded.runner.kv_remove(slot.id, 0, -1)
        before = loaded.engine.stats.n_prompt_tokens
        choices = _group(loaded.engine, [GenerationRequest(f"c{i}", PROMPT, greedy, max_tokens=12) for i in range(3)])
        assert [token_ids(c) for c in choices] == [single] * 3
        # the prompt once, then each further choice only its last token (for its own first logits)
        assert loaded.engine.stats.n_prompt_tokens - before == len(PROMPT) + 2
        assert [c[-1].usage.cached_tokens for c in choices] == [0, len(PROMPT) - 1, len(PROMPT) - 1]
    finally:
        loaded.close()


def test_sampled_choices_differ_and_repeat_with_their_seeds(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 3)
    try:
        def run() -> list[list[int]]:
            requests = [GenerationRequest(f"s{i}", PROMPT, SamplingParams(temperature=1.0, seed=7 + i), max_tokens=10)
                        for i in range(3)]
            return [token_ids(c) for c in _group(loaded.engine, requests)]

        first = run()
        assert len({tuple(c) for c in first}) > 1
        assert run() == first
    finally:
        loaded.close()


def test_choices_wait_for_slots_without_blocking_others(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 2)
    try:
        engine = loaded.engine
        other: list[StreamEvent] = []
        engine.submit(GenerationRequest("other", (5, 6, 7), max_tokens=30, ignore_eos=True), other.append)
        choices: list[list[StreamEvent]] = [[], []]
        engine.submit_group([GenerationRequest(f"n{i}", PROMPT, max_tokens=5, ignore_eos=True) for i in range(2)],
                            [c.append for c in choices])
        later: list[StreamEvent] = []
        engine.submit(GenerationRequest("later", (8, 9), max_tokens=3, ignore_eos=True), later.append)
        while engine.has_work:
            engine.step()
        assert all(events[-1].finish_reason is FinishReason.LENGTH for events in (other, *choices, later))
    finally:
        loaded.close()


def test_a_cancelled_first_choice_does_not_strand_the_others(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 2)
    try:
        engine = loaded.engine
        choices: list[list[StreamEvent]] = [[], [], []]
        engine.submit_group([GenerationRequest(f"x{i}", PROMPT, max_tokens=4, ignore_eos=True) for i in range(3)],
                            [c.append for c in choices])
        engine.cancel("x0")
        while engine.has_work:
            engine.step()
        assert [c[-1].finish_reason for c in choices] == [FinishReason.CANCELLED, FinishReason.LENGTH,
                                                          FinishReason.LENGTH]
    finally:
        loaded.close()


def test_a_group_is_queued_whole_or_not_at_all(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 2, max_queue=2)
    try:
        engine = loaded.engine
        for i in range(2):  # both slots busy
            engine.submit(GenerationRequest(f"busy{i}", (5, 6, 7), max_tokens=50), lambda e: None)
        engine.step()
        with pytest.raises(QueueFullError):
            engine.submit_group([GenerationRequest(f"g{i}", PROMPT, max_tokens=2) for i in range(3)],
                                [lambda e: None] * 3)
        assert engine.scheduler.n_waiting == 0
        engine.submit_group([GenerationRequest(f"h{i}", PROMPT, max_tokens=2) for i in range(2)], [lambda e: None] * 2)
        assert engine.scheduler.n_waiting == 2
    finally:
        loaded.close()


MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "1024")


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with server.openai_client() as c:
        yield c


@pytest.mark.model
def test_n_choices_over_http(client: openai.OpenAI) -> None:
    sampling = {"temperature": 1.0, "seed": 5, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    sampled = client.chat.completions.create(model=MODEL, messages=ASK, n=3, **sampling)
    texts = [c.message.content for c in sampled.choices]
    assert [c.index for c in sampled.choices] == [0, 1, 2] and len(set(texts)) > 1
    again = client.chat.completions.create(model=MODEL, messages=ASK, n=3, **sampling)
    assert [c.message.content for c in again.choices] == texts
    assert sampled.usage is not None and sampled.usage.completion_tokens == 3 * 12  # ignore_eos: each runs to max
    single = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=12)
    greedy = client.chat.completions.create(model=MODEL, messages=ASK, n=3, temperature=0, max_tokens=12)
    assert [c.message.content for c in greedy.choices] == [single.choices[0].message.content] * 3
    stream = client.chat.completions.create(model=MODEL, messages=ASK, n=2, temperature=1.0, seed=3, max_tokens=10,
                                            stream=True, stream_options={"include_usage": True})
    streamed, finished, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert finished == {0: "length", 1: "length"} and all(streamed.values())
    assert usage is not None and usage.completion_tokens == 20 and usage.prompt_tokens == sampled.usage.prompt_tokens


def _prompt_tokens_computed(server: ServerProcess) -> int:
    metrics = server.get("/metrics").text
    return int(float(re.search(r"^runner_prompt_tokens_total (\S+)$", metrics, re.M)[1]))


@pytest.mark.model
def test_the_prompt_is_computed_once_for_four_choices(server: ServerProcess, client: openai.OpenAI) -> None:
    server.wait_all_idle()
    before = _prompt_tokens_computed(server)
    prompt = "A fresh prompt nobody sent before: " + " ".join(str(i * 7 % 13) for i in range(40))
    reply = client.completions.create(model=MODEL, prompt=prompt, n=4, max_tokens=3, temperature=0)
    assert reply.usage is not None and reply.usage.prompt_tokens > 64  # long enough to copy (slots.MIN_COPY_GAIN)
    # the prompt once; each further choice decodes only its last prompt token again (for its own logits)
    assert _prompt_tokens_computed(server) - before == reply.usage.prompt_tokens + 3


@pytest.mark.model
def test_best_of_returns_the_choices_with_the_highest_mean_logprob(client: openai.OpenAI) -> None:
    ask = {"model": MODEL, "prompt": "My favourite animal is the", "temperature": 1.0, "seed": 11, "max_tokens": 6}
    four = client.completions.create(n=4, logprobs=0, **ask)
    means = sorted(((sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs), c.text) for c in four.choices),
                   reverse=True)
    best = client.completions.create(n=2, best_of=4, **ask)
    assert [c.text for c in best.choices] == [text for _, text in means[:2]]
    assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None
    assert best.usage is not None and best.usage.completion_tokens == four.usage.completion_tokens


BATCH = ["The capital of France is", "1, 2, 3, 4,", "My favourite animal is the", "Once upon a time",
         "Water is made of", "The best way to learn is"]  # more prompts than the 4 slots: the rest wait


@pytest.mark.model
def test_a_batch_of_prompts_gets_each_prompts_own_choices_in_order(server: ServerProcess,
                                                                  client: openai.OpenAI) -> None:
    greedy = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    alone = [client.completions.create(prompt=p, **greedy) for p in BATCH]
    batch = client.completions.create(prompt=BATCH, **greedy)
    assert [(c.index, c.text) for c in batch.choices] == [(i, a.choices[0].text) for i, a in enumerate(alone)]
    assert batch.usage is not None and batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    echoed = client.completions.create(prompt=BATCH[:2], n=2, echo=True, **greedy)
    assert [c.text for c in echoed.choices] == [BATCH[i] + alone[i].choices[0].text for i in (0, 0, 1, 1)]
    token_prompts = [[504, 3158, 314, 260], [28, 29, 30]]
    by_ids = [client.completions.create(prompt=ids, **greedy).choices[0].text for ids in token_prompts]
    assert [c.text for c in client.completions.create(prompt=token_prompts, **greedy).choices] == by_ids
    # (streamed by hand: the SDK's strict check wants a finish_reason in every completion chunk, OpenAI's too)
    r = server.post("/v1/completions", json={"prompt": BATCH[:3], "stream": True, **greedy})
    streamed: dict[int, str] = {}
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert streamed == {i: alone[i].choices[0].text for i in range(3)}
    sampled = {"model": MODEL, "max_tokens": 6, "temperature": 1.0, "seed": 11, "n": 1, "best_of": 2}
    best = [client.completions.create(prompt=p, **sampled).choices[0].text for p in BATCH[2:4]]
    assert [c.text for c in client.completions.create(prompt=BATCH[2:4], **sampled).choices] == best


@pytest.mark.model
def test_a_batch_names_the_prompt_it_cannot_take(server: ServerProcess) -> None:
    r = server.post("/v1/completions", json={"model": MODEL, "prompt": ["fine", "word " * 1500], "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith("prompt 1: ") and error["code"] == "context_length_exceeded"
    r = server.post("/v1/completions", json={"model": MODEL, "prompt": [[1, 2], [3, 999999]], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt 1: "), r.text
    r = server.post("/v1/completions", json={"model": MODEL, "prompt": ["x"] * 35, "best_of": 2, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "at most 68 requests at once" in r.json()["error"]["message"]  # 4 slots + 64 waiting


@pytest.mark.model
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": ASK, "n": 0}, "n"),
    ("/v1/chat/completions", {"messages": ASK, "n": 5}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "x", "best_of": 5}, "best_of"),
    ("/v1/completions", {"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
    ("/v1/chat/completions", {"messages": ASK, "best_of": 2}, "best_of"),
])
def test_bad_choice_counts_name_the_field(server: ServerProcess, path: str, body: dict, param: str) -> None:
    r = server.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_choices_draft_and_verify_like_any_request(tiny_gguf: Path) -> None:
    prompt = tuple([40, 41, 42, 43] * 12)  # repetitive: the n-gram drafter finds drafts
    plain = load_tiny(tiny_gguf, 3)
    try:
        alone = token_ids(submit_all(plain.engine, [GenerationRequest("a", prompt, SamplingParams(temperature=0),
                                                                      max_tokens=16, ignore_eos=True)])[0])
    finally:
        plain.close()
    speculating = load_tiny(tiny_gguf, 3, draft="ngram", spec="on")
    try:
        choices = _group(speculating.engine, [GenerationRequest(f"d{i}", prompt, SamplingParams(temperature=0),
                                                                max_tokens=16, ignore_eos=True) for i in range(3)])
        assert [token_ids(c) for c in choices] == [alone] * 3  # lossless
        assert all(c[-1].usage.draft_proposed > 0 for c in choices)  # every choice drafted
    finally:
        speculating.close()
