import numpy as np
import pytest

from runner.sampling import sampler
from runner.sampling.params import SamplingParams
from runner.sampling.sampler import Distribution, Sampler, _truncated_few, _truncated_many, top_k_ids, top_logprobs

LOGITS = np.array([1.0, 3.0, 2.5, -1.0, 0.0, 2.9], dtype=np.float32)


def draws(params: SamplingParams, n: int = 200) -> list[int]:
    s = Sampler(params)
    return [s.sample(LOGITS, pos) for pos in range(n)]


def test_greedy_is_argmax() -> None:
    assert draws(SamplingParams(temperature=0), 5) == [1] * 5


def test_same_seed_same_draws_different_seed_differs() -> None:
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    assert draws(p) == draws(p)
    assert draws(p) != draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=8))


def test_top_k_keeps_only_k_candidates() -> None:
    dist = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)).distribution(LOGITS)
    assert dist.token_ids.tolist() == [1, 5]
    assert dist.probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["normal", "ties", "masked", "short"])
def test_top_k_ids_are_the_k_largest_of_a_vocabulary_row(kind: str) -> None:
    rng = np.random.default_rng(3)
    n = 300 if kind == "short" else 49_157  # (not a multiple of the slices: the tail is searched too)
    x = rng.standard_normal(n).astype(np.float32) * 4
    if kind == "ties":
        x = np.round(x)  # every value shared by thousands of ids
    if kind == "masked":
        x[rng.random(n) < 0.999] = -np.inf  # a grammar left ~50 tokens: fewer than some k below
    x[-1] = x.max() + 1  # the largest sits in the tail past the last whole slice
    for k in (1, 40, 255, 256, 299):
        ids = top_k_ids(x, k)
        assert len(set(ids.tolist())) == k and n - 1 in ids.tolist()
        assert np.array_equal(np.sort(x[ids]), np.sort(x)[n - k:])
        for span in (0.5, 6.0, 30.0):  # min_p's bound: only the k largest within span of the largest
            ids = top_k_ids(x, k, span)
            expected = np.sort(x)[n - k:]
            assert len(set(ids.tolist())) == len(ids) and n - 1 in ids.tolist()
            assert np.array_equal(np.sort(x[ids]), expected[expected >= x.max() - span])


def test_equal_logits_in_the_top_k_keep_the_lower_id_first() -> None:
    x = np.zeros(1000, dtype=np.float32)
    x[[700, 20, 400]] = 5.0
    dist = Sampler(SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)).distribution(x)
    assert dist.token_ids.tolist() == [20, 400, 700]


@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
@pytest.mark.parametrize("temperature, min_p, top_p", [(1.0, 0.0, 1.0), (0.8, 0.05, 0.95), (1.5, 0.0, 0.5),
                                                       (1.2, 0.2, 1.0)])
def test_the_plain_python_truncation_of_few_candidates_matches_numpys(kind: str, temperature: float, min_p: float,
                                                                     top_p: float) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(200).astype(np.float32)
    if kind == "ties":
        x = np.round(x)
    if kind == "masked":
        x[rng.random(200) < 0.8] = -np.inf
    p = SamplingParams(temperature=temperature, min_p=min_p, top_p=top_p)
    ids = np.arange(200)
    few, many = _truncated_few(ids.tolist(), x.tolist(), p, kind == "masked"), _truncated_many(ids, x, p, kind == "masked")
    assert few.token_ids.tolist() == many.token_ids.tolist()
    assert np.allclose(few.probs, many.probs, rtol=1e-12, atol=0)
    assert 1 < len(few.token_ids) < 200 or (min_p, top_p) == (0.0, 1.0)


def test_top_p_cuts_the_tail() -> None:
    dist = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0)).distribution(LOGITS)
    assert dist.token_ids.tolist() == [1, 5]


def test_min_p_drops_unlikely_tokens() -> None:
    dist = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5)).distribution(LOGITS)
    # p(x)/p(max) = exp(x - 3): keeps 3.0, 2.9, 2.5 (exp(-0.5)=0.61) and drops 1.0 (0.14)
    assert sorted(dist.token_ids.tolist()) == [1, 2, 5]


def test_min_p_leaving_one_token_gives_a_point_mass_without_drawing() -> None:
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.95, seed=3))
    dist = s.distribution(LOGITS)  # exp(2.9 - 3) = 0.90 < 0.95: only token 1 is within reach
    assert dist.token_ids.tolist() == [1] and dist.probs.tolist() == [1.0]
    assert s.sample(LOGITS, 0) == 1


def test_a_draw_takes_the_same_token_in_plain_python_as_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    probs = np.random.default_rng(1).random(1000)
    dist = Distribution(np.arange(1000), probs / probs.sum())
    in_numpy, in_python = Sampler(SamplingParams(seed=5)), Sampler(SamplingParams(seed=5))
    shuffled = np.random.default_rng(2).permutation(1000)  # (candidates come in probability order, not ids')
    dist = Distribution(dist.token_ids[shuffled], dist.probs[shuffled])
    tokens = [in_numpy.draw(dist, pos) for pos in range(2000)]  # (1000 > FEW_CANDIDATES: numpy's running sums)
    monkeypatch.setattr(sampler, "FEW_CANDIDATES", 1000)
    assert [in_python.draw(dist, pos) for pos in range(2000)] == tokens


def test_empirical_distribution_follows_softmax() -> None:
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    counts = np.bincount([s.sample(LOGITS, pos) for pos in range(20000)], minlength=len(LOGITS))
    expected = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    assert np.allclose(counts / counts.sum(), expected, atol=0.015)


def test_repeat_penalty_moves_greedy_off_a_repeated_token() -> None:
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5), prompt_ids=[1])
    assert s.sample(LOGITS, 1) == 5  # 3.0 / 1.5 = 2.0 < 2.9


def test_frequency_and_presence_penalties_count_generated_tokens() -> None:
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.06, presence_penalty=0.0))
    s.accept(1)
    assert s.sample(LOGITS, 1) == 1  # 3.0 - 0.06 > 2.9
    s.accept(1)
    assert s.sample(LOGITS, 2) == 5  # 3.0 - 0.12 < 2.9


def test_penalties_do_not_modify_the_logits_row() -> None:
    row = LOGITS.copy()
    s = Sampler(SamplingParams(temperature=0, presence_penalty=5.0))
    s.accept(1)
    s.sample(row, 1)
    assert np.array_equal(row, LOGITS)


def test_top_logprobs_are_normalised_and_sorted() -> None:
    chosen, top = top_logprobs(LOGITS, 2, 3)
    assert [t for t, _ in top] == [1, 5, 2]
    log_z = np.log(np.exp(LOGITS.astype(np.float64)).sum())
    assert chosen == pytest.approx(2.5 - log_z)
    assert top[0][1] == pytest.approx(3.0 - log_z)


def test_logit_bias_bans_and_forces_before_top_k() -> None:
    banned = SamplingParams(temperature=0, logit_bias=((1, -100.0),))
    assert draws(banned, 3) == [5] * 3  # the argmax is banned: the next best
    forced = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, logit_bias=((3, 100.0),))
    dist = Sampler(forced).distribution(LOGITS)
    assert dist.token_ids.tolist()[0] == 3 and dist.probs[0] > 0.999  # raised before top_k chose its two
    assert LOGITS[3] == -1.0  # the caller's logits are left alone


def test_a_lazy_grammar_that_has_not_begun_leaves_the_logits_alone() -> None:
    class NotYet:  # a LazyConstraint before its trigger
        is_active = False

        def mask_into(self, logits):
            raise AssertionError("masked before the grammar began")

    sampler = Sampler(SamplingParams(temperature=0), constraint=NotYet())
    assert sampler.adjusted_logits(LOGITS) is LOGITS  # no copy, no mask
    assert sampler.sample(LOGITS, 0) == 1


def test_a_positions_draw_does_not_depend_on_the_draws_before_it() -> None:
    """Counter-based: the token for a position is the same drawn first or after others (a stream's
    draws moved with how many a step took: drafts changed a seeded reply)."""
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    in_order = draws(p, 50)
    s = Sampler(p)
    assert [s.sample(LOGITS, pos) for pos in reversed(range(50))] == in_order[::-1]
    assert len(set(in_order)) > 2
