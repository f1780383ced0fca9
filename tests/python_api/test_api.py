"""The Python API on the tiny model: replies, and the options apps reach for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.python_api.runner import Runner
from runner.sampling.constraints import ConstraintError


def test_json_schema_and_grammar_reach_the_python_api(tiny_gguf: Path) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    with Runner(tiny_gguf, log=lambda _: None) as r:
        reply = r.chat([{"role": "user", "content": "ok?"}], json_schema=schema, temperature=0, max_tokens=20)
        assert set(json.loads(reply)) == {"ok"}
        assert r.complete("answer:", grammar='root ::= "yes" | "no"', temperature=0.9, max_tokens=5) in ("yes", "no")
        with pytest.raises(ConstraintError, match="grammar"):
            r.complete("x", grammar="root ::= (")
        with pytest.raises(ValueError, match="not both"):
            r.complete("x", grammar="root ::= x", json_schema={})


def test_choices_best_of_beams_scores_and_embeddings_reach_the_python_api(tiny_gguf: Path) -> None:
    with Runner(tiny_gguf, log=lambda _: None, parallel=3, batch_invariant="on", ctx_size=256) as r:
        greedy = r.complete("the cat", temperature=0, max_tokens=6)
        assert r.choices("the cat", n=3, temperature=0, max_tokens=6) == [greedy] * 3
        sampled = r.choices("the cat", n=3, temperature=1.0, seed=3, max_tokens=6)
        assert r.choices("the cat", n=3, temperature=1.0, seed=3, max_tokens=6) == sampled
        assert r.choices("the cat", n=2, best_of=3, temperature=1.0, seed=3, max_tokens=6)[0] in sampled
        with pytest.raises(ValueError, match="parallel"):
            r.choices("x", n=4)
        scored = r.score("the cat sat")
        assert scored[0][1] is None and all(lp is not None and lp < 0 for _, lp in scored[1:])
        assert "".join(token for token, _ in scored) == "the cat sat"
        marked = r.score("<|im_start|>user\nhi<|im_end|>")  # (control tokens: spelled as written)
        assert "".join(token for token, _ in marked) == "<|im_start|>user\nhi<|im_end|>" and len(marked) < 10
        beams = r.beam_search("the cat", n=3, max_tokens=4)
        assert len(beams) == 3 and {b.finish_reason for b in beams} <= {"stop", "length"}
        same_length = [b.logprob for b in beams if b.finish_reason == "length"]  # ranked by total among these
        assert same_length == sorted(same_length, reverse=True)
        vectors = r.embed(["the cat", "the dog"])
        assert vectors.shape == (2, 64)
        with pytest.raises(ValueError, match="non-empty"):
            r.embed([""])


def test_a_requests_length_is_built_as_the_server_builds_it(tiny_gguf: Path) -> None:
    """One request builder for both faces: None is the default, 0 is nothing, never past the room."""
    with Runner(tiny_gguf, log=lambda _: None, ctx_size=256, max_tokens=100) as r:
        prompt_ids = (1, 2, 3, 4)
        assert r.request(prompt_ids).max_tokens == 100
        assert r.request(prompt_ids, max_tokens=0).max_tokens == 0  # was silently 1024
        assert r.request(prompt_ids, max_tokens=10_000).max_tokens == 256 - 4
        assert r.complete("the cat", max_tokens=0) == ""


def test_a_step_that_raises_ends_its_requests_and_leaves_no_slot_holding_kv(tiny_gguf: Path) -> None:
    """As the server's engine thread does: the error reaches the caller, every request ends, and no
    slot keeps KV a half-run step may have left unlike its tokens (a later call would reuse it)."""
    with Runner(tiny_gguf, log=lambda _: None, parallel=2) as r:
        prompt = r.loaded.text_prompt_ids("hello there")
        assert "".join(e.text for e in r.stream(r.request(prompt, max_tokens=3, temperature=0)))
        engine = r.loaded.engine
        assert any(slot.cached_ids for slot in engine.scheduler.pool.slots)
        propose = engine.drafts.propose

        def broken(plan: object) -> None:
            raise ValueError("a drafter broke")

        engine.drafts.propose = broken  # type: ignore[method-assign]
        with pytest.raises(ValueError, match="a drafter broke"):
            r.choices("hello there", n=2, max_tokens=3)
        assert not engine.has_work and all(not slot.cached_ids for slot in engine.scheduler.pool.slots)
        engine.drafts.propose = propose  # type: ignore[method-assign]
        assert len(r.choices("hello there", n=2, max_tokens=3)) == 2


def test_a_closed_runner_says_so_and_closes_once(tiny_gguf: Path) -> None:
    from runner.core.errors import RunnerError

    r = Runner(tiny_gguf, log=lambda _: None)
    r.close()
    r.close()  # (twice: nothing more)
    with pytest.raises(RunnerError, match="this Runner is closed"):  # (was a segfault)
        r.complete("the cat", max_tokens=2)


def test_one_stop_string_is_one_stop_not_its_characters(tiny_gguf: Path) -> None:
    with Runner(tiny_gguf, log=lambda _: None) as r:
        whole = r.complete("the cat", temperature=0, max_tokens=24)
        # two characters whose first one the reply has before them: split into characters, it cut there
        i = next(i for i in range(1, len(whole) - 1) if whole[i] in whole[:i] and whole[i:i + 2] not in whole[:i + 1])
        stop = whole[i:i + 2]
        assert r.complete("the cat", temperature=0, max_tokens=24, stop=stop) == whole[:i]


def test_threads_sharing_a_runner_each_get_their_own_reply(tiny_gguf: Path) -> None:
    """Steps are taken one at a time, each advancing every thread's request (they were stepped at
    once: empty replies, or a segfault)."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = ["the cat", "a dog", "one two", "red blue", "the sea", "up down"]
    with Runner(tiny_gguf, log=lambda _: None, parallel=3, batch_invariant="on", ctx_size=256) as r:
        alone = [r.complete(p, temperature=0, max_tokens=16) for p in prompts]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda p: r.complete(p, temperature=0, max_tokens=16), prompts * 3))
            groups = list(pool.map(lambda p: r.choices(p, n=2, temperature=0, max_tokens=8), prompts))
    assert together == alone * 3
    assert all(len(g) == 2 and g[0] == g[1] for g in groups)


def test_what_the_python_api_cannot_use_is_an_input_error(tiny_gguf: Path) -> None:
    """(each was a KeyError or TypeError from deep inside, a token id handed to llama_decode, or a
    negative length taken as 1)"""
    from runner.core.errors import InputError

    with Runner(tiny_gguf, log=lambda _: None, parallel=2) as r:
        for bad in ([{"role": "user"}], [{"role": "user", "content": None}], ["hi"]):
            with pytest.raises(InputError, match=r"messages\[0\] must be"):
                r.chat(bad)
        for max_tokens in (-5, 5.5, "5", True):
            with pytest.raises(InputError, match="max_tokens must be a whole number"):
                r.complete("the cat", max_tokens=max_tokens)
        with pytest.raises(InputError, match="token ids must be in"):
            r.request((1, 10**6), max_tokens=2)
        with pytest.raises(InputError, match="max_tokens must be at least 1"):
            r.beam_search("the cat", n=2, max_tokens=0)


def test_sampling_values_messages_and_stops_are_checked_as_the_server_checks_them(tiny_gguf: Path) -> None:
    """(each ran: an empty reply from a sampling TypeError, greedy for temperature -1, text for an
    empty conversation or a made-up role, a stop list's non-text items ignored)"""
    from runner.core.errors import InputError

    with Runner(tiny_gguf, log=lambda _: None) as r:
        bad = [({"temperature": "0"}, "temperature must be a number from 0 to 2"),
               ({"temperature": float("nan")}, "temperature"), ({"temperature": -1}, "temperature"),
               ({"top_p": 2}, "top_p"), ({"repeat_penalty": 0}, "repeat_penalty"),
               ({"top_k": 1.5}, "top_k must be a whole number"), ({"seed": "x"}, "seed must be a whole number"),
               ({"logit_bias": ((10**7, -100.0),)}, "token ids must be in"),
               ({"logit_bias": {5: -1000}}, r"logit_bias\[5\] must be a number from -100 to 100"),
               ({"logit_bias": 5}, "logit_bias must map"), ({"stop": [5]}, "stop must be a text")]
        for kwargs, message in bad:
            with pytest.raises(InputError, match=message):
                r.complete("the cat", max_tokens=2, **kwargs)
        with pytest.raises(InputError, match="messages is empty"):
            r.chat([], max_tokens=2)
        with pytest.raises(InputError, match=r"messages\[0\]'s role must be one of"):
            r.chat([{"role": "bogus", "content": "hi"}], max_tokens=2)
        assert not r.loaded.engine.has_work
        # OpenAI's shape of a logit bias is the same bias as (id, bias) pairs
        banned = r.loaded.text_prompt_ids(r.complete("the cat", temperature=0, max_tokens=1))[-1]
        as_pairs = r.complete("the cat", temperature=0, max_tokens=4, logit_bias=((banned, -100.0),))
        assert r.complete("the cat", temperature=0, max_tokens=4, logit_bias={banned: -100}) == as_pairs


def test_a_generation_that_fails_in_the_engine_raises_not_returns_what_it_had(tiny_gguf: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """(chat, complete and choices joined the texts and dropped the final event's error: '' came back)"""
    from runner.core.errors import RunnerError
    from runner.python_api import runner as api
    from runner.sampling.params import SamplingParams

    monkeypatch.setattr(api, "checked_sampling", lambda **kw: SamplingParams(**kw))  # (past the checks above)
    with Runner(tiny_gguf, log=lambda _: None, parallel=2) as r:
        with pytest.raises(RunnerError, match="internal error: TypeError"):
            r.complete("the cat", temperature="0", max_tokens=4)
        with pytest.raises(RunnerError, match="internal error: TypeError"):
            r.choices("the cat", n=2, temperature="0", max_tokens=4)
        assert not r.loaded.engine.has_work
        assert r.complete("the cat", temperature=0, max_tokens=4)


def test_closing_a_runner_another_thread_generates_on_ends_that_generation(tiny_gguf: Path) -> None:
    """close() waits for the step in progress; the generating thread gets RunnerError (was a segfault:
    the model was freed under its next step)."""
    import threading

    from runner.core.errors import RunnerError

    r = Runner(tiny_gguf, log=lambda _: None)
    started, outcome = threading.Event(), []

    def generate() -> None:
        try:
            for i, _ in enumerate(r.stream(r.request(r.loaded.text_prompt_ids("the cat"), max_tokens=10_000))):
                if i == 3:
                    started.set()
            outcome.append("finished")
        except RunnerError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=generate)
    thread.start()
    assert started.wait(60)
    r.close()
    thread.join(60)
    assert outcome == ["this Runner is closed"]


def test_a_stream_dropped_after_close_says_nothing(tiny_gguf: Path) -> None:
    """(its cancel stepped a closed Runner: 'Exception ignored ... this Runner is closed' at collection)"""
    r = Runner(tiny_gguf, log=lambda _: None)
    events = r.stream_chat([{"role": "user", "content": "hi"}], max_tokens=50)
    next(events)
    r.close()
    events.close()  # (raised RunnerError)


def test_threads_embedding_at_once_get_what_each_would_alone(tiny_gguf: Path) -> None:
    """One embedding batch at a time on the shared embedding context (three at once: a segfault)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    texts = [[f"text {i} of batch {b}" for i in range(8)] for b in range(6)]
    with Runner(tiny_gguf, log=lambda _: None) as r:
        alone = [r.embed(batch) for batch in texts]
        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(r.embed, texts * 2))
    for got, want in zip(together, alone * 2, strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_empty_schema_asks_for_an_object_as_documented(tiny_gguf: Path) -> None:
    """(`{}` compiled to any JSON value: digits until max_tokens ran out)"""
    from runner.sampling.constraints import grammar_text

    assert grammar_text("json_schema", "{}") == grammar_text("json_object", "")
    with Runner(tiny_gguf, log=lambda _: None) as r:
        for seed in range(3):
            assert r.complete("x", json_schema={}, temperature=1.0, seed=seed, max_tokens=12).startswith("{")


def test_a_runner_dropped_without_close_frees_its_model(tiny_gguf: Path) -> None:
    """(its llama.cpp model and context stayed: 300 MiB more each time a script made one in a loop)"""
    import gc

    r = Runner(tiny_gguf, log=lambda _: None)
    assert r.complete("the cat", temperature=0, max_tokens=2) is not None
    model = r.loaded.model
    del r
    gc.collect()
    assert model._ptr is None  # (llama_model_free ran)
