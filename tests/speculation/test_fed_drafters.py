"""Drafters fed by the target's own rows, on tiny random models: MTP (a glm4moe with one MTP layer)
and an EAGLE3 head (for a 3-layer llama). Lossless at 1 and 4 slots, drafts proposed and counted,
the draft KV in step with what was accepted, first drafts equal to a fresh pass over the whole
context, refusals in one line. Each has an 'agreeing' variant whose drafts are often right (random
weights never are), for the acceptance and distribution checks."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines import load_tiny, submit_all, token_ids
from runner.core.errors import ModelLoadError, OptionError
from runner.runtime import staging
from runner.runtime.llama import Batch, Context, ContextShape, Model
from runner.sampling.params import SamplingParams
from runner.speculation.cost_model import CostTable, ShapeCosts, StepCosts
from runner.scheduler.request import GenerationRequest
from test_speculation import assert_same_distribution
from tiny_eagle3 import write_tiny_eagle3_gguf
from tiny_gguf import write_tiny_gguf
from tiny_mtp import write_tiny_mtp_gguf

PROMPTS = ["hello the cat", "a b c the tree", "the thin hat in the sea", "rain on the world"]
KINDS = ("mtp", "eagle3")


@dataclasses.dataclass(frozen=True)
class Setup:
    """A target and the options that make it draft with one kind (plain: the options without)."""

    target: Path
    options: dict[str, Any]

    def load(self, parallel: int, drafting: bool = True, **more: Any):  # type: ignore[no-untyped-def]
        return load_tiny(self.target, parallel, **{**(self.options if drafting else {"spec": "off"}), **more})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Setup]:
    root = tmp_path_factory.mktemp("fed")
    out = {}
    for agreeing in (False, True):
        tag = "agreeing" if agreeing else "random"
        mtp = write_tiny_mtp_gguf(root / f"mtp-{tag}.gguf", agreeing=agreeing)
        target = write_tiny_gguf(root / f"llama3-{tag}.gguf", n_layer=3, **(dict(shared=3.0, scale=0.02) if agreeing else {}))
        head = write_tiny_eagle3_gguf(root / f"eagle3-{tag}.gguf", agreeing=agreeing)
        out[("mtp", agreeing)] = Setup(mtp, {"spec": "mtp"})
        out[("eagle3", agreeing)] = Setup(target, {"spec": "eagle3", "draft": str(head)})
    return out


@pytest.fixture(scope="module")
def mtp_gguf(models: dict[tuple[str, bool], Setup]) -> Path:
    return models[("mtp", False)].target


def requests(loaded, n_tokens: int, sampling: SamplingParams | None = None) -> list[GenerationRequest]:  # type: ignore[no-untyped-def]
    return [GenerationRequest(f"r{i}", tuple(loaded.model.tokenize(p, add_special=False)),
                              sampling or SamplingParams(temperature=0), n_tokens) for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("agreeing", "parallel"), [(False, 1), (False, 4), (True, 1), (True, 4)])
def test_greedy_output_with_drafts_is_the_plain_output(models: dict[tuple[str, bool], Setup], kind: str,
                                                       agreeing: bool, parallel: int) -> None:
    setup = models[(kind, agreeing)]
    plain = setup.load(1, drafting=False)
    try:
        assert plain.speculator is None
        expected = [token_ids(e) for e in submit_all(plain.engine, requests(plain, 40))]
    finally:
        plain.close()
    loaded = setup.load(parallel, draft_max=3)
    try:
        results = submit_all(loaded.engine, requests(loaded, 40))
        assert [token_ids(e) for e in results] == expected
        spec = loaded.speculator
        assert spec is not None and spec.drafter.name == kind
        assert spec.n_accepted == sum(d for r in results for e in r for d in e.drafted)
        n_steps = sum(len(token_ids(e)) - 1 for e in results)  # (each output token after the first: a step)
        if not agreeing:  # drafted at every step (forced), hardly ever right
            assert spec.n_proposed >= 2 * n_steps and spec.n_accepted <= 0.05 * spec.n_proposed
        else:  # drafts accepted (and rejected): fewer steps than tokens
            assert 0.3 * spec.n_proposed < spec.n_accepted < spec.n_proposed
        assert loaded.engine.snapshot().drafts.by_kind == ((kind, spec.n_proposed, spec.n_accepted),)
    finally:
        loaded.close()


def test_a_model_with_mtp_layers_drafts_with_them_by_default_and_spec_off_loads_none(mtp_gguf: Path) -> None:
    loaded = load_tiny(mtp_gguf, 2)
    try:
        assert loaded.speculator is not None and loaded.speculator.drafter.name == "mtp"
        assert loaded.speculator.mode.value == "auto"
    finally:
        loaded.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_draft_kv_holds_exactly_the_committed_tokens_after_every_step(models: dict[tuple[str, bool], Setup],
                                                                          kind: str) -> None:
    loaded = models[(kind, True)].load(2, draft_max=4)  # (agreeing: acceptances and rejections)
    try:
        drafter = loaded.speculator.drafter
        for request in requests(loaded, 30)[:2]:
            loaded.engine.submit(request, lambda _: None)
        n_checked = 0
        while loaded.engine.has_work:
            loaded.engine.step()
            for slot in loaded.engine.scheduler.pool.slots:
                cached = drafter._cached.get(slot.id)
                if cached:  # fed with the target's rows: what the target committed, from token `shift` on
                    assert drafter.context.kv_pos_max(slot.id) == len(cached) - 1
                    committed = slot.cached_ids + [slot.next_token]
                    assert cached == committed[drafter.shift : drafter.shift + len(cached)]
                    n_checked += 1
        spec = loaded.speculator
        assert n_checked > 10 and 0 < spec.n_accepted < spec.n_proposed
    finally:
        loaded.close()


def record_first_drafts(loaded) -> list[tuple[list[int], int]]:  # type: ignore[no-untyped-def]
    seen: list[tuple[list[int], int]] = []
    drafter = loaded.speculator.drafter
    propose = drafter.propose

    def recording(jobs):  # type: ignore[no-untyped-def]
        propose(jobs)
        seen.extend((list(j.context_ids), j.draft_ids[0]) for j in jobs if j.draft_ids)

    drafter.propose = recording
    submit_all(loaded.engine, requests(loaded, 12)[:2])
    return seen


SHAPE = ContextShape(n_seq=1, n_ctx_per_seq=256, n_batch=128, n_threads=2, kv_unified=False)


def test_each_first_mtp_draft_is_what_a_fresh_pass_over_the_whole_context_gives(mtp_gguf: Path) -> None:
    """The drafter's rows line up: MTP position p is fed token p with the target's hidden row of p-1."""
    loaded = load_tiny(mtp_gguf, 2, spec="mtp", draft_max=2)
    try:
        seen = record_first_drafts(loaded)
    finally:
        loaded.close()
    model = Model(mtp_gguf, load_mtp=True)
    target = Context(model, SHAPE)
    target.capture_hidden()
    mtp = Context(model, SHAPE, mtp_of=target)
    try:
        assert len(seen) > 10
        for context_ids, first_draft in seen[::3]:
            target.kv_remove(0)
            mtp.kv_remove(0)
            batch = Batch(128)
            batch.add(0, context_ids[:-1], 0, 0)
            target.decode(batch)
            hidden = target.hidden(len(context_ids) - 1).astype(np.float16)  # (kept as F16 by the drafter)
            mtp_batch = Batch(128, model.n_embd_out)
            mtp_batch.add(0, context_ids, 0, 1, embd=np.vstack([np.zeros((1, model.n_embd_out)), hidden]))
            assert int(np.argmax(mtp.decode(mtp_batch)[0])) == first_draft
    finally:
        mtp.close()
        target.close()
        model.close()


def test_each_first_eagle3_draft_is_what_a_fresh_pass_over_the_whole_context_gives(
        models: dict[tuple[str, bool], Setup]) -> None:
    """Position p of the head's KV takes token p+1 with fc of the target's layer 0, 1, 2 inputs at p."""
    setup = models[("eagle3", False)]
    loaded = setup.load(2, draft_max=2)
    try:
        seen = record_first_drafts(loaded)
    finally:
        loaded.close()
    target_model, head_model = Model(setup.target), Model(Path(setup.options["draft"]))
    target = Context(target_model, SHAPE)
    for layer in (0, 1, 2):
        target.capture_layer_input(layer)
    head = Context(head_model, SHAPE, other=target)
    head.capture_hidden()
    try:
        assert len(seen) > 10
        for context_ids, first_draft in seen[::3]:
            target.kv_remove(0)
            head.kv_remove(0)
            n = len(context_ids) - 1
            batch = Batch(128)
            batch.add(0, context_ids[:-1], 0, 0)
            target.decode(batch)
            fused = head.encode(np.hstack([target.layer_input(layer, n) for layer in (0, 1, 2)]).astype(np.float16))
            head_batch = Batch(128, head_model.n_embd)
            head_batch.add(0, context_ids[1:], 0, n, embd=fused)
            assert int(np.argmax(head.decode(head_batch)[-1])) == first_draft
    finally:
        head.close()
        target.close()
        head_model.close()
        target_model.close()


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_output_with_drafts_has_the_plain_distribution(models: dict[tuple[str, bool], Setup],
                                                               kind: str) -> None:
    params = SamplingParams(temperature=2.5, top_k=4, top_p=1.0, min_p=0.0)
    n_seeds = 600

    def pairs(loaded, first_seed: int) -> Counter:  # type: ignore[no-untyped-def]
        prompt = tuple(loaded.model.tokenize("the thin", add_special=False))
        results = submit_all(loaded.engine, [GenerationRequest(f"s{i}", prompt, dataclasses.replace(params, seed=first_seed + i), 3)
                                             for i in range(n_seeds)])
        return Counter(tuple(token_ids(r)[1:3]) for r in results)

    setup = models[(kind, True)]
    plain = setup.load(8, drafting=False, max_queue=n_seeds)
    drafted = setup.load(8, draft_max=2, max_queue=n_seeds)
    try:
        a, b = pairs(plain, 0), pairs(drafted, 10_000)
        spec = drafted.speculator
        assert 0.1 * spec.n_proposed < spec.n_accepted < 0.9 * spec.n_proposed  # both accepts and rejections
    finally:
        plain.close()
        drafted.close()
    assert_same_distribution(a, b)


def test_spec_mtp_on_a_model_without_mtp_layers_is_one_line(tiny_gguf: Path) -> None:
    with pytest.raises(OptionError) as refused:
        load_tiny(tiny_gguf, 1, spec="mtp")
    assert str(refused.value) == ("--spec mtp: tiny.gguf has no MTP layers (its GGUF sets no "
                                  "llama.nextn_predict_layers)")
    with pytest.raises(OptionError, match="--spec mtp drafts with the model's own MTP layers: leave out --draft ngram"):
        load_tiny(tiny_gguf, 1, spec="mtp", draft="ngram")  # (the --draft was dropped without a word)


def test_a_model_with_a_recurrent_state_is_refused_mtp_in_one_line(mtp_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_init = Model.__init__

    def as_if_hybrid(self: Model, *args: Any, **kwargs: Any) -> None:  # (a hybrid like Qwen3.5: no tiny one here)
        real_init(self, *args, **kwargs)
        self.keeps_recurrent_state = True

    monkeypatch.setattr(Model, "__init__", as_if_hybrid)
    with pytest.raises(ModelLoadError) as refused:
        load_tiny(mtp_gguf, 1, spec="mtp")
    assert str(refused.value) == ("--spec mtp: mtp-random.gguf (glm4moe) keeps a recurrent state, which runner "
                                  "cannot roll back past a rejected draft (llama.cpp's n_rs_seq snapshots are not used yet)")
    loaded = load_tiny(mtp_gguf, 1)  # by default: loaded, not drafting
    try:
        assert loaded.speculator is None
    finally:
        loaded.close()


def test_spec_eagle3_needs_a_head_for_this_target_and_says_so_in_one_line(
        tiny_gguf: Path, models: dict[tuple[str, bool], Setup], tmp_path: Path) -> None:
    with pytest.raises(OptionError) as refused:
        load_tiny(tiny_gguf, 1, spec="eagle3")
    assert str(refused.value) == ("--spec eagle3 drafts with an EAGLE3 head: name it with --draft FILE (a GGUF "
                                  "of architecture eagle3)")
    with pytest.raises(OptionError, match="--draft ngram is not one"):  # (it drafted n-grams without a word)
        load_tiny(tiny_gguf, 1, spec="eagle3", draft="ngram")
    with pytest.raises(OptionError) as refused:
        load_tiny(tiny_gguf, 1, spec="eagle3", draft=str(tiny_gguf))
    assert str(refused.value) == "--spec eagle3: tiny.gguf is a llama model, not an EAGLE3 head (GGUF architecture eagle3)"
    elsewhere = write_tiny_eagle3_gguf(tmp_path / "eagle3-deeper.gguf", target_layers=(0, 1, 7))
    with pytest.raises(ModelLoadError) as refused:
        load_tiny(tiny_gguf, 1, spec="eagle3", draft=str(elsewhere))
    assert str(refused.value) == ("the EAGLE3 head eagle3-deeper.gguf reads layers [0, 1, 7] of its target; "
                                  "tiny.gguf has 2: it is not this model's head")
    wider = write_tiny_eagle3_gguf(tmp_path / "eagle3-wider.gguf", target_layers=(0, 1, 1), n_embd_target=96)
    with pytest.raises(ModelLoadError) as refused:  # (a larger sibling's head: its fc reads wider rows)
        load_tiny(tiny_gguf, 1, spec="eagle3", draft=str(wider))
    assert str(refused.value) == ("the EAGLE3 head eagle3-wider.gguf reads rows 96 wide; tiny.gguf's are 64: "
                                  "it is not this model's head")
    with pytest.raises(ModelLoadError) as refused:  # (llama.cpp would abort the first decode)
        load_tiny(models[("mtp", False)].target, 1, spec="eagle3", draft=models[("eagle3", False)].options["draft"])
    assert str(refused.value) == ("an EAGLE3 head cannot draft for mtp-random.gguf: llama.cpp gives no layer "
                                  "inputs of a glm4moe model")


def test_without_the_staging_calls_spec_mtp_is_refused_in_one_line_and_auto_drafts_otherwise(
        mtp_gguf: Path, models: dict[tuple[str, bool], Setup], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "_library", lambda: object())  # a llama.cpp that exports none of them
    staging._find.cache_clear()
    try:
        with pytest.raises(ModelLoadError) as refused:
            load_tiny(mtp_gguf, 1, spec="mtp")
        message = str(refused.value)
        assert "\n" not in message and message.startswith(
            "--spec mtp needs llama.cpp's staging calls llama_set_embeddings_nextn, llama_get_embeddings_nextn,")
        with pytest.raises(ModelLoadError) as refused:
            models[("eagle3", False)].load(1)
        message = str(refused.value)
        assert "\n" not in message and message.startswith("an EAGLE3 head needs llama.cpp's staging calls")
        loaded = load_tiny(mtp_gguf, 1, spec="auto")  # the model loads; it just does not draft with MTP
        try:
            assert loaded.speculator is None
        finally:
            loaded.close()
        loaded = load_tiny(mtp_gguf, 1, spec="auto", draft="ngram")
        try:
            assert loaded.speculator.drafter.name == "ngram"
            results = submit_all(loaded.engine, requests(loaded, 8))
            assert all(len(token_ids(r)) == 8 for r in results)
        finally:
            loaded.close()
    finally:
        staging._find.cache_clear()


def with_costs(loaded):  # type: ignore[no-untyped-def]
    """Auto prices steps from these costs, not from the machine's: a target step 10 ms whatever
    its width (up to 8 tokens), a draft decode 1 ms."""
    loaded.speculator.costs = StepCosts(ShapeCosts({1: CostTable((1, 8, 64), (0.010, 0.010, 0.080))}),
                                        ShapeCosts({1: CostTable((1, 8, 64), (0.001, 0.001, 0.008))}))
    loaded.speculator.unpriced.observe = lambda *_: None  # (and not corrected by the steps' wall time)
    spec = loaded.speculator  # awake where, at these costs, its measured agreement could pay (as at load)
    spec.drafter.wake() if spec._worth_waking() else spec.drafter.sleep()
    return loaded


@pytest.mark.parametrize("kind", KINDS)
def test_auto_puts_a_drafter_that_never_pays_to_sleep_and_wakes_one_that_does(
        models: dict[tuple[str, bool], Setup], kind: str) -> None:
    """The target's taps cost every step: where drafting cannot pay, the drafter does not read them."""
    never = models[(kind, False)]
    plain = never.load(1, drafting=False)
    try:
        expected = [token_ids(e) for e in submit_all(plain.engine, requests(plain, 40))]
    finally:
        plain.close()
    loaded = with_costs(never.load(1, spec="auto"))
    try:
        drafter = loaded.speculator.drafter
        assert loaded.speculator.prior_accept < 0.05  # measured at load: random weights hardly ever agree
        assert drafter.is_asleep and loaded.runner.tap is None  # so it starts asleep
        assert [token_ids(e) for e in submit_all(loaded.engine, requests(loaded, 40))] == expected
        drafter.wake()  # awake, auto learns it does not pay and puts it back to sleep
        loaded.speculator.prior_accept = 0.9
        assert [token_ids(e) for e in submit_all(loaded.engine, requests(loaded, 40))] == expected
        assert drafter.is_asleep and loaded.runner.tap is None and loaded.speculator.n_proposed > 0
        assert [token_ids(e) for e in submit_all(loaded.engine, requests(loaded, 40))] == expected
        assert drafter.is_asleep  # new requests do not wake it: at its acceptance drafting cannot pay
    finally:
        loaded.close()
    loaded = with_costs(models[(kind, True)].load(1, spec="auto"))
    try:
        drafter = loaded.speculator.drafter
        assert loaded.speculator.prior_accept > 0.2 and not drafter.is_asleep
        submit_all(loaded.engine, requests(loaded, 40))
        assert loaded.speculator.n_accepted > 0 and not drafter.is_asleep
        drafter.sleep()
        accepted = loaded.speculator.n_accepted
        submit_all(loaded.engine, requests(loaded, 40)[:1])
        assert not drafter.is_asleep and loaded.speculator.n_accepted > accepted  # woken by the new prompt
    finally:
        loaded.close()


def test_the_load_log_names_the_spec_mode_given_and_what_each_measurement_is_of(
        models: dict[tuple[str, bool], Setup], tmp_path: Path) -> None:
    from runner.catalog.store import ModelStore
    from runner.config.options import EngineOptions
    from runner.model.loaded_model import LoadedModel

    def log_of(setup: Setup, **options: Any) -> list[str]:
        lines: list[str] = []
        opts = EngineOptions(**{"parallel": 1, "ctx_size": 256, "batch_size": 128, "threads": 2, **setup.options,
                                **options})
        LoadedModel(setup.target, opts, store=ModelStore(root=tmp_path), log=lines.append).close()
        return lines

    eagle3 = log_of(models[("eagle3", True)])
    assert any(line.startswith("speculative decoding: eagle3, --spec eagle3,") for line in eagle3), eagle3
    mtp = models[("mtp", True)]
    measured = [line for line in log_of(mtp, spec="auto") if line.startswith("measuring decode costs")]
    assert measured == [f"measuring decode costs of {mtp.target.name} for --spec auto (once per model and machine)",
                        f"measuring decode costs of {mtp.target.name}'s MTP layers for --spec auto (once per model "
                        "and machine)"]
